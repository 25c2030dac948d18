"""Models → ``scheduler.core`` Snapshot, and the Policy from settings.

Ids in the snapshot: jobs by ``str(pk)``, tenants by slug, nodes by name, devices by uuid, flavors by name
(all unique), so a Plan maps straight back to rows.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from scheduler.core import types as core
from scheduler.models import (
    Allocation,
    CapacityHold,
    Device,
    DeviceHealth,
    InferenceReservation,
    Job,
    JobKind,
    JobState,
    Node,
    NodeStatus,
)

logger = logging.getLogger(__name__)


def _epoch(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _topology_lookup(topology: dict, key: str) -> dict[str, str]:
    """Map device uuid / index (as text) → group name from ``Node.topology[key]``.

    Accepts ``{"domain-a": [uuid or index, ...]}`` or ``[[uuid or index, ...], ...]``; anything else is ignored.
    """
    groups = topology.get(key) if isinstance(topology, dict) else None
    lookup: dict[str, str] = {}
    if isinstance(groups, dict):
        items: Iterable[tuple[Any, Any]] = groups.items()
    elif isinstance(groups, list):
        items = ((f"{key}-{position}", members) for position, members in enumerate(groups))
    else:
        return lookup
    for name, members in items:
        if isinstance(members, dict):
            members = members.get("devices", [])
        if isinstance(members, list):
            for member in members:
                lookup[str(member)] = str(name)
    return lookup


def _device(device: Device, node: Node, nvlink: dict[str, str], pcie: dict[str, str]) -> core.Device:
    def group(explicit: str, lookup: dict[str, str]) -> str | None:
        if explicit:
            return explicit
        found = lookup.get(device.uuid) or lookup.get(str(device.index))
        # Scope fallback names to the node: "nvlink_domains-0" on two nodes are different domains.
        return f"{node.name}:{found}" if found else None

    return core.Device(
        uuid=device.uuid,
        node=node.name,
        index=device.index,
        flavor=device.flavor.name,
        memory_mib=device.memory_mib,
        healthy=device.health == DeviceHealth.HEALTHY,
        nvlink_domain=group(device.nvlink_domain, nvlink),
        pcie_switch=group(device.pcie_switch, pcie),
        numa_node=device.numa_node,
    )


def _nodes() -> tuple[core.Node, ...]:
    nodes = []
    for node in Node.objects.prefetch_related("devices__flavor").order_by("name"):
        topology = node.topology or {}
        nvlink = _topology_lookup(topology, "nvlink_domains")
        pcie = _topology_lookup(topology, "pcie_switches")
        devices = tuple(
            _device(device, node, nvlink, pcie)
            for device in sorted(node.devices.all(), key=lambda d: d.index)
            if device.flavor is not None  # a device no flavor describes cannot be asked for
        )
        nodes.append(
            core.Node(
                name=node.name,
                devices=devices,
                schedulable=node.status == NodeStatus.READY,
                labels={str(k): str(v) for k, v in (node.labels or {}).items()},
            )
        )
    return tuple(nodes)


def _allocations() -> tuple[core.Allocation, ...]:
    rows = (
        Allocation.objects.active()
        .select_related("job", "device", "node", "tenant", "flavor")
        .order_by("job_id", "replica", "device_id")
    )
    result = []
    for row in rows:
        job = row.job
        started = _epoch(row.started_at) or 0.0
        expected_end = None
        if job.max_runtime_s:
            expected_end = started + job.max_runtime_s
        elif job.runtime_estimate_s:
            expected_end = started + job.runtime_estimate_s
        result.append(
            core.Allocation(
                job_id=str(job.pk),
                replica=row.replica,
                device_uuid=row.device.uuid,
                node=row.node.name,
                tenant=row.tenant.slug,
                flavor=row.flavor.name,
                millis=row.millis,
                memory_mib=row.memory_mib,
                priority=job.priority_class,
                preemptible=job.preemptible and job.state != JobState.PREEMPTING,
                borrowed_millis=row.borrowed_millis,
                started_at=started,
                last_checkpoint_at=_epoch(job.last_checkpoint_at),
                kind=core.JobKind(job.kind),
                reservation_of=str(row.reservation_of_id) if row.reservation_of_id else None,
                expected_end_at=expected_end,
            )
        )
    return tuple(result)


def _reservations() -> tuple[core.Reservation, ...]:
    """Inference reservations. Read *after* the allocations: a replica that stops on scale-down turns its
    allocation into a reservation in one transaction, so reading in this order can only see both (too
    little free capacity for a cycle), never neither (a device that looks free but is reserved)."""
    rows = InferenceReservation.objects.select_related("tenant", "flavor", "device", "node").order_by(
        "job_id", "replica", "device_id"
    )
    return tuple(
        core.Reservation(
            job_id=str(row.job_id),
            tenant=row.tenant.slug,
            node=row.node.name,
            device_uuid=row.device.uuid,
            flavor=row.flavor.name,
            millis=row.millis,
            memory_mib=row.memory_mib,
        )
        for row in rows
    )


def _holds() -> tuple[core.Hold, ...]:
    return tuple(
        core.Hold(
            job_id=str(row.job_id),
            device_uuid=row.device.uuid,
            victims=tuple(sorted(str(v) for v in row.victim_ids or ())),
            since=row.since.timestamp(),
        )
        for row in CapacityHold.objects.select_related("device").order_by("job_id", "device_id")
    )


def _tenants() -> tuple[core.Tenant, ...]:
    from tenants.models import Tenant

    return tuple(
        core.Tenant(name=t.slug, parent=t.parent.slug if t.parent else None)
        for t in Tenant.objects.select_related("parent").order_by("slug")
    )


def quota_model() -> Any | None:
    """``tenants.models.Quota`` once the tenants app provides it, else None (tenants are unlimited)."""
    from tenants import models as tenant_models

    return getattr(tenant_models, "Quota", None)


def _quotas() -> tuple[core.Quota, ...]:
    model = quota_model()
    if model is None:
        return ()
    names = {f.name for f in model._meta.get_fields()}
    related = [name for name in ("tenant", "flavor") if name in names]
    quotas = []
    for row in model.objects.select_related(*related):
        flavor = getattr(row, "flavor", None)
        flavor_name = getattr(flavor, "name", flavor)
        max_jobs = None
        for candidate in ("max_running_jobs", "max_jobs"):
            if candidate in names:
                max_jobs = getattr(row, candidate)
                break
        quotas.append(
            core.Quota(
                tenant=row.tenant.slug,
                flavor=str(flavor_name),
                guaranteed_millis=int(getattr(row, "guaranteed_millis", 0) or 0),
                limit_millis=getattr(row, "limit_millis", None),
                lending_limit_millis=getattr(row, "lending_limit_millis", None),
                max_running_jobs=max_jobs or None,
            )
        )
    return tuple(quotas)


USAGE_CACHE_KEY = "scheduler:fairshare-usage:v1"


def held_millis(allocations: tuple[core.Allocation, ...]) -> dict[str, dict[str, float]]:
    """Millis held right now, per tenant and flavor."""
    usage: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for allocation in allocations:
        usage[allocation.tenant][allocation.flavor] += allocation.millis
    return {tenant: dict(flavors) for tenant, flavors in usage.items()}


def decayed_usage(
    held: dict[str, dict[str, float]], *, now_s: float, half_life_s: float, previous: dict | None
) -> dict[str, dict[str, float]]:
    """Time-decayed average of millis held (``scheduler.core.decay_usage``) from the value of the last cycle.

    ``previous`` is ``{"at": epoch seconds, "usage": {tenant: {flavor: millis}}}`` or None (first cycle: the
    usage is what is held now).
    """
    from scheduler.core import decay_usage

    if not previous or "at" not in previous:
        return held
    elapsed = max(0.0, now_s - float(previous["at"]))
    old = previous.get("usage") or {}
    result: dict[str, dict[str, float]] = {}
    for tenant in sorted(set(old) | set(held)):
        flavors = set(old.get(tenant, {})) | set(held.get(tenant, {}))
        values = {
            flavor: decay_usage(
                float(old.get(tenant, {}).get(flavor, 0.0)),
                float(held.get(tenant, {}).get(flavor, 0.0)),
                elapsed,
                half_life_s,
            )
            for flavor in sorted(flavors)
        }
        # Forget what has decayed to nothing, so the record does not grow with every tenant ever seen.
        values = {flavor: value for flavor, value in values.items() if value >= 0.5}
        if values:
            result[tenant] = values
    return result


def pending_job(job: Job) -> core.PendingJob:
    return core.PendingJob(
        job_id=str(job.pk),
        tenant=job.tenant.slug,
        request=core.ReplicaRequest(
            flavors=tuple(job.flavors), millis=job.millis_per_replica, memory_mib=job.memory_mib_per_replica
        ),
        priority=job.priority_class,
        preemptible=job.preemptible,
        submitted_at=_epoch(job.submitted_at) or 0.0,
        kind=core.JobKind(job.kind),
        replicas=job.replicas,
        topology=core.Topology(job.topology),
        min_replicas=job.min_replicas,
        max_replicas=job.max_replicas,
        node_selector={str(k): str(v) for k, v in (job.node_selector or {}).items()},
        preempted_by=frozenset(str(pk) for pk in job.preempted_by or ()),
        awaiting_approval=job.state == JobState.PENDING_APPROVAL,
        runtime_estimate_s=float(job.runtime_estimate_s) if job.runtime_estimate_s else None,
        last_checkpoint_at=_epoch(job.last_checkpoint_at),
    )


def _pending(allocations: tuple[core.Allocation, ...]) -> tuple[core.PendingJob, ...]:
    jobs = (
        Job.objects.filter(state__in=[JobState.QUEUED, JobState.PENDING_APPROVAL])
        .select_related("tenant")
        .order_by("submitted_at", "id")
    )
    return tuple(pending_job(job) for job in jobs) + _scale_ups(allocations)


def _scale_ups(allocations: tuple[core.Allocation, ...]) -> tuple[core.PendingJob, ...]:
    """Running inference services that want more replicas than run: their missing replicas, as pending work
    under the service's own id (so they go onto its reservation first), each replica on its own."""
    replicas: dict[str, set[int]] = defaultdict(set)
    for allocation in allocations:
        replicas[allocation.job_id].add(allocation.replica)
    services = (
        Job.objects.filter(kind=JobKind.INFERENCE, state__in=[JobState.ADMITTED, JobState.RUNNING])
        .select_related("tenant")
        .order_by("submitted_at", "id")
    )
    out = []
    for job in services:
        running = replicas.get(str(job.pk), set())
        missing = job.replicas - len(running)
        if missing <= 0 or not running:
            continue
        out.append(
            replace(
                pending_job(job),
                replicas=missing,
                min_replicas=1,
                first_replica=max(running) + 1,
            )
        )
    return tuple(out)


