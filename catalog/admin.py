from django.contrib import admin

from catalog.models import ResourceFlavor
from kernel.admin_readonly import ReadOnlyAdmin


@admin.register(ResourceFlavor)
class ResourceFlavorAdmin(ReadOnlyAdmin):
    list_display = ("name", "vendor", "model", "memory_mib")
