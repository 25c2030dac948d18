"""Vendors, resource flavors and the price of a flavor's card-hour.

The tables were created by the scheduler (``scheduler_resourceflavor``) and the tenants app
(``tenants_flavorprice``) and keep those names: the models moved here without copying a row
(``catalog/migrations/0001_initial.py``).
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Vendor(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA"
    ASCEND = "ascend", "Huawei Ascend"
    AMD = "amd", "AMD"
    HYGON = "hygon", "Hygon"
    CAMBRICON = "cambricon", "Cambricon"
    SIMULATED = "simulated", _("simulated")


class ResourceFlavor(models.Model):
    """A named class of device (``nvidia-h100-80g``, ``ascend-910b``); quotas are per flavor."""

    name = models.SlugField(max_length=64, unique=True)
    vendor = models.CharField(max_length=16, choices=Vendor.choices)
    model = models.CharField(max_length=64)
    memory_mib = models.PositiveIntegerField()
    description = models.CharField(max_length=200, blank=True, default="")
    # Host CPU and memory a job gets per card of this flavor when its spec states none (0: none); a job naming
    # several flavors gets the largest, so it fits wherever it lands.
    cpu_millicores_per_card = models.PositiveIntegerField(default=0)
    host_memory_mib_per_card = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "scheduler_resourceflavor"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class FlavorPrice(models.Model):
    """Optional price of one card-hour of a flavor, for showback/chargeback reports."""

    flavor = models.OneToOneField(ResourceFlavor, on_delete=models.CASCADE, related_name="price")
    price_per_device_hour = models.DecimalField(max_digits=12, decimal_places=4)
    currency = models.CharField(max_length=3, default="CNY")

    class Meta:
        db_table = "tenants_flavorprice"

    def __str__(self) -> str:
        return f"{self.flavor.name}: {self.price_per_device_hour} {self.currency}/h"
