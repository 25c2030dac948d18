from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from tenants.models import ApiToken, ApprovalRequest, Membership, NotificationDelivery, Quota, Tenant, User


@admin.register(User)
class GpupoolUserAdmin(UserAdmin):
    fieldsets = (*UserAdmin.fieldsets, ("gpupool", {"fields": ("platform_role",)}))
    list_display = ("username", "email", "platform_role", "is_active")


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "kind", "parent", "depth")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "role")


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown for inspection only: changes go through the services (API, console), which audit them."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


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
