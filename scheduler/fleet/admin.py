from django.contrib import admin

from kernel.admin_readonly import ReadOnlyAdmin
from scheduler.fleet.models import BootstrapToken, NodeAgent, NodeCredential


@admin.register(BootstrapToken)
class BootstrapTokenAdmin(ReadOnlyAdmin):
    list_display = ("prefix", "description", "created_at", "expires_at", "used_at", "used_by_node")
    readonly_fields = ("token_hash",)


@admin.register(NodeCredential)
class NodeCredentialAdmin(ReadOnlyAdmin):
    list_display = ("node", "key_id", "created_at", "last_seen_at", "revoked_at")
    readonly_fields = ("secret_hash",)


@admin.register(NodeAgent)
class NodeAgentAdmin(ReadOnlyAdmin):
    list_display = ("node", "hostname", "connected_at", "disconnected_at", "lost_at", "jobs_requeued_at")
