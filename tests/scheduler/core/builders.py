"""Small builders for engine inputs (the core's types are plain frozen dataclasses, so functions suffice)."""

from __future__ import annotations

from scheduler.core.types import (
    Allocation,
    Device,
    Node,
    PendingJob,
    Quota,
    ReplicaRequest,
    Snapshot,
    Tenant,
)

FLAVOR = "nvidia-h100-80g"
MEM = 81920


def node(
    name: str,
    cards: int = 8,
    *,
    flavor: str = FLAVOR,
    memory_mib: int = MEM,
    nvlink: list[str | None] | None = None,
    pcie: list[str | None] | None = None,
    numa: list[int | None] | None = None,
    schedulable: bool = True,
    unhealthy: tuple[int, ...] = (),
    labels: dict[str, str] | None = None,
) -> Node:
    devices = tuple(
        Device(
            uuid=f"{name}-gpu{i}",
            node=name,
            index=i,
            flavor=flavor,
            memory_mib=memory_mib,
            healthy=i not in unhealthy,
            nvlink_domain=nvlink[i] if nvlink else None,
            pcie_switch=pcie[i] if pcie else None,
            numa_node=numa[i] if numa else None,
        )
        for i in range(cards)
    )
    return Node(name=name, devices=devices, schedulable=schedulable, labels=labels or {})


def job(
    job_id: str,
    tenant: str = "team-a",
    *,
    cards: int | None = 1,
    millis: int | None = None,
    memory_mib: int = 0,
    flavor: str | tuple[str, ...] = FLAVOR,
    **kw,
) -> PendingJob:
    flavors = (flavor,) if isinstance(flavor, str) else flavor
    if millis is not None:
        request = ReplicaRequest(flavors=flavors, millis=millis, memory_mib=memory_mib or 8192)
    else:
        request = ReplicaRequest(flavors=flavors, millis=(cards or 1) * 1000, memory_mib=memory_mib)
    return PendingJob(job_id=job_id, tenant=tenant, request=request, **kw)


def alloc(
    job_id: str,
    device_uuid: str,
    tenant: str = "team-a",
    *,
    millis: int = 1000,
    memory_mib: int | None = None,
    priority: int = 500,
    preemptible: bool = True,
    borrowed_millis: int = 0,
    started_at: float = 0.0,
    replica: int = 0,
    flavor: str = FLAVOR,
    **kw,
) -> Allocation:
    node_name = device_uuid.rsplit("-gpu", 1)[0]
    return Allocation(
        job_id=job_id,
        replica=replica,
        device_uuid=device_uuid,
        node=node_name,
        tenant=tenant,
        flavor=flavor,
        millis=millis,
        memory_mib=(MEM if millis >= 1000 else 8192) if memory_mib is None else memory_mib,
        priority=priority,
        preemptible=preemptible,
        borrowed_millis=borrowed_millis,
        started_at=started_at,
        **kw,
    )


def quota(tenant: str, guaranteed_cards: float, limit_cards: float | None = None, **kw) -> Quota:
    return Quota(
        tenant=tenant,
        flavor=kw.pop("flavor", FLAVOR),
        guaranteed_millis=int(guaranteed_cards * 1000),
        limit_millis=None if limit_cards is None else int(limit_cards * 1000),
        **kw,
    )


def snapshot(nodes, *, pending=(), allocations=(), quotas=None, tenants=(), now: float = 10_000.0, **kw) -> Snapshot:
    pending = tuple(pending)
    if quotas is None:  # by default every tenant in play gets an ample quota
        names = sorted({j.tenant for j in pending} | {a.tenant for a in allocations} | {t.name for t in tenants})
        quotas = [quota(t, 1000) for t in names]
    return Snapshot(
        now=now,
        nodes=tuple(nodes),
        allocations=tuple(allocations),
        tenants=tuple(Tenant(*t) if isinstance(t, tuple) else t for t in tenants),
        quotas=tuple(quotas),
        pending=pending,
        **kw,
    )
