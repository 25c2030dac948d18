from django.contrib import admin

from kernel.admin_readonly import ReadOnlyAdmin
from scheduler.fleet.models import AgentCommand, Device, Node
from scheduler.models import Allocation, CapacityHold, InferenceReservation, Job, JobEvent


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ("name", "status", "last_heartbeat_at", "agent_version")


@admin.register(Device)
class DeviceAdmin(ReadOnlyAdmin):
    list_display = ("uuid", "node", "index", "model", "flavor", "health")


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "tenant", "state", "priority_class", "replicas", "millis_per_replica", "submitted_at")
    list_filter = ("state", "kind", "priority_class")
    search_fields = ("name",)


@admin.register(JobEvent)
class JobEventAdmin(ReadOnlyAdmin):
    list_display = ("job", "from_state", "to_state", "reason", "actor", "created_at")


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin):
    list_display = ("job", "replica", "device", "millis", "memory_mib", "borrowed_millis", "started_at", "ended_at")


@admin.register(InferenceReservation)
class InferenceReservationAdmin(ReadOnlyAdmin):
    list_display = ("job", "replica", "device", "millis", "memory_mib", "created_at")


@admin.register(CapacityHold)
class CapacityHoldAdmin(ReadOnlyAdmin):
    list_display = ("job", "device", "victim_ids", "since")


@admin.register(AgentCommand)
class AgentCommandAdmin(ReadOnlyAdmin):
    list_display = ("id", "node", "command_type", "job", "created_at", "sent_at", "acked_at", "attempts")
