"""gpupool's own job history as a replayable trace (``scheduler/sim/traceformat.py``, docs/trace-format.md).

``trace_window(since=, until=)`` reads the jobs submitted in ``[since, until)`` that ran, with the current
inventory as the cluster and the current tenant tree and quotas as the tenants, so that "replay last month
under the proposed policy" is ``gpupool export_trace`` then ``gpupool simulate --trace-file …``.

What a job becomes: ``submit_s`` is seconds after ``since``; its shape is what it asked for (replicas,
millis and memory per replica, CPU and host memory, flavors, priority class, preemptible, topology, runtime
estimate); ``duration_s`` is the time it held devices, every run added up (so a run cut short by a
preemption counts too: an upper bound of the work when it was preempted). A job that never held a device
(cancelled, refused or still waiting) has no duration and is left out; the manifest counts them. A job still
running at the export counts its time so far.

``trace_export(actor=…)`` is the same read for a person, recorded in the audit trail (it discloses every
tenant's job history).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.access_rules import Action
from kernel.api import DomainError, PermissionDeniedError
from scheduler import messages as scheduler_messages
from scheduler.core import types as core
from scheduler.models import Allocation, Job
from scheduler.sim.traceformat import FORMATS, TenantSpec, flavor_capacity, trace_texts
from scheduler.sim.workload import SimJob, Workload
from scheduler.snapshot import build_snapshot
from tenants.access import allows

TRACE_FORMAT = "gpupool-trace/1"
MAX_WINDOW_DAYS = 366


@dataclass(frozen=True)
class TraceWindow:
    """The jobs of one window, the cluster and the tenants, ready to write or replay."""

    since: datetime
    until: datetime
    exported_at: datetime
    jobs: list[SimJob]
    nodes: tuple[core.Node, ...]
    tenants: TenantSpec
    never_ran: int  # jobs submitted in the window that never held a device (not in the trace)
    still_running: int  # jobs in the trace still holding devices at the export (duration so far)

    def manifest(self, fmt: str) -> dict[str, Any]:
        return {
            "format": TRACE_FORMAT,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "exported_at": self.exported_at.isoformat(),
            "submit_s_zero": "since",
            "jobs": len(self.jobs),
            "gpu_seconds": sum(j.gpus * j.duration_s for j in self.jobs),
            "never_ran": self.never_ran,
            "still_running": self.still_running,
            "files": {"jobs": f"jobs.{fmt}", "cluster": f"cluster.{fmt}", "tenants": f"tenants.{fmt}"},
            "replay": f"gpupool simulate --trace-file jobs.{fmt} --cluster-file cluster.{fmt} "
            f"--tenants-file tenants.{fmt}",
        }

    def files(self, fmt: str = "csv") -> dict[str, str]:
        """File name → text: the three trace files and ``manifest.json``."""
        if fmt not in FORMATS:
            raise DomainError(
                scheduler_messages.UNKNOWN_FORMAT_USE_ONE(value=fmt, choices=", ".join(FORMATS)), field="format"
            )
        texts = trace_texts(self.jobs, self.nodes, self.tenants, fmt)
        texts["manifest.json"] = json.dumps(self.manifest(fmt), indent=1) + "\n"
        return texts

    def zip_bytes(self, fmt: str = "csv") -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
            for name, text in self.files(fmt).items():
                bundle.writestr(name, text)
        return buffer.getvalue()

    def workload(self) -> Workload:
        """The window as the simulator replays it (the tenants' quotas as guarantees and limits)."""
        return Workload(
            name=f"gpupool {self.since:%Y-%m-%d}..{self.until:%Y-%m-%d}",
            nodes=self.nodes,
            jobs=tuple(self.jobs),
            guarantees=self.tenants.guarantees,
            limits=self.tenants.limits,
            parents=self.tenants.parents,
            lending_limits=self.tenants.lending_limits,
            max_running_jobs=self.tenants.max_running_jobs,
            meta={
                "jobs": len(self.jobs),
                "gpus": sum(flavor_capacity(self.nodes).values()) // core.MILLIS_PER_DEVICE,
                "since": self.since.isoformat(),
                "until": self.until.isoformat(),
            },
        )


def window_bounds(
    *,
    days: float | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
) -> tuple[datetime, datetime]:
    """``[since, until)``: ``until`` defaults to now, ``since`` to ``days`` (default 30) before ``until``."""
    until = until or now or timezone.now()
    if since is None:
        if days is not None and not 0 < days <= MAX_WINDOW_DAYS:
            raise DomainError(scheduler_messages.DAYS_MUST_MORE_MOST(max=MAX_WINDOW_DAYS), field="days")
        try:
            since = until - timedelta(days=30 if days is None else days)
        except OverflowError:
            raise DomainError(scheduler_messages.WINDOW_STARTS_BEFORE_YEAR_CHOOSE(), field="until") from None
    if since >= until:
        raise DomainError(scheduler_messages.SINCE_MUST_BEFORE_UNTIL(), field="since")
    if until - since > timedelta(days=MAX_WINDOW_DAYS):
        raise DomainError(scheduler_messages.WINDOW_LONGER_DAYS_EXPORT_PARTS(max=MAX_WINDOW_DAYS), field="since")
    return since, until


def _merged_seconds(runs: list[tuple[datetime, datetime]]) -> float:
    """Length of the union of intervals (replicas of one run, started together, count once)."""
    total = 0.0
    current_start = current_end = None
    for start, end in sorted(runs):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += (current_end - current_start).total_seconds()
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += (current_end - current_start).total_seconds()
    return total


def trace_window(*, since: datetime, until: datetime, now: datetime | None = None) -> TraceWindow:
    """The jobs submitted in ``[since, until)`` that held devices, the inventory and the quota tree (reads
    only; three queries for the jobs and their runs plus the snapshot's)."""
    now = now or timezone.now()
    in_window = {"submitted_at__gte": since, "submitted_at__lt": until}
    runs: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    running: set[int] = set()
    allocations = Allocation.objects.filter(**{f"job__{k}": v for k, v in in_window.items()})
    for job_id, started_at, ended_at in allocations.values_list("job_id", "started_at", "ended_at"):
        if ended_at is None:
            running.add(job_id)
        runs[job_id].append((started_at, ended_at or now))
    rows = (
        Job.objects.filter(**in_window)
        .order_by("submitted_at", "pk")
        .values_list(
            "pk",
            "tenant__slug",
            "submitted_at",
            "replicas",
            "millis_per_replica",
            "memory_mib_per_replica",
            "cpu_millicores_per_replica",
            "host_memory_mib_per_replica",
            "flavors",
            "priority_class",
            "preemptible",
            "runtime_estimate_s",
            "topology",
            "any_flavor",
        )
    )
    jobs: list[SimJob] = []
    never_ran = 0
    topologies = {t.value: t for t in core.Topology}
    for pk, tenant, submitted_at, replicas, millis, memory, cpu, host_memory, flavors, priority, *rest in rows:
        preemptible, estimate, topology, any_flavor = rest
        duration = _merged_seconds(runs.get(pk, []))
        if duration <= 0:
            never_ran += 1
            continue
        jobs.append(
            SimJob(
                job_id=str(pk),
                tenant=tenant,
                submit_s=(submitted_at - since).total_seconds(),
                duration_s=duration,
                millis=millis,
                replicas=replicas,
                flavors=tuple(flavors),
                any_flavor=any_flavor,
                memory_mib=memory,
                priority=priority,
                preemptible=preemptible,
                cpu_millicores=cpu,
                host_memory_mib=host_memory,
                topology=topologies.get(topology, core.Topology.NONE),
                runtime_estimate_s=float(estimate) if estimate else None,
            )
        )
    snapshot = build_snapshot(now=now)
    return TraceWindow(
        since=since,
        until=until,
        exported_at=now,
        jobs=jobs,
        nodes=tuple(_as_inventory(n) for n in snapshot.nodes if n.devices),
        tenants=_tenant_spec(snapshot),
        never_ran=never_ran,
        still_running=len(running & {int(j.job_id) for j in jobs}),
    )


def _as_inventory(node: core.Node) -> core.Node:
    """The node as the cluster file states it: its cards and host resources, whatever its state now (a node
    cordoned or a card unhealthy today was part of the pool the history ran on)."""
    devices = tuple(replace(d, healthy=True) for d in node.devices)
    return replace(node, devices=devices, schedulable=True, labels={})


def _tenant_spec(snapshot: core.Snapshot) -> TenantSpec:
    guarantees: dict[str, dict[str, int]] = defaultdict(dict)
    limits: dict[str, dict[str, int | None]] = defaultdict(dict)
    lending: dict[str, dict[str, int | None]] = defaultdict(dict)
    max_jobs: dict[str, dict[str, int | None]] = defaultdict(dict)
    for quota in snapshot.quotas:
        guarantees[quota.tenant][quota.flavor] = quota.guaranteed_millis
        limits[quota.tenant][quota.flavor] = quota.limit_millis
        if quota.lending_limit_millis is not None:
            lending[quota.tenant][quota.flavor] = quota.lending_limit_millis
        if quota.max_running_jobs is not None:
            max_jobs[quota.tenant][quota.flavor] = quota.max_running_jobs
    return TenantSpec(
        parents={t.name: t.parent for t in snapshot.tenants},
        guarantees=dict(guarantees),
        limits=dict(limits),
        lending_limits=dict(lending),
        max_running_jobs=dict(max_jobs),
    )


def trace_export(*, actor: Any | None, since: datetime, until: datetime, request: Any | None = None) -> TraceWindow:
    """``trace_window`` for a system admin (``actor`` None: the system, e.g. ``gpupool export_trace``),
    recorded in the audit trail as ``trace.export``."""
    if actor is not None and not allows(actor, Action.TRACE_EXPORT):
        raise PermissionDeniedError(scheduler_messages.ONLY_SYSTEM_ADMIN_MAY_EXPORT())
    window = trace_window(since=since, until=until)
    with transaction.atomic():
        audit_record(
            action="trace.export",
            actor=actor,
            target="scheduler:jobs",
            details={"since": since.isoformat(), "until": until.isoformat(), "jobs": len(window.jobs)},
            request=request,
        )
    return window
