from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from tenants.models import Membership, Tenant, User


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
