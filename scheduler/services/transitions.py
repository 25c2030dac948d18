"""Job state changes: the allowed transitions, ``job_transition`` (the one way a job changes state: checked,
with a ``JobEvent`` and an audit record in the caller's transaction), ending allocations, requeueing, and
releasing an inference service's reservations.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone

from audit.services import audit_record
from portal.api import ConflictError, NotFoundError
from portal.db.bulk import insert_instances, update_instance
from scheduler import outbox
from scheduler.models import (
    ACTIVE_JOB_STATES,
    FINAL_JOB_STATES,
    PENDING_JOB_STATES,
    Allocation,
    InferenceReservation,
    Job,
    JobEvent,
    JobKind,
    JobState,
)

S = JobState
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    S.SUBMITTED: frozenset({S.PENDING_APPROVAL, S.QUEUED, S.CANCELLED, S.FAILED}),
    S.PENDING_APPROVAL: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.QUEUED: frozenset({S.ADMITTED, S.CANCELLED, S.FAILED}),
    S.ADMITTED: frozenset({S.RUNNING, S.PREEMPTING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.NODE_LOST}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTING, S.NODE_LOST}),
    S.PREEMPTING: frozenset({S.QUEUED, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.NODE_LOST}),
    S.NODE_LOST: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
#: The audit action of a move into these states: a code of its own (registered in ``audit.events``), so a
#: search of the trail for "cancel" or "preempt" finds it — the state itself is in the sealed details, which
#: no search reads. Every other move is ``job.transition``.
TRANSITION_AUDIT_ACTIONS: dict[str, str] = {S.CANCELLED: "job.cancel", S.PREEMPTING: "job.preempt"}


# --- transitions --------------------------------------------------------------------------------------


def job_transition(
    *,
    job: Job,
    to_state: str,
    actor: Any | None,
    reason: str = "",
    message: str = "",
    details: dict | None = None,
    request: Any | None = None,
    also_save: Iterable[str] = (),
) -> Job:
    """Move ``job`` to ``to_state`` (the job row should be locked by the caller); refuses illegal moves.

    Writes the JobEvent and the audit record in the same transaction, and keeps the timestamps and the
    pending explanation consistent with the new state. ``also_save``: fields the caller changed on ``job``,
    written by the same UPDATE as the state (one statement instead of two).
    """
    from_state = job.state
    if to_state not in ALLOWED_TRANSITIONS.get(from_state, frozenset()):
        raise ConflictError(f"Job {job.pk} is {from_state}; it cannot become {to_state}.", code="invalid_transition")
    now = timezone.now()
    job.state = to_state
    update = {"state", "updated_at", *also_save}
    if to_state == S.QUEUED:
        job.queued_at = now
        update.add("queued_at")
    elif to_state == S.ADMITTED:
        job.admitted_at = now
        update.add("admitted_at")
    elif to_state == S.RUNNING and job.started_at is None:
        job.started_at = now
        update.add("started_at")
    if to_state in FINAL_JOB_STATES:
        job.finished_at = now
        update.add("finished_at")
    if to_state not in PENDING_JOB_STATES:
        job.pending_reason_code = ""
        job.pending_message = ""
        job.position_in_tenant = None
        job.position_overall = None
        update |= {"pending_reason_code", "pending_message", "position_in_tenant", "position_overall"}
    if message:
        job.state_message = message[:500]
        update.add("state_message")
    if to_state not in ACTIVE_JOB_STATES and job.scaling_down_replicas:
        job.scaling_down_replicas = []
        update.add("scaling_down_replicas")
    if job.pk is None:
        job.save()
    else:
        update_instance(job, update)  # one plain UPDATE: Model.save composed it anew on every transition
    if to_state not in ACTIVE_JOB_STATES and job.kind == JobKind.INFERENCE:
        # Requeued, finished or cancelled: a service keeps no idle capacity (a new placement reserves anew).
        reservations_release(job=job)
    insert_instances(
        [
            JobEvent(
                job=job,
                from_state=from_state,
                to_state=to_state,
                reason=reason[:40],
                message=message[:500],
                actor=actor if getattr(actor, "pk", None) else None,
                details=details or {},
            )
        ]
    )
    audit_record(
        action=TRANSITION_AUDIT_ACTIONS.get(to_state, "job.transition"),
        actor=actor,
        tenant=job.tenant_id,  # the id is all the record takes: the tenant row need not be loaded
        target=f"job:{job.pk}",
        details={"before": {"state": from_state}, "after": {"state": to_state}, "reason": reason, **(details or {})},
        request=request,
    )
    return job


def _lock_job(job: Job | int) -> Job:
    pk = job if isinstance(job, int) else job.pk
    try:
        # The job row only (FOR NO KEY UPDATE): locking the tenant row too made every transaction of the tenant
        # wait on it, and FOR UPDATE would block the foreign-key checks (FOR KEY SHARE) of concurrent inserts.
        return Job.objects.select_for_update(of=("self",), no_key=True).select_related("tenant").get(pk=pk)
    except Job.DoesNotExist:
        raise NotFoundError(f"No job with id {pk}.") from None


def _end_allocations(queryset, *, now: datetime | None = None) -> int:
    """End the active allocations of ``queryset`` (one job's) and withdraw the starts of their runs that no agent
    acknowledged yet, so a cut-off node that reconnects never starts a run that has ended."""
    active = queryset.filter(ended_at__isnull=True)
    runs = list(active.values_list("job_id", "replica", "node_id").distinct())
    ended = active.update(ended_at=now or timezone.now())
    outbox.workload_starts_withdraw(runs=runs)
    return ended


# --- requeue, reservations ---------------------------------------------------------------------------


def _requeue(job: Job, *, reason: str, message: str) -> None:
    """Back to the queue (resuming from its checkpoint when it has one)."""
    suffix = " It resumes from its last checkpoint." if job.last_checkpoint_at else ""
    job_transition(job=job, to_state=S.QUEUED, actor=None, reason=reason, message=message + suffix)


def reservations_release(*, job: Job) -> int:
    """Delete every reservation of ``job`` (the caller's transaction). Work that borrowed them keeps running
    as ordinary allocations, on capacity the release has just freed. Returns the rows deleted."""
    deleted, _ = InferenceReservation.objects.filter(job=job).delete()
    if deleted:
        Allocation.objects.active().filter(reservation_of=job).update(reservation_of=None)
    return deleted
