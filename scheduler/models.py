"""Resources: flavors (classes of device), nodes and their devices. Jobs and allocations join them later."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

MILLIS_PER_DEVICE = 1000
MIN_FRACTION_MILLIS = 100


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

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NodeStatus(models.TextChoices):
    READY = "ready", _("ready")
    NOT_READY = "not_ready", _("not ready")
    CORDONED = "cordoned", _("cordoned")
    DRAINING = "draining", _("draining")


class Node(models.Model):
    name = models.CharField(max_length=128, unique=True)
    labels = models.JSONField(default=dict, blank=True)
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.NOT_READY)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=32, blank=True, default="")
    # NUMA nodes, PCIe switches and NVLink peers as reported by the agent.
    topology = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DeviceHealth(models.TextChoices):
    HEALTHY = "healthy", _("healthy")
    DEGRADED = "degraded", _("degraded")
    UNHEALTHY = "unhealthy", _("unhealthy")


class Device(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=96, unique=True)
    vendor = models.CharField(max_length=16, choices=Vendor.choices)
    model = models.CharField(max_length=64)
    flavor = models.ForeignKey(ResourceFlavor, null=True, blank=True, on_delete=models.PROTECT, related_name="devices")
    memory_mib = models.PositiveIntegerField()
    numa_node = models.SmallIntegerField(null=True, blank=True)
    pci_bus_id = models.CharField(max_length=32, blank=True, default="")
    health = models.CharField(max_length=16, choices=DeviceHealth.choices, default=DeviceHealth.HEALTHY)
    mig_mode = models.BooleanField(default=False)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="device_unique_node_index")]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.index}"
