"""A tenant's quota and its use now, per flavor: what the API's ``/tenants/{id}/quota-usage/``, the console's
quota table and ``gpupool-cli quota`` show.

It lives on the scheduler's side because it reads the scheduler's allocations and devices and asks the
scheduler's own admission rule (``scheduler.core.quota``) for the headroom; the tenants app, below, keeps the
quota rows and knows nothing of their use.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Count, Sum

from catalog.models import ResourceFlavor
from scheduler.core import types as core
from scheduler.core.quota import QuotaBook
from scheduler.fleet.models import Device, DeviceHealth, NodeStatus
from scheduler.models import Allocation
from tenants.models import Quota, Tenant
from tenants.selectors import tenant_subtree_ids


def _active_millis_by_tenant(flavor_ids: Iterable[int] | None = None) -> dict[tuple[int, int], dict[str, int]]:
    """(tenant id, flavor id) → {"millis", "memory_mib", "jobs"} of active allocations (own, not rolled up)."""
    queryset = Allocation.objects.active()
    if flavor_ids is not None:
        queryset = queryset.filter(flavor_id__in=list(flavor_ids))
    rows = queryset.values("tenant_id", "flavor_id").annotate(
        millis=Sum("millis"), memory=Sum("memory_mib"), jobs=Count("job_id", distinct=True)
    )
    return {
        (row["tenant_id"], row["flavor_id"]): {
            "millis": row["millis"] or 0,
            "memory_mib": row["memory"] or 0,
            "jobs": row["jobs"],
        }
        for row in rows
    }


def quota_usage(tenant: Tenant) -> dict[str, dict[str, Any]]:
    """Per flavor name: the tenant's quota and how it is used right now — the one implementation behind the
    console, the API and the scheduler's explanations.

    - ``guaranteed`` / ``limit`` / ``lending_limit``: the tenant's quota row (0 / None when it has none);
    - ``in_use``: millis of active allocations in the tenant's subtree;
    - ``borrowed``: the part of ``in_use`` above the guarantee (reclaimable by lenders);
    - ``lent``: the part of the tenant's idle, lendable guarantee that siblings are using now (siblings'
      borrowing shared among the lenders in proportion to what each can lend);
    - ``available_to_borrow``: how much more the tenant could borrow now, above its unused guarantee: what
      the scheduler's own admission rule would grant a preemptible job (``borrow_headroom``) — the minimum
      over the whole path up the tree of every limit's room and every level's lending — less the unused
      guarantee.
    """
    parent = tenant.parent
    family_ids = [tenant.pk]
    sibling_ids: list[int] = []
    if parent is not None:
        sibling_ids = list(Tenant.objects.filter(parent=parent).exclude(pk=tenant.pk).values_list("pk", flat=True))
        family_ids += [*sibling_ids, parent.pk]
    quotas = {
        (row.tenant_id, row.flavor_id): row
        for row in Quota.objects.filter(tenant_id__in=family_ids).select_related("flavor")
    }
    flavor_ids = {flavor_id for (tenant_id, flavor_id) in quotas if tenant_id == tenant.pk}
    subtree_of = {pk: tenant_subtree_ids(Tenant(pk=pk, depth=1)) for pk in [tenant.pk, *sibling_ids]}
    own_use = _active_millis_by_tenant()
    for tenant_id, flavor_id in own_use:
        if tenant_id in subtree_of[tenant.pk]:
            flavor_ids.add(flavor_id)

    def used(pk: int, flavor_id: int, key: str = "millis") -> int:
        return sum(own_use.get((member, flavor_id), {}).get(key, 0) for member in subtree_of[pk])

    names = dict(ResourceFlavor.objects.filter(pk__in=flavor_ids).values_list("pk", "name"))
    headroom = borrow_headroom(tenant, flavor_ids, own_use)
    result: dict[str, dict[str, Any]] = {}
    for flavor_id in sorted(flavor_ids, key=lambda pk: names.get(pk, "")):
        row = quotas.get((tenant.pk, flavor_id))
        guaranteed = row.guaranteed_millis if row else 0
        limit = row.limit_millis if row else None
        in_use = used(tenant.pk, flavor_id)
        borrowed = max(0, in_use - guaranteed)

        def lendable_idle(pk: int, quota: Any, flavor_id: int = flavor_id) -> int:
            idle = max(0, quota.guaranteed_millis - used(pk, flavor_id))
            return idle if quota.lending_limit_millis is None else min(idle, quota.lending_limit_millis)

        sibling_rows = [(pk, quotas[(pk, flavor_id)]) for pk in sibling_ids if (pk, flavor_id) in quotas]
        siblings_borrowed = sum(max(0, used(pk, flavor_id) - q.guaranteed_millis) for pk, q in sibling_rows)
        siblings_lendable = sum(lendable_idle(pk, q) for pk, q in sibling_rows)
        own_lendable = lendable_idle(tenant.pk, row) if row else 0
        parent_row = quotas.get((parent.pk, flavor_id)) if parent is not None else None
        unassigned = 0
        if parent_row is not None:
            assigned = guaranteed + sum(q.guaranteed_millis for _pk, q in sibling_rows)
            unassigned = max(0, parent_row.guaranteed_millis - assigned)
        pool = own_lendable + siblings_lendable + unassigned
        lent = 0 if pool == 0 else min(own_lendable, siblings_borrowed * own_lendable // pool)
        available = headroom.get(flavor_id, 0)
        result[names[flavor_id]] = {
            "guaranteed": guaranteed,
            "limit": limit,
            "lending_limit": row.lending_limit_millis if row else None,
            "in_use": in_use,
            "borrowed": borrowed,
            "lent": lent,
            "available_to_borrow": available,
            "guaranteed_memory_mib": row.guaranteed_memory_mib if row else 0,
            "memory_in_use_mib": used(tenant.pk, flavor_id, "memory_mib"),
            "running_jobs": used(tenant.pk, flavor_id, "jobs"),
            "max_running_jobs": row.max_running_jobs if row else None,
        }
    return result


def borrow_headroom(
    tenant: Tenant, flavor_ids: Iterable[int], own_use: dict[tuple[int, int], dict[str, int]] | None = None
) -> dict[int, int]:
    """Per flavor id: how many millis ``tenant`` could borrow now above its unused guarantee — the answer of
    the scheduler's admission rule (``scheduler.core.quota.QuotaBook.headroom``) on the pool as it is: every
    limit on the path up the tree, every level's lendable idle guarantee, the capacity promised to nobody. The
    one figure behind the API, ``gpupool-cli quota`` and the console's "Could borrow now", so it can never
    promise a job that a parent's or an ancestor's limit refuses. ``own_use``: active use per (tenant id,
    flavor id), as ``_active_millis_by_tenant`` gives it (read when not passed)."""
    flavor_ids = sorted(set(flavor_ids))
    if not flavor_ids:
        return {}
    if own_use is None:
        own_use = _active_millis_by_tenant(flavor_ids)
    tree = tuple(
        core.Tenant(str(pk), None if parent is None else str(parent))
        for pk, parent in Tenant.objects.values_list("pk", "parent_id")
    )
    rows = Quota.objects.filter(flavor_id__in=flavor_ids).values_list(
        "tenant_id", "flavor_id", "guaranteed_millis", "limit_millis", "lending_limit_millis"
    )
    quotas = tuple(core.Quota(str(t), str(f), guaranteed, limit, lending) for t, f, guaranteed, limit, lending in rows)
    usable = Device.objects.filter(
        flavor_id__in=flavor_ids, health=DeviceHealth.HEALTHY, node__status=NodeStatus.READY
    ).values_list("flavor_id", flat=True)
    capacity: dict[str, int] = {}
    for flavor_id in usable:
        capacity[str(flavor_id)] = capacity.get(str(flavor_id), 0) + core.MILLIS_PER_DEVICE
    book = QuotaBook(core.Snapshot(now=0.0, nodes=(), tenants=tree, quotas=quotas), capacity, require_quota=True)
    for (tenant_id, flavor_id), use in sorted(own_use.items()):
        if flavor_id in flavor_ids and (node := book.account(str(tenant_id), str(flavor_id))) is not None:
            book.charge(node=node, flavor=str(flavor_id), millis=use["millis"], jobs=use["jobs"])
    result = {}
    for flavor_id in flavor_ids:
        node = book.account(str(tenant.pk), str(flavor_id))
        if node is None:
            result[flavor_id] = 0
            continue
        unused = max(0, book.guaranteed(node, str(flavor_id)) - book.usage(node, str(flavor_id)))
        result[flavor_id] = max(0, book.headroom(str(tenant.pk), str(flavor_id)) - unused)
    return result
