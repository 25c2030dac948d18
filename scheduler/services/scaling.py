"""Inference services: replica bounds, the replica count a load asks for, scaling up and down, and a stopped
replica's capacity kept as the service's reservation.
"""

from __future__ import annotations

import math
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.api import ConflictError, DomainError, PermissionDeniedError
from scheduler import messages as scheduler_messages
from scheduler.fleet import outbox
from scheduler.fleet.models import Device, Node
from scheduler.models import (
    ACTIVE_JOB_STATES,
    PENDING_JOB_STATES,
    Allocation,
    InferenceReservation,
    Job,
    JobEvent,
    JobKind,
)
from scheduler.services.cycle import request_cycle
from scheduler.transitions import S, allocations_end, job_lock_for_update
from tenants.permissions import can_manage_job

# --- inference services: scaling and reservations ----------------------------------------------------

#: Load per replica a service is scaled to keep (the load figure is busy time / capacity of one replica).
TARGET_LOAD_PER_REPLICA = 0.7
#: No scaling while the load is within this fraction of the target (Kubernetes HPA's default tolerance).
SCALE_TOLERANCE = 0.1


def replica_bounds(job: Job) -> tuple[int, int]:
    """(least, most) replicas ``job`` may run: ``min_replicas``..``max_replicas``; a job without them cannot
    scale (both bounds are its ``replicas``)."""
    most = job.max_replicas or job.replicas
    least = job.min_replicas if job.min_replicas is not None else (job.replicas if job.max_replicas is None else 1)
    return min(least, most), most


def desired_replicas(*, running: int, load: float, least: int, most: int) -> int:
    """Replicas for an average ``load`` per running replica: ``ceil(running * load / target)``, within
    ``least..most``; no change while the load is within ``SCALE_TOLERANCE`` of the target."""
    running = max(1, running)
    ratio = load / TARGET_LOAD_PER_REPLICA
    if abs(ratio - 1.0) <= SCALE_TOLERANCE:
        return min(max(running, least), most)
    return min(max(math.ceil(running * ratio - 1e-9), least), most)


def _running_replicas(job: Job) -> set[int]:
    stopping = set(job.scaling_down_replicas or [])
    return set(Allocation.objects.active().filter(job=job).values_list("replica", flat=True)) - stopping


@transaction.atomic
def job_scale(*, job: Job, replicas: int, actor: Any | None, reason: str = "manual", request: Any | None = None) -> Job:
    """Set the replicas an inference service wants now, within ``min_replicas``..``max_replicas``.

    Up: the next cycle places the missing replicas, on the service's reservation first (training borrowing
    it is preempted with ``reservation_reclaim``). Down: the highest replicas get ``workload.stop``; once
    each has stopped its capacity becomes the service's reservation again (up to ``max_replicas``).
    """
    job = job_lock_for_update(job)
    if actor is not None and not can_manage_job(actor, job):
        raise PermissionDeniedError(scheduler_messages.ONLY_SUBMITTER_TENANT_ADMIN_SYSTEM_ADMIN_MAY())
    if job.kind != JobKind.INFERENCE:
        raise DomainError(
            scheduler_messages.JOB_JOB_ONLY_INFERENCE_SERVICES(pk=job.pk, job_kind=job.kind), code="not_scalable"
        )
    if job.state not in ACTIVE_JOB_STATES and job.state not in PENDING_JOB_STATES:
        raise ConflictError(scheduler_messages.JOB_THERE_NOTHING_SCALE(pk=job.pk, state=job.state), code="job_finished")
    least, most = replica_bounds(job)
    if not least <= replicas <= most:
        raise DomainError(
            scheduler_messages.REPLICAS_MUST_BETWEEN_MIN_REPLICAS(least=least, most=most),
            code="invalid_replicas",
            field="replicas",
        )
    before = job.replicas
    if replicas == before:
        return job
    job.replicas = replicas
    update = ["replicas", "updated_at"]
    if job.state in (S.ADMITTED, S.RUNNING):
        running = sorted(_running_replicas(job))
        surplus = running[replicas:]  # the highest replicas go
        active = Allocation.objects.active().filter(job=job, replica__in=surplus)
        for replica, node_id in active.values_list("replica", "node_id").distinct().order_by("replica", "node_id"):
            outbox.workload_stop_create(job=job, replica=replica, node_id=node_id, reason="scale_down")
        if surplus:
            job.scaling_down_replicas = sorted({*job.scaling_down_replicas, *surplus})
            update.append("scaling_down_replicas")
    job.save(update_fields=update)
    message = f"Scaled from {before} to {replicas} replicas ({reason})."
    JobEvent.objects.create(
        job=job,
        from_state=job.state,
        to_state=job.state,
        reason="scale",
        message=message,
        actor=actor if getattr(actor, "pk", None) else None,
        details={"before": before, "after": replicas, "why": reason},
    )
    audit_record(
        action="job.scale",
        actor=actor,
        tenant=job.tenant,
        target=f"job:{job.pk}",
        details={"before": {"replicas": before}, "after": {"replicas": replicas}, "reason": reason},
        request=request,
    )
    if replicas > before:
        transaction.on_commit(request_cycle)
    return job


