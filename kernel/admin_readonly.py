"""The Django admin is for looking, not changing: every domain change goes through the services, which
validate it (a tenant cannot become its own grandchild's child) and audit it. A superuser who edited a
tenant's parent in the admin once crashed every scheduling cycle with no audit record; now no admin page
of the project's models can add, change or delete."""

from __future__ import annotations

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown for inspection only: changes go through the services (API, console, commands), which audit them."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
