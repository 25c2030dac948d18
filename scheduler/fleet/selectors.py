"""Reads of the fleet: who may watch which telemetry, which devices a tenant holds, what /metrics shows."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Count, QuerySet, Sum

from scheduler.fleet.models import NodeCredential
from scheduler.fleet.telemetry import latest_store
from scheduler.models import Allocation, Device, Job, Node


def _active_allocations() -> QuerySet:
    return Allocation.objects.filter(ended_at__isnull=True)


def is_telemetry_admin(user: Any) -> bool:
    """Platform system admins watch any node; the other platform roles (security admin, auditor) watch none:
    separation of duties keeps them out of operations."""
    from tenants.models import PlatformRole

    return bool(getattr(user, "is_authenticated", False) and user.platform_role == PlatformRole.SYSTEM_ADMIN)


def telemetry_tenant_ids_for(user: Any) -> list[int]:
    """Tenants whose allocated devices ``user`` may watch: the subtrees of the user's memberships.

    Platform roles get none here (a system admin watches nodes instead).
    """
    from tenants.models import Membership, PlatformRole

    if not getattr(user, "is_authenticated", False) or not user.is_active or user.platform_role != PlatformRole.NONE:
        return []
    try:
        from tenants.selectors import tenants_visible_to
    except ImportError:
        roots = list(Membership.objects.filter(user=user).values_list("tenant_id", flat=True))
        return _subtree_ids(roots)
    return list(tenants_visible_to(user).values_list("pk", flat=True))


def _subtree_ids(roots: list[int]) -> list[int]:
    from tenants.models import Tenant

    seen = set(roots)
    frontier = list(roots)
    while frontier:
        frontier = [pk for pk in Tenant.objects.filter(parent_id__in=frontier).values_list("pk", flat=True)]
        frontier = [pk for pk in frontier if pk not in seen]
        seen.update(frontier)
    return sorted(seen)


def device_tenants_of_node(*, node_id: int) -> dict[str, set[int]]:
    """Device UUID → tenants holding an active allocation on it, for one node (used by the agent consumer to
    send each tenant only its own devices)."""
    allocations = _active_allocations()
    result: dict[str, set[int]] = defaultdict(set)
    for uuid, tenant_id in allocations.filter(node_id=node_id).values_list("device__uuid", "tenant_id"):
        result[uuid].add(tenant_id)
    return dict(result)


def device_tenants_of_nodes(*, node_ids: list[int]) -> dict[int, dict[str, set[int]]]:
    """``device_tenants_of_node`` for many nodes in one query (node id → device UUID → tenant ids)."""
    result: dict[int, dict[str, set[int]]] = {node_id: {} for node_id in node_ids}
    rows = _active_allocations().filter(node_id__in=node_ids).values_list("node_id", "device__uuid", "tenant_id")
    for node_id, uuid, tenant_id in rows:
        result[node_id].setdefault(uuid, set()).add(tenant_id)
    return result


def tenant_devices(*, tenant_ids: list[int]) -> dict[int, set[str]]:
    """Node id → UUIDs of devices with an active allocation of one of ``tenant_ids``."""
    allocations = _active_allocations()
    if not tenant_ids:
        return {}
    result: dict[int, set[str]] = defaultdict(set)
    for node_id, uuid in allocations.filter(tenant_id__in=tenant_ids).values_list("node_id", "device__uuid"):
        result[node_id].add(uuid)
    return dict(result)


def credential_is_active(*, credential_id: int) -> bool:
    return NodeCredential.objects.filter(pk=credential_id, revoked_at__isnull=True).exists()


def node_exists(*, node_id: int) -> bool:
    return Node.objects.filter(pk=node_id).exists()


def node_names(*, node_ids: list[int]) -> dict[int, str]:
    return dict(Node.objects.filter(pk__in=node_ids).values_list("pk", "name"))


def nodes_for_fleet() -> QuerySet[Node]:
    """Nodes with their agent state and credential counts, for the admin's node list."""
    return Node.objects.select_related("agent").annotate(device_count=Count("devices", distinct=True)).order_by("name")


def active_credential_count(*, node: Node) -> int:
    return NodeCredential.objects.filter(node=node, revoked_at__isnull=True).count()


def metrics_snapshot() -> dict[str, Any]:
    """Everything /metrics prints, read in a handful of queries plus one Redis pipeline."""
    nodes = list(Node.objects.order_by("name").values("pk", "name", "status"))
    devices = list(
        Device.objects.select_related("flavor", "node").values(
            "uuid", "index", "model", "node_id", "node__name", "flavor__name", "memory_mib"
        )
    )
    latest = latest_store().get_nodes([node["pk"] for node in nodes])
    device_tenant: dict[str, list[str]] = defaultdict(list)
    allocations = _active_allocations()
    for uuid, slug in allocations.order_by().values_list("device__uuid", "tenant__slug").distinct():
        device_tenant[uuid].append(slug)
    # order_by(): the models' default ordering would otherwise join the GROUP BY.
    allocated_by_flavor = {
        row["flavor__name"]: row["millis"]
        for row in allocations.order_by().values("flavor__name").annotate(millis=Sum("millis"))
    }
    jobs_by_state = {row["state"]: row["n"] for row in Job.objects.order_by().values("state").annotate(n=Count("pk"))}
    return {
        "nodes": nodes,
        "devices": devices,
        "latest": latest,
        "device_tenant": dict(device_tenant),
        "allocated_by_flavor": allocated_by_flavor,
        "jobs_by_state": jobs_by_state,
    }
