from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from kernel.admin_readonly import ReadOnlyAdmin
from tenants.models import ApiToken, ApprovalRequest, Membership, NotificationDelivery, Quota, Tenant, User


@admin.register(User)
class GpupoolUserAdmin(UserAdmin):
    """Read-only like the rest: users, roles and passwords change through the services (audited)."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    fieldsets = (*UserAdmin.fieldsets, ("gpupool", {"fields": ("platform_role",)}))
    list_display = ("username", "email", "platform_role", "is_active")


@admin.register(Tenant)
class TenantAdmin(ReadOnlyAdmin):
    list_display = ("slug", "name", "kind", "parent", "depth")


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    list_display = ("user", "tenant", "role")


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ("user", "name", "key_prefix", "scope", "expires_at", "last_used_at", "revoked_at")


@admin.register(Quota)
class QuotaAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "flavor", "guaranteed_millis", "limit_millis", "lending_limit_millis")


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "status", "tenant", "requester", "step", "expires_at")
    list_filter = ("kind", "status")


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "event", "notifier", "status", "attempts", "updated_at")
    list_filter = ("status",)
