"""Factories for the scheduler's tests: flavors, nodes, devices, jobs (rows written directly)."""

from __future__ import annotations

import factory
from django.utils import timezone

from catalog.models import ResourceFlavor, Vendor
from scheduler.fleet.models import Device, Node, NodeStatus
from scheduler.models import Job, JobState

try:  # the shared user/tenant factories of the tenants area
    from tests.factories import MembershipFactory, SystemAdminFactory, TenantFactory, UserFactory
except ImportError:  # pragma: no cover - small local equivalents
    from tenants.models import Membership, PlatformRole, Tenant, User

    class UserFactory(factory.django.DjangoModelFactory):
        class Meta:
            model = User

        username = factory.Sequence(lambda n: f"user{n}")

    class SystemAdminFactory(UserFactory):
        platform_role = PlatformRole.SYSTEM_ADMIN

    class TenantFactory(factory.django.DjangoModelFactory):
        class Meta:
            model = Tenant

        name = factory.Sequence(lambda n: f"Tenant {n}")
        slug = factory.Sequence(lambda n: f"tenant-{n}")

    class MembershipFactory(factory.django.DjangoModelFactory):
        class Meta:
            model = Membership

        user = factory.SubFactory(UserFactory)
        tenant = factory.SubFactory(TenantFactory)
        role = "member"


__all__ = [
    "DeviceFactory",
    "FlavorFactory",
    "JobFactory",
    "MembershipFactory",
    "NodeFactory",
    "SystemAdminFactory",
    "TenantFactory",
    "UserFactory",
]


class FlavorFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ResourceFlavor
        django_get_or_create = ("name",)

    name = "sim-80g"
    vendor = Vendor.SIMULATED
    model = "Simulated 80G"
    memory_mib = 81920


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    name = factory.Sequence(lambda n: f"node-{n}")
    status = NodeStatus.READY
    cpu_cores = 64
    memory_mib = 512 * 1024
    last_heartbeat_at = factory.LazyFunction(timezone.now)


class DeviceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Device

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n % 8)
    uuid = factory.Sequence(lambda n: f"GPU-test-{n:06d}")
    vendor = Vendor.SIMULATED
    model = "Simulated 80G"
    flavor = factory.SubFactory(FlavorFactory)
    memory_mib = 81920


def node_with_devices(count: int = 2, **node_fields) -> Node:
    node = NodeFactory(**node_fields)
    flavor = FlavorFactory()
    for index in range(count):
        DeviceFactory(node=node, index=index, flavor=flavor, uuid=f"GPU-{node.name}-{index}")
    return node


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"job-{n}")
    flavors = factory.LazyFunction(lambda: ["sim-80g"])
    millis_per_replica = 1000
    command = factory.LazyFunction(lambda: ["python", "train.py"])
    state = JobState.QUEUED
