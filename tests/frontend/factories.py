"""Console test data, built through the apps' services where they exist."""

from __future__ import annotations

import itertools
import uuid

from catalog.models import ResourceFlavor, Vendor
from scheduler.fleet.models import Device, Node, NodeStatus
from tenants.models import MembershipRole, PlatformRole, Tenant, TenantKind, User
from tenants.services.identity import user_create
from tenants.services.memberships import membership_create
from tenants.services.tenancy import tenant_create

PASSWORD = "console-test-password-1"
_counter = itertools.count(1)


def make_user(username: str | None = None, *, platform_role: str = PlatformRole.NONE) -> User:
    return user_create(
        actor=None, username=username or f"user{next(_counter)}", password=PASSWORD, platform_role=platform_role
    )


def make_tenant(slug: str | None = None, *, parent: Tenant | None = None) -> Tenant:
    slug = slug or f"tenant{next(_counter)}"
    kind = TenantKind.COMPANY if parent is None else TenantKind.TEAM
    return tenant_create(actor=None, name=slug.title(), slug=slug, kind=kind, parent=parent)


def make_member(tenant: Tenant, *, role: str = MembershipRole.MEMBER, username: str | None = None) -> User:
    user = make_user(username)
    membership_create(actor=None, user=user, tenant=tenant, role=role)
    return user


def make_flavor(name: str = "nvidia-h100-80g", memory_mib: int = 81559) -> ResourceFlavor:
    flavor, _ = ResourceFlavor.objects.get_or_create(
        name=name, defaults={"vendor": Vendor.NVIDIA, "model": name.upper(), "memory_mib": memory_mib}
    )
    return flavor


def make_node(
    name: str | None = None, *, devices: int = 2, flavor: ResourceFlavor | None = None, status: str = NodeStatus.READY
) -> Node:
    """A node with ``devices`` cards, as an agent's registration would leave it (the fleet owns that path)."""
    flavor = flavor or make_flavor()
    node = Node.objects.create(name=name or f"node{next(_counter)}", status=status, cpu_cores=64, memory_mib=512000)
    for index in range(devices):
        Device.objects.create(
            node=node,
            index=index,
            uuid=f"GPU-{uuid.uuid4()}",
            vendor=flavor.vendor,
            model=flavor.model,
            flavor=flavor,
            memory_mib=flavor.memory_mib,
        )
    return node
