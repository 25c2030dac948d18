from django.contrib import admin

from scheduler.models import Device, Node, ResourceFlavor


@admin.register(ResourceFlavor)
class ResourceFlavorAdmin(admin.ModelAdmin):
    list_display = ("name", "vendor", "model", "memory_mib")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "status", "last_heartbeat_at", "agent_version")


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ("uuid", "node", "index", "model", "flavor", "health")
