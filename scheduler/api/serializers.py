"""Serializers of the scheduler API: output shapes, and input shapes of the command endpoints."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.reverse import reverse

from catalog.models import ResourceFlavor, Vendor
from kernel.serializers import FieldsBuiltOnce, JsonTypedSerializer
from scheduler import launch, serving
from scheduler.fleet.models import Device
from scheduler.jobspec import PRIORITY_NAMES
from scheduler.models import Allocation, Job, JobEvent, PriorityClass
from scheduler.selectors import ArrayState, job_pending_sentence
from scheduler.services.arrays import JobArrayCancelled


class FlavorSerializer(serializers.ModelSerializer):
    class Meta:
        model = ResourceFlavor
        fields = [
            "id",
            "name",
            "vendor",
            "model",
            "memory_mib",
            "description",
            "cpu_millicores_per_card",
            "host_memory_mib_per_card",
        ]


class FlavorCreateSerializer(JsonTypedSerializer):
    name = serializers.SlugField(max_length=64)
    vendor = serializers.ChoiceField(choices=Vendor.choices)
    model = serializers.CharField(max_length=64)
    memory_mib = serializers.IntegerField(min_value=1, max_value=16 * 1024 * 1024)
    description = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    # Host CPU and memory per card for jobs that state none (0: none).
    cpu_millicores_per_card = serializers.IntegerField(min_value=0, max_value=1024 * 1000, required=False, default=0)
    host_memory_mib_per_card = serializers.IntegerField(
        min_value=0, max_value=64 * 1024 * 1024, required=False, default=0
    )


class DeviceSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    uuid = serializers.SerializerMethodField(help_text="null unless your job holds the card (platform roles: any)")
    flavor = serializers.CharField(source="flavor.name", default=None, allow_null=True, read_only=True)
    utilization_pct = serializers.SerializerMethodField(
        help_text="Live utilisation from the latest telemetry; null when none is recent or the card is not yours."
    )
    memory_used_mib = serializers.SerializerMethodField(
        help_text="Live device memory in use; null when none is recent or the card is not yours."
    )

    class Meta:
        model = Device
        fields = [
            "id",
            "uuid",
            "utilization_pct",
            "memory_used_mib",
            "node",
            "index",
            "vendor",
            "model",
            "flavor",
            "memory_mib",
            "numa_node",
            "pci_bus_id",
            "nvlink_domain",
            "pcie_switch",
            "health",
            "mig_mode",
        ]

    def _live(self, device: Device, key: str) -> float | None:
        # Telemetry of a card is shown under the same rule as its UUID (uuid_visible): to platform roles, and to
        # tenant users for the cards their jobs hold now. ``live`` is the latest store's values for the page.
        if not getattr(device, "uuid_visible", False):
            return None
        value = self.context.get("live", {}).get(device.node_id, {}).get(device.uuid, {}).get(key)
        return float(value) if isinstance(value, int | float) else None

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_utilization_pct(self, device: Device) -> float | None:
        return self._live(device, "utilization_pct")

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_memory_used_mib(self, device: Device) -> int | None:
        value = self._live(device, "memory_used_mib")
        return None if value is None else int(value)

    def get_uuid(self, device: Device) -> str | None:
        # ``uuid_visible`` comes from ``selectors.devices_visible_to``; without it, nothing is shown.
        return device.uuid if getattr(device, "uuid_visible", False) else None


class AllocationSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
    device = serializers.CharField(source="device.uuid", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True)
    flavor = serializers.CharField(source="flavor.name", read_only=True)

    class Meta:
        model = Allocation
        fields = [
            "replica",
            "device",
            "node",
            "flavor",
            "millis",
            "memory_mib",
            "borrowed_millis",
            "started_at",
            "ended_at",
        ]


class JobEventSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", default=None, allow_null=True, read_only=True)

    class Meta:
        model = JobEvent
        fields = ["from_state", "to_state", "reason", "message", "actor", "created_at"]


class JobSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    submitter = serializers.CharField(source="submitter.username", default=None, allow_null=True, read_only=True)
    # The same word the spec takes ("normal"), not the stored number (500): what goes in comes out.
    priority_class = serializers.SerializerMethodField()
    priority = serializers.SerializerMethodField(help_text="Deprecated alias of priority_class.")
    flavors = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="Acceptable flavors, in order of preference."
    )
    priority_value = serializers.IntegerField(
        source="priority_class", read_only=True, help_text="The class's number (higher runs first)."
    )
    pending_reason = serializers.SerializerMethodField()
    gpus_per_replica = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "tenant",
            "submitter",
            "kind",
            "priority_class",
            "priority",
            "priority_value",
            "preemptible",
            "replicas",
            "min_replicas",
            "max_replicas",
            "flavors",
            "any_flavor",
            "millis_per_replica",
            "gpus_per_replica",
            "memory_mib_per_replica",
            "cpu_millicores_per_replica",
            "host_memory_mib_per_replica",
            "topology",
            "state",
            "state_message",
            "exit_code",
            "pending_reason_code",
            "pending_reason",
            "position_in_tenant",
            "position_overall",
            # When it is expected to start (median) and the band around it; null when not known (docs/eta.md).
            "estimated_start_at",
            "estimated_start_p10_at",
            "estimated_start_p90_at",
            "preemption_count",
            "last_checkpoint_at",
            "submitted_at",
            "admitted_at",
            "started_at",
            "finished_at",
            "array_id",
            "array_index",
        ]

    @extend_schema_field(serializers.ChoiceField(choices=list(PRIORITY_NAMES)))
    def get_priority_class(self, job: Job) -> str:
        return PriorityClass(job.priority_class).name.lower()

    @extend_schema_field(serializers.ChoiceField(choices=list(PRIORITY_NAMES)))
    def get_priority(self, job: Job) -> str:
        return PriorityClass(job.priority_class).name.lower()

    def get_pending_reason(self, job: Job) -> str:
        return job_pending_sentence(job)

    def get_gpus_per_replica(self, job: Job) -> float:
        return job.millis_per_replica / 1000


class JobDetailSerializer(JobSerializer):
    events = JobEventSerializer(many=True, read_only=True)
    allocations = AllocationSerializer(many=True, read_only=True)
    ports = serializers.SerializerMethodField(
        help_text="the ports the job's live replicas hold: {replica, node, address, port, purpose}; purpose "
        "'rendezvous' is MASTER_PORT (replica 0's node), 'replica' each replica's own (GPUPOOL_PORT)"
    )

    endpoints = serializers.SerializerMethodField(
        help_text="the job's named ports: {name, url (through the serving proxy; null in embedded mode), replicas "
        "(address:port of each replica serving it)}"
    )

    def get_ports(self, job: Job) -> list[dict]:
        return launch.job_ports(job)

    def get_endpoints(self, job: Job) -> list[dict]:
        return serving.job_endpoints(job)

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "command",
            "env",
            "working_dir",
            "node_selector",
            "max_runtime_s",
            "checkpoint_dir",
            "runtime_estimate_s",
            "spec",
            "allocations",
            "ports",
            "endpoints",
            "events",
        ]


class JobCancelSerializer(JsonTypedSerializer):
    reason = serializers.CharField(max_length=300, required=False, default="", allow_blank=True)
    indices = serializers.CharField(
        max_length=2000,
        required=False,
        default=None,
        allow_null=True,
        allow_blank=True,
        help_text="an array's cancel only: just these tasks, e.g. 3-7,9 (default: every task that has not ended)",
    )


class JobScaleSerializer(JsonTypedSerializer):
    replicas = serializers.IntegerField(min_value=1, help_text="replicas the inference service wants now")


class JobLoadSerializer(JsonTypedSerializer):
    load = serializers.FloatField(
        min_value=0.0, help_text="average load per running replica: busy time / capacity of one replica (1.0 = full)"
    )


class JobArraySerializer(serializers.Serializer):
    """An array: its id, how many tasks, task 0's job id and every task counted by state (the answer to an array
    submit, and ``GET /jobs/arrays/<id>/``). Tasks become jobs when a cycle may place them."""

    array_id = serializers.UUIDField(help_text="shared by the array's jobs; filter with GET /jobs/?array=<id>")
    count = serializers.IntegerField(help_text="tasks in the array (indices 0..count-1)")
    tenant = serializers.CharField(source="tenant_slug")
    name = serializers.CharField()
    state = serializers.CharField(help_text="the state every task of the array entered at submit (queued)")
    first_job_id = serializers.IntegerField(help_text="task 0's job")
    states = serializers.DictField(child=serializers.IntegerField(), help_text="tasks per state; they add up to count")
    not_yet_jobs = serializers.CharField(
        source="waiting_ranges",
        help_text="indices of the queued tasks that are not jobs yet (Slurm's notation, e.g. 64-9999); GET "
        "tasks/<index>/ makes one a job",
    )
    submitted_at = serializers.DateTimeField()
    array_url = serializers.SerializerMethodField(help_text="the array: every task counted by state")
    jobs_url = serializers.SerializerMethodField(help_text="the array's tasks that are jobs now, paginated")
    cancel_url = serializers.SerializerMethodField(help_text="POST here to cancel the tasks that have not ended")

    def get_array_url(self, array: ArrayState) -> str:
        return reverse("job-array-detail", kwargs={"array_id": array.array_id}, request=self.context.get("request"))

    def get_jobs_url(self, array: ArrayState) -> str:
        return f"{reverse('job-list', request=self.context.get('request'))}?array={array.array_id}"

    def get_cancel_url(self, array: ArrayState) -> str:
        return reverse("job-array-cancel", kwargs={"array_id": array.array_id}, request=self.context.get("request"))


class JobArrayCancelledSerializer(serializers.Serializer):
    array_id = serializers.UUIDField()
    cancelled = serializers.SerializerMethodField(help_text="tasks this call cancelled (jobs and tasks not yet jobs)")
    cancelled_job_ids = serializers.ListField(child=serializers.IntegerField())
    already_finished = serializers.IntegerField(help_text="jobs of the array that had ended before")
    cancelled_waiting = serializers.IntegerField(help_text="tasks cancelled before they were jobs (no id to list)")

    def get_cancelled(self, result: JobArrayCancelled) -> int:
        return len(result.cancelled_job_ids) + result.cancelled_waiting
