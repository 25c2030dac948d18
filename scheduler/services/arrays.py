"""Job arrays, kept as one record (``scheduler.models.JobArray``, as Slurm keeps them): submitting one, the cycle's
top-up that makes rows of the tasks it may place, a task by index, an array's state, and cancelling it (all of
it or some indices).

A submit writes task 0 and the array's record, two statements whatever the count: 100,000 tasks cost what one job
costs. Before each scheduling cycle ``array_tasks_top_up`` makes job rows of the lowest waiting indices of each
array — as many as the pool's free cards could take of its shape, at least ``GPUPOOL_ARRAY_WINDOW`` — so the
engine sees each array as a bounded group of identical jobs, not as all of its tasks. Once a task is a row it is
a job like any other: placed, explained, estimated, shown back, cancelled. The tasks that are not rows yet are
queued, counted in the array's ``states`` and the queue's figures, and cancelled by index without ever becoming
rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.api import DomainError, NotFoundError, PermissionDeniedError
from scheduler import messages as scheduler_messages
from scheduler.core import sentences
from scheduler.jobspec import JobSpecError, validate_job_spec
from scheduler.models import FINAL_JOB_STATES, Job, JobArray
from scheduler.selectors import ArrayState
from scheduler.services.cycle import request_cycle
from scheduler.services.jobs import admission_for, job_cancel, new_job_from_spec, submit_resolve
from scheduler.transitions import (
    JobMove,
    S,
    array_tasks_materialize,
    job_array_create,
    jobs_transition,
    ranges_contains,
    ranges_count,
    ranges_parse,
    ranges_q,
    ranges_subtract,
    ranges_text,
)
from tenants.permissions import can_manage_job


@transaction.atomic
def job_array_submit(
    *, actor: Any | None, spec: dict, request: Any | None = None, idempotency_key: str = ""
) -> ArrayState:
    """Submit ``spec["array"]["count"]`` independent tasks of one spec (Slurm's job arrays) as one record.

    Task i gets ``GPUPOOL_ARRAY_INDEX=i`` (and ``GPUPOOL_ARRAY_ID``, ``GPUPOOL_ARRAY_COUNT``) in its env and the
    array's ``array_id``. The rules of a single submit apply to each task: same tenant check, same approval rule,
    queued at once; quotas (limits, max running jobs) bind each task when a cycle places it, as for any job. An
    array whose tasks would need approval is refused, not held: an approval per task would flood the approvers'
    inbox. Two statements whatever the count (task 0 with its events, the array's record), one audit record
    ``job.array.submit`` and one cycle request. ``idempotency_key`` goes on task 0.
    """
    parsed = validate_job_spec(spec, check_flavor_names=False)
    if parsed.array_count is None:
        raise JobSpecError(scheduler_messages.ARRAY_SAY_HOW_MANY_JOBS(), field="array")
    tenant, parsed = submit_resolve(actor=actor, parsed=parsed)
    state, reason, message = admission_for(tenant=tenant, parsed=parsed)
    if state == S.PENDING_APPROVAL:
        raise DomainError(
            "array: each job of this array would need an administrator's approval (priority critical, or more than "
            "the tenant's approval threshold); arrays are admitted only when their jobs need none. Lower the "
            'priority or the resources, or submit the jobs one by one without "array".',
            code="array_needs_approval",
            field="array",
        )
    submitter = actor if getattr(actor, "pk", None) else None
    array_id = uuid.uuid4()
    count = parsed.array_count
    array_env = {"GPUPOOL_ARRAY_ID": str(array_id), "GPUPOOL_ARRAY_COUNT": str(count), "GPUPOOL_ARRAY_INDEX": "0"}
    first = new_job_from_spec(
        parsed=parsed,
        tenant=tenant,
        submitter=submitter,
        env={**parsed.env, **array_env},
        array_id=array_id,
        array_index=0,
    )
    first.idempotency_key = idempotency_key
    record = job_array_create(
        first=first, count=count, to_state=state, reason=reason, message=message, now=timezone.now()
    )
    audit_record(
        action="job.array.submit",
        actor=actor,
        tenant=tenant,
        target=f"job_array:{array_id}",
        details={
            "after": {**first.spec, "state": state},
            "array": {"id": str(array_id), "count": count, "first_job": first.pk},
        },
        request=request,
    )
    transaction.on_commit(request_cycle)
    return ArrayState(
        array_id=array_id,
        tenant_slug=tenant.slug,
        name=parsed.name,
        count=count,
        first_job_id=first.pk,
        states={state: count},
        waiting_ranges=ranges_text(record.unmaterialized),
        submitted_at=first.submitted_at,
        state=state,
    )


# --- reading an array, a task by index -------------------------------------------------------------------


@transaction.atomic
def array_task(*, array: JobArray, index: int) -> Job:
    """Task ``index`` of ``array`` as a job: its row, made now if the task is still waiting (a user asked for it by
    index). The caller checked the user may see the array."""
    last = array.count - 1
    if not 0 <= index <= last:
        raise NotFoundError(scheduler_messages.NO_ARRAY_TASK(array_id=array.array_id, index=index, last=last))
    job = Job.objects.filter(array_id=array.array_id, array_index=index).first()
    if job is not None:
        return job
    array = JobArray.objects.select_for_update(no_key=True).get(pk=array.pk)
    job = Job.objects.filter(array_id=array.array_id, array_index=index).first()  # made while we waited
    if job is not None:
        return job
    if not ranges_contains(array.unmaterialized, index):
        raise NotFoundError(scheduler_messages.ARRAY_TASK_CANCELLED_BEFORE_START(array_id=array.array_id, index=index))
    (pk,) = array_tasks_materialize(array=array, indices=[index], message="")
    return Job.objects.get(pk=pk)


# --- cancelling --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobArrayCancelled:
    array_id: uuid.UUID
    cancelled_job_ids: list[int]
    already_finished: int
    #: Tasks cancelled before they were rows (no job id to list).
    cancelled_waiting: int = 0


@transaction.atomic
def job_array_cancel(
    *,
    array_id: uuid.UUID,
    actor: Any | None,
    reason: str = "",
    request: Any | None = None,
    indices: str | None = None,
) -> JobArrayCancelled:
    """Cancel every task of an array that has not ended, or only the tasks ``indices`` ("3-7,9"). Tasks that are
    not rows yet are taken out of the array's waiting ranges (no row is made for them); waiting rows are
    cancelled in bulk (one update, one events insert); tasks already placed go through ``job_cancel`` (their
    replicas are stopped, their allocations end). One audit record ``job.array.cancel`` for the batch (placed
    tasks add their own)."""
    record = JobArray.objects.select_for_update(no_key=True).filter(pk=array_id).first()
    jobs_query = Job.objects.select_for_update(of=("self",), no_key=True).select_related("tenant")
    if record is None:  # an array submitted before arrays were one record: every task is a row
        jobs = list(jobs_query.filter(array_id=array_id).order_by("pk"))
        if not jobs:
            raise NotFoundError(scheduler_messages.NO_JOB_ARRAY(pk=array_id))
        head, count = jobs[0], len(jobs)
    else:
        head, count = jobs_query.get(pk=record.head_id), record.count
    # One tenant and one submitter for the whole array: who may cancel one task may cancel them all.
    if actor is not None and not can_manage_job(actor, head):
        raise PermissionDeniedError(scheduler_messages.ONLY_SUBMITTER_TENANT_ADMIN_SYSTEM_ADMIN())
    chosen = None
    if indices is not None:
        try:
            chosen = ranges_parse(indices, count=count)
        except ValueError as exc:
            raise DomainError(
                scheduler_messages.ARRAY_INDICES_INVALID(problem=str(exc), last=count - 1),
                code="invalid_indices",
                field="indices",
            ) from None
    rows = jobs_query.filter(array_id=array_id)
    if chosen is not None:
        rows = rows.filter(ranges_q("array_index", chosen))
    jobs = list(rows.order_by("pk"))
    cancelled_waiting = 0
    if record is not None and record.waiting:
        left = record.unmaterialized if chosen is None else ranges_subtract(record.unmaterialized, chosen)
        cancelled_waiting = record.waiting - ranges_count(left) if chosen is not None else record.waiting
        if chosen is None:
            left = []
        if cancelled_waiting:
            record.unmaterialized = left
            record.waiting -= cancelled_waiting
            record.cancelled_unmaterialized += cancelled_waiting
            record.save(update_fields=["unmaterialized", "waiting", "cancelled_unmaterialized"])
    waiting_states = (S.SUBMITTED, S.PENDING_APPROVAL, S.QUEUED)
    waiting = [job for job in jobs if job.state in waiting_states]
    placed = [job for job in jobs if job.state not in FINAL_JOB_STATES and job.state not in waiting_states]
    message = (reason or sentences.CANCELLED)[:500]
    # One statement for the rows and one for the events however many wait; the array's one audit record below
    # stands for them (``audit=False``).
    jobs_transition(
        moves=[
            JobMove(
                job=job, to_state=S.CANCELLED, reason="cancelled", message=message, details={"array": str(array_id)}
            )
            for job in waiting
        ],
        actor=actor,
        audit=False,
    )
    for job in placed:
        job_cancel(job=job, actor=actor, reason=reason, request=request)
    cancelled = sorted(job.pk for job in [*waiting, *placed])
    audit_record(
        action="job.array.cancel",
        actor=actor,
        tenant=head.tenant,
        target=f"job_array:{array_id}",
        details={
            "before": {"waiting": len(waiting) + cancelled_waiting, "placed": len(placed)},
            "after": {"state": S.CANCELLED, "cancelled": len(cancelled) + cancelled_waiting},
            "indices": indices or "all",
            "reason": reason,
        },
        request=request,
    )
    return JobArrayCancelled(
        array_id=array_id,
        cancelled_job_ids=cancelled,
        already_finished=len(jobs) - len(cancelled),
        cancelled_waiting=cancelled_waiting,
    )
