"""Job arrays: submitting many copies of one spec in bulk, and cancelling an array."""

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
from scheduler.models import FINAL_JOB_STATES, Job
from scheduler.services.cycle import request_cycle
from scheduler.services.jobs import admission_for, job_cancel, new_job_from_spec, submit_resolve
from scheduler.transitions import JobMove, S, job_array_create, jobs_transition
from tenants.permissions import can_manage_job


@dataclass(frozen=True)
class JobArray:
    """What an array submit created: ``job_ids`` in index order (job ``job_ids[i]`` has array_index i)."""

    array_id: uuid.UUID
    tenant_slug: str
    name: str
    state: str
    job_ids: list[int]

    @property
    def count(self) -> int:
        return len(self.job_ids)


@transaction.atomic
def job_array_submit(
    *, actor: Any | None, spec: dict, request: Any | None = None, idempotency_key: str = ""
) -> JobArray:
    """Create ``spec["array"]["count"]`` independent jobs of one spec in one transaction (Slurm's job arrays).

    Job i gets ``GPUPOOL_ARRAY_INDEX=i`` (and ``GPUPOOL_ARRAY_ID``, ``GPUPOOL_ARRAY_COUNT``) in its env and the
    batch's ``array_id``. The rules of a single submit apply to each job: same tenant check, same approval
    rule, queued at once; quotas (limits, max running jobs) bind each job when a cycle places it, as for any
    job. An array whose jobs would need approval is refused, not held: an approval per job would flood the
    approvers' inbox. The same statements whatever the count (job 0, its copies, the events: three inserts),
    one audit record ``job.array.submit`` for the batch and one cycle request. ``idempotency_key`` goes on job 0
    only (the key is unique per submitter; the copies carry '').
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
    now = timezone.now()
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
    job_ids = job_array_create(first=first, count=count, to_state=state, reason=reason, message=message, now=now)
    audit_record(
        action="job.array.submit",
        actor=actor,
        tenant=tenant,
        target=f"job_array:{array_id}",
        details={
            "after": {**first.spec, "state": state},
            "array": {"id": str(array_id), "count": count, "first_job": job_ids[0], "last_job": job_ids[-1]},
        },
        request=request,
    )
    transaction.on_commit(request_cycle)
    return JobArray(array_id=array_id, tenant_slug=tenant.slug, name=parsed.name, state=state, job_ids=job_ids)


@dataclass(frozen=True)
class JobArrayCancelled:
    array_id: uuid.UUID
    cancelled_job_ids: list[int]
    already_finished: int


@transaction.atomic
def job_array_cancel(
    *, array_id: uuid.UUID, actor: Any | None, reason: str = "", request: Any | None = None
) -> JobArrayCancelled:
    """Cancel every job of an array that has not ended. Waiting jobs are cancelled in bulk (one update, one
    events insert); jobs already placed go through ``job_cancel`` (their replicas are stopped, their
    allocations end). One audit record ``job.array.cancel`` for the batch (placed jobs add their own)."""
    jobs = list(
        Job.objects.select_for_update(of=("self",), no_key=True)
        .select_related("tenant")
        .filter(array_id=array_id)
        .order_by("pk")
    )
    if not jobs:
        raise NotFoundError(scheduler_messages.NO_JOB_ARRAY(pk=array_id))
    # One tenant and one submitter for the whole array: who may cancel one job may cancel them all.
    if actor is not None and not can_manage_job(actor, jobs[0]):
        raise PermissionDeniedError(scheduler_messages.ONLY_SUBMITTER_TENANT_ADMIN_SYSTEM_ADMIN())
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
        tenant=jobs[0].tenant,
        target=f"job_array:{array_id}",
        details={
            "before": {"waiting": len(waiting), "placed": len(placed)},
            "after": {"state": S.CANCELLED, "cancelled": len(cancelled)},
            "reason": reason,
        },
        request=request,
    )
    return JobArrayCancelled(
        array_id=array_id, cancelled_job_ids=cancelled, already_finished=len(jobs) - len(cancelled)
    )