def build_snapshot(*, now: datetime | None = None, previous_usage: dict | None = None) -> core.Snapshot:
    """The state of the pool as the engine sees it: every node (unschedulable ones keep their allocations),
    active allocations, the tenant tree, quotas, fair-share usage and the pending jobs.

    ``previous_usage`` (what the last cycle stored, see ``decayed_usage``) turns the usage into a
    time-decayed average; without it the usage is the millis held now.
    """
    allocations = _allocations()
    reservations = _reservations()
    now_s = (now or timezone.now()).timestamp()
    usage = decayed_usage(
        held_millis(allocations),
        now_s=now_s,
        half_life_s=policy_from_settings().usage_half_life_s,
        previous=previous_usage,
    )
    return core.Snapshot(
        now=now_s,
        nodes=_nodes(),
        allocations=allocations,
        tenants=_tenants(),
        quotas=_quotas(),
        usage=usage,
        pending=_pending(allocations),
        reservations=reservations,
        holds=_holds(),
    )


def policy_from_settings() -> core.Policy:
    """The Policy; ``GPUPOOL_SCHEDULER_POLICY`` (a dict of Policy fields) overrides the defaults.

    Until the tenants app has quotas, tenants are unlimited (``require_quota=False``).
    """
    overrides = dict(getattr(settings, "GPUPOOL_SCHEDULER_POLICY", {}) or {})
    if quota_model() is None:
        overrides["require_quota"] = False
    return core.Policy(**overrides)


def plan_for(snapshot: core.Snapshot, policy: core.Policy | None = None) -> core.Plan:
    from scheduler.core import plan

    return plan(snapshot, policy or policy_from_settings())