@transaction.atomic
def inference_load_report(*, job: Job, load: float, actor: Any | None, request: Any | None = None) -> Job:
    """The service reports its average load per running replica (busy time / capacity of one replica, so
    1.0 is saturated); it is scaled to keep ``TARGET_LOAD_PER_REPLICA`` (HPA's rule, within its bounds)."""
    job = job_lock_for_update(job)
    if actor is not None and not can_manage_job(actor, job):
        raise PermissionDeniedError("Only the submitter, a tenant admin or a system admin may report its load.")
    if load < 0 or math.isnan(load) or math.isinf(load):
        raise DomainError("load: must be a number >= 0 (1.0 = every replica saturated).", code="invalid_load")
    if job.kind != JobKind.INFERENCE:
        raise DomainError(
            scheduler_messages.JOB_JOB_ONLY_INFERENCE_SERVICES(pk=job.pk, job_kind=job.kind), code="not_scalable"
        )
    least, most = replica_bounds(job)
    running = len(_running_replicas(job)) or job.replicas
    wanted = desired_replicas(running=running, load=load, least=least, most=most)
    if wanted == job.replicas:
        return job
    return job_scale(job=job, replicas=wanted, actor=actor, reason=f"load {load:.2f} per replica", request=request)


def scale_down_replica_stopped(*, job: Job, replica: int, node: Node) -> None:
    """A replica stopped for a scale-down: its allocations end and, while the service holds fewer than
    ``max_replicas`` replicas' worth (running + reserved), their capacity becomes its reservation."""
    rows = list(Allocation.objects.active().filter(job=job, replica=replica, node=node))
    # Lock the devices as a cycle's persist step does, so a place written meanwhile sees the reservation.
    list(
        Device.objects.select_for_update(no_key=True)
        .filter(pk__in=sorted({row.device_id for row in rows}))
        .order_by("pk")
    )
    now = timezone.now()
    allocations_end(Allocation.objects.filter(pk__in=[row.pk for row in rows]), now=now)
    if not Allocation.objects.active().filter(job=job, replica=replica).exists():
        job.scaling_down_replicas = [r for r in job.scaling_down_replicas if r != replica]
        job.save(update_fields=["scaling_down_replicas", "updated_at"])
    running = len(_running_replicas(job))
    reserved = InferenceReservation.objects.filter(job=job).values("replica").distinct().count()
    if job.max_replicas and running + reserved < job.max_replicas:
        InferenceReservation.objects.bulk_create(
            InferenceReservation(
                job=job,
                replica=replica,
                tenant_id=row.tenant_id,
                flavor_id=row.flavor_id,
                device_id=row.device_id,
                node_id=row.node_id,
                millis=row.millis,
                memory_mib=row.memory_mib,
            )
            for row in rows
        )
    transaction.on_commit(request_cycle)
