"""Writes for jobs, nodes, flavors and the scheduling cycle. Every state change goes through a function here.

Job states move only through :func:`job_transition`, which checks the transition is allowed, writes a
``JobEvent`` and an audit record in the caller's transaction. Commands to agents go through
``scheduler.outbox`` (rows now, announcements after commit).
"""

from __future__ import annotations

import contextlib
import logging
import math
import uuid
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from audit.events import register as audit_event_register
from audit.services import audit_record
from nodeagent import protocol
from portal.api import ConflictError, DomainError, NotFoundError, PermissionDeniedError
from scheduler import access, outbox
from scheduler.jobspec import JobSpec, JobSpecError, check_checkpoint_dir, check_flavors, validate_job_spec
from scheduler.models import (
    ACTIVE_JOB_STATES,
    FINAL_JOB_STATES,
    PENDING_JOB_STATES,
    AgentCommand,
    Allocation,
    Device,
    InferenceReservation,
    Job,
    JobEvent,
    JobKind,
    JobState,
    Node,
    NodeStatus,
    ResourceFlavor,
)

logger = logging.getLogger(__name__)

audit_event_register("job.scale", "workload", "An inference service changed its replica count")

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

# Prompt cycles (``request_cycle`` / ``run_requested_cycles``): a change sets the dirty flag; the first request
# that finds no cycle task claimed queues one at once; the task runs cycles until the flag stays clear.
CYCLE_DIRTY_KEY = "scheduler:cycle:dirty"
CYCLE_CLAIM_KEY = "scheduler:cycle:claimed"
# How long a claim outlives its task: a worker that dies mid-cycle blocks prompt cycles this long at most (beat
# still runs one every few seconds, and a restarted worker clears the claim at once). Renewed every cycle.
CYCLE_CLAIM_TTL_S = 60
# A task that keeps finding new requests hands over to a fresh task after this long (other tasks get a turn).
CYCLE_LOOP_MAX_S = 30.0
# How long a requested cycle waits for the cycle lock (a beat cycle, or another worker's) before trying again.
CYCLE_LOCK_WAIT_S = 10.0
# When the last cycle started (epoch seconds): for monitoring and ``benchmarks/scheduler_db_cycle.py``.
CYCLE_STARTED_KEY = "scheduler:cycle:started-at"
# The Celery queue requested cycles are sent to (None: the default queue); tests point it at their worker.
CYCLE_QUEUE: str | None = None


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
) -> Job:
    """Move ``job`` to ``to_state`` (the job row should be locked by the caller); refuses illegal moves.

    Writes the JobEvent and the audit record in the same transaction, and keeps the timestamps and the
    pending explanation consistent with the new state.
    """
    from_state = job.state
    if to_state not in ALLOWED_TRANSITIONS.get(from_state, frozenset()):
        raise ConflictError(f"Job {job.pk} is {from_state}; it cannot become {to_state}.", code="invalid_transition")
    now = timezone.now()
    job.state = to_state
    update = {"state", "updated_at"}
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
        job.save(update_fields=sorted(update))
    if to_state not in ACTIVE_JOB_STATES and job.kind == JobKind.INFERENCE:
        # Requeued, finished or cancelled: a service keeps no idle capacity (a new placement reserves anew).
        reservations_release(job=job)
    JobEvent.objects.create(
        job=job,
        from_state=from_state,
        to_state=to_state,
        reason=reason[:40],
        message=message[:500],
        actor=actor if getattr(actor, "pk", None) else None,
        details=details or {},
    )
    audit_record(
        action="job.transition",
        actor=actor,
        tenant=job.tenant,
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


# --- submit, cancel, approval -------------------------------------------------------------------------


def _resolve_tenant(*, actor: Any | None, slug: str | None, flavors: Sequence[str] = ()):
    """The tenant a job goes to, checked in one query: the tenant (``slug``, or else the actor's only tenant
    where they may submit) with its ancestors loaded on it (the approval threshold walks them), whether
    ``actor`` holds a role on it or above it, and whether each of ``flavors`` exists.

    Refuses, in this order: an unknown flavor (``JobSpecError``, a spec error like any other), a tenant the
    actor cannot see (``NotFoundError``, the same as a missing one), a tenant where they may not submit.
    """
    from tenants.models import MAX_TENANT_DEPTH, Membership, MembershipRole, Tenant

    # ``actor`` None is the system itself; any other actor must be a signed-in, active account (an anonymous
    # user sees no tenant at all, as in ``tenants.selectors.tenants_visible_to``).
    user = actor
    if user is not None and not (getattr(user, "is_authenticated", False) and user.is_active and user.pk):
        raise NotFoundError(f"No tenant {slug!r} is visible to you.", code="not_found")
    # "parent", "parent__parent", ...: every ancestor a tenant can have (the tree is at most MAX_TENANT_DEPTH deep).
    ancestor_paths = ["__".join(["parent"] * level) for level in range(1, MAX_TENANT_DEPTH)]
    queryset = Tenant.objects.select_related(ancestor_paths[-1])
    annotations: dict[str, Any] = {
        f"flavor_{position}_exists": Exists(ResourceFlavor.objects.filter(name=name))
        for position, name in enumerate(flavors)
    }
    submit_roles = [MembershipRole.MEMBER, MembershipRole.TENANT_ADMIN]
    if user is not None:
        on_chain = Q(tenant=OuterRef("pk"))
        for path in ancestor_paths:
            on_chain |= Q(tenant=OuterRef(path))
        roles = Membership.objects.filter(on_chain, user=user)
        annotations["holds_role"] = Exists(roles)
        annotations["may_submit"] = Exists(roles.filter(role__in=submit_roles))
    if slug is None:
        if user is None:
            raise DomainError("tenant: say which tenant the job belongs to.", code="invalid_job_spec", field="tenant")
        queryset = queryset.filter(memberships__user=user, memberships__role__in=submit_roles)
    else:
        queryset = queryset.filter(slug=slug)
    rows = list(queryset.annotate(**annotations)[:2])

    if flavors and not (rows and all(getattr(rows[0], name) for name in annotations if name.startswith("flavor_"))):
        # Only a refused spec pays for this second read: the message lists the flavors that exist.
        check_flavors(flavors, set(ResourceFlavor.objects.values_list("name", flat=True)))
    if slug is None:
        if len(rows) != 1:
            raise DomainError(
                'tenant: you belong to several tenants (or none that may submit); name one with "tenant": "<slug>".',
                code="invalid_job_spec",
                field="tenant",
            )
        return rows[0]
    tenant = rows[0] if rows else None
    if user is None:
        if tenant is None:
            raise NotFoundError(f"No tenant {slug!r} is visible to you.", code="not_found")
        return tenant
    if tenant is None or not (tenant.holds_role or access.sees_all_tenants(user)):
        raise NotFoundError(f"No tenant {slug!r} is visible to you.", code="not_found")
    if not tenant.may_submit:
        raise PermissionDeniedError(
            f"You may not submit jobs to {slug}: members and tenant admins may; ask a tenant admin for the member role."
        )
    return tenant


APPROVAL_MESSAGE = "Waiting for approval by an administrator."


def _admission(*, tenant: Any, parsed: JobSpec) -> tuple[str, str, str]:
    """(state, reason, message) a new job enters with: ``pending_approval`` when the tenants app's rule asks
    for an approval (priority critical, or larger than the tenant's threshold), else ``queued``."""
    from tenants.services.admissions import job_admission_needs_approval

    if job_admission_needs_approval(
        tenant=tenant, total_millis=parsed.total_millis, priority_class=parsed.priority_class
    ):
        return S.PENDING_APPROVAL, "approval_required", APPROVAL_MESSAGE
    return S.QUEUED, "submitted", ""


def _new_job(
    *,
    parsed: JobSpec,
    tenant: Any,
    submitter: Any | None,
    state: str,
    message: str,
    now: datetime,
    env: dict[str, str] | None = None,
    array_id: uuid.UUID | None = None,
    array_index: int | None = None,
) -> Job:
    """An unsaved job as ``parsed`` describes it, already in its first state after ``submitted``."""
    return Job(
        tenant=tenant,
        submitter=submitter,
        name=parsed.name,
        kind=parsed.kind,
        priority_class=parsed.priority_class,
        preemptible=parsed.preemptible,
        replicas=parsed.replicas,
        min_replicas=parsed.min_replicas,
        max_replicas=parsed.max_replicas,
        flavors=list(parsed.flavors),
        millis_per_replica=parsed.millis_per_replica,
        memory_mib_per_replica=parsed.memory_mib_per_replica,
        cpu_millicores_per_replica=parsed.cpu_millicores_per_replica,
        host_memory_mib_per_replica=parsed.host_memory_mib_per_replica,
        topology=parsed.topology,
        node_selector=parsed.node_selector,
        command=parsed.command,
        env=parsed.env if env is None else env,
        working_dir=parsed.working_dir,
        max_runtime_s=parsed.max_runtime_s,
        checkpoint_dir=parsed.checkpoint_dir,
        runtime_estimate_s=parsed.runtime_estimate_s,
        spec={**parsed.normalised, "tenant": tenant.slug},
        state=state,
        state_message=message,
        queued_at=now if state == S.QUEUED else None,
        array_id=array_id,
        array_index=array_index,
    )


def _submit_events(job: Job, *, reason: str, message: str) -> list[JobEvent]:
    """The history a submit leaves, as if the job had moved ``submitted`` → its state through
    ``job_transition``: the console shows the same two events."""
    return [
        JobEvent(job=job, from_state="", to_state=S.SUBMITTED, reason="submitted", actor=job.submitter, details={}),
        JobEvent(
            job=job,
            from_state=S.SUBMITTED,
            to_state=job.state,
            reason=reason,
            message=message,
            actor=job.submitter,
            details={},
        ),
    ]


def _mark_loaded(job: Job, name: str, rows: list) -> None:
    """Give ``job.<name>`` the rows it has (what ``prefetch_related`` does after its query), so the job just
    created is serialized without reading back what was written."""
    queryset = getattr(job, name).all()
    queryset._result_cache = rows
    queryset._prefetch_done = True
    job.__dict__.setdefault("_prefetched_objects_cache", {})[name] = queryset


@transaction.atomic
def job_submit(*, actor: Any | None, spec: dict, request: Any | None = None, idempotency_key: str = "") -> Job:
    """Validate ``spec``, create the job and queue it (or hold it for approval). ``actor`` None = system.
    ``idempotency_key`` is stored on the job (``scheduler.idempotency`` answers a retried submit with it).

    The hot path of admission, a handful of statements in all: one query resolves the tenant, the actor's
    role and the flavors; the job is inserted already ``queued`` (or ``pending_approval``) with its two
    events in one insert; one audit record ``job.submit`` says the state it entered. The job returned has its
    events and (no) allocations loaded, ready to serialize.
    """
    parsed = validate_job_spec(spec, check_flavor_names=False)
    if parsed.array_count is not None:
        raise JobSpecError(
            'array: submit job arrays through POST /api/v1/jobs/; here remove "array" to submit one job.', field="array"
        )
    tenant = _resolve_tenant(actor=actor, slug=parsed.tenant_slug, flavors=parsed.flavors)
    check_checkpoint_dir(parsed.checkpoint_dir, tenant_slug=tenant.slug)
    state, reason, message = _admission(tenant=tenant, parsed=parsed)
    submitter = actor if getattr(actor, "pk", None) else None
    job = _new_job(parsed=parsed, tenant=tenant, submitter=submitter, state=state, message=message, now=timezone.now())
    job.idempotency_key = idempotency_key
    job.save(force_insert=True)
    events = JobEvent.objects.bulk_create(_submit_events(job, reason=reason, message=message))
    audit_record(
        action="job.submit",
        actor=actor,
        tenant=tenant,
        target=f"job:{job.pk}",
        details={"after": {**job.spec, "state": state}, "reason": reason},
        request=request,
    )
    if state == S.PENDING_APPROVAL:
        from tenants.services.admissions import job_admission_request_create

        job_admission_request_create(job=job, actor=actor)
    transaction.on_commit(request_cycle)
    _mark_loaded(job, "events", events)
    _mark_loaded(job, "allocations", [])
    return job


#: Rows per INSERT statement where an array's jobs are inserted by the ORM (databases other than PostgreSQL).
ARRAY_INSERT_BATCH = 2000


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


def _array_copies_insert(*, first: Job, count: int) -> list[int]:
    """Insert jobs 1..count-1 of an array as copies of ``first`` (job 0, saved), each with its ``array_index``
    and ``GPUPOOL_ARRAY_INDEX``; return the ids of all ``count`` jobs in index order.

    On PostgreSQL one ``INSERT … SELECT`` over ``generate_series`` copies the row inside the database: 10,000
    jobs take about 0.2 s there, where building and binding 10,000 model instances takes seconds of Python.
    Other databases (the embedded SQLite demo) get the same rows from ``bulk_create``.
    """
    if count == 1:
        return [first.pk]
    fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
    if connection.vendor != "postgresql":
        copies = []
        for index in range(1, count):
            copy = Job(**{f.attname: getattr(first, f.attname) for f in fields})
            copy.env = {**first.env, "GPUPOOL_ARRAY_INDEX": str(index)}
            copy.array_index = index
            copy.idempotency_key = ""
            copies.append(copy)
        Job.objects.bulk_create(copies, batch_size=ARRAY_INSERT_BATCH)
        return [first.pk, *(copy.pk for copy in copies)]
    quote = connection.ops.quote_name
    copied = {
        "env": "first.env || jsonb_build_object('GPUPOOL_ARRAY_INDEX', g.n::text)",
        "array_index": "g.n",
        # The key stays on job 0: it is unique per submitter.
        "idempotency_key": "''",
    }
    columns = ", ".join(quote(f.column) for f in fields)
    values = ", ".join(copied.get(f.name, f"first.{quote(f.column)}") for f in fields)
    table = quote(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) SELECT {values} FROM {table} AS first "
            "CROSS JOIN generate_series(1, %s) AS g(n) WHERE first.id = %s ORDER BY g.n RETURNING id, array_index",
            [count - 1, first.pk],
        )
        by_index = {index: pk for pk, index in cursor.fetchall()}
    return [first.pk, *(by_index[index] for index in range(1, count))]


def _array_events_insert(*, array_id: uuid.UUID, state: str, reason: str, message: str, now: datetime) -> None:
    """The two events of every job of an array (``_submit_events``: submitted, then its state), written by
    one ``INSERT … SELECT`` over the array's jobs instead of 2 x N model instances."""
    quote = connection.ops.quote_name
    empty_details = "CAST('{}' AS jsonb)" if connection.vendor == "postgresql" else "'{}'"
    created_at = JobEvent._meta.get_field("created_at").get_db_prep_value(now, connection)
    array_key = Job._meta.get_field("array_id").get_db_prep_value(array_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(JobEvent._meta.db_table)} "
            "(job_id, from_state, to_state, reason, message, actor_id, details, created_at) "
            f"SELECT job.id, step.from_state, step.to_state, step.reason, step.message, job.submitter_id, "
            f"{empty_details}, %s FROM {quote(Job._meta.db_table)} AS job CROSS JOIN "
            "(SELECT 1 AS n, '' AS from_state, %s AS to_state, 'submitted' AS reason, '' AS message "
            "UNION ALL SELECT 2, %s, %s, %s, %s) AS step "
            "WHERE job.array_id = %s ORDER BY job.id, step.n",
            [created_at, S.SUBMITTED, S.SUBMITTED, state, reason[:40], message[:500], array_key],
        )


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
        raise JobSpecError('array: say how many jobs to create, e.g. "array": {"count": 100}.', field="array")
    tenant = _resolve_tenant(actor=actor, slug=parsed.tenant_slug, flavors=parsed.flavors)
    check_checkpoint_dir(parsed.checkpoint_dir, tenant_slug=tenant.slug)
    state, reason, message = _admission(tenant=tenant, parsed=parsed)
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
    first = _new_job(
        parsed=parsed,
        tenant=tenant,
        submitter=submitter,
        state=state,
        message=message,
        now=now,
        env={**parsed.env, **array_env},
        array_id=array_id,
        array_index=0,
    )
    first.idempotency_key = idempotency_key
    first.save(force_insert=True)
    job_ids = _array_copies_insert(first=first, count=count)
    _array_events_insert(array_id=array_id, state=state, reason=reason, message=message, now=now)
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
        raise NotFoundError(f"No job array {array_id}.")
    # One tenant and one submitter for the whole array: who may cancel one job may cancel them all.
    if actor is not None and not access.can_manage_job(actor, jobs[0]):
        raise PermissionDeniedError("Only the submitter, a tenant admin or a system admin may cancel this array.")
    waiting_states = (S.SUBMITTED, S.PENDING_APPROVAL, S.QUEUED)
    waiting = [job for job in jobs if job.state in waiting_states]
    placed = [job for job in jobs if job.state not in FINAL_JOB_STATES and job.state not in waiting_states]
    message = (reason or "Cancelled.")[:500]
    now = timezone.now()
    if waiting:
        Job.objects.filter(pk__in=[job.pk for job in waiting]).update(
            state=S.CANCELLED,
            state_message=message,
            finished_at=now,
            updated_at=now,
            pending_reason_code="",
            pending_message="",
            position_in_tenant=None,
            position_overall=None,
        )
        user = actor if getattr(actor, "pk", None) else None
        JobEvent.objects.bulk_create(
            [
                JobEvent(
                    job=job,
                    from_state=job.state,
                    to_state=S.CANCELLED,
                    reason="cancelled",
                    message=message,
                    actor=user,
                    details={"array": str(array_id)},
                )
                for job in waiting
            ],
            batch_size=ARRAY_INSERT_BATCH,
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


@transaction.atomic
def job_cancel(*, job: Job, actor: Any | None, reason: str = "", request: Any | None = None) -> Job:
    """Cancel a job in any non-final state: running replicas get ``workload.stop``, allocations end now."""
    job = _lock_job(job)
    if actor is not None and not access.can_manage_job(actor, job):
        raise PermissionDeniedError("Only the submitter, a tenant admin or a system admin may cancel this job.")
    if job.state in FINAL_JOB_STATES:
        raise ConflictError(f"Job {job.pk} is already {job.state}; there is nothing to cancel.", code="job_finished")
    freed = Allocation.objects.active().filter(job=job).exists()
    outbox.stop_active_replicas(job=job, reason="cancelled")
    _end_allocations(Allocation.objects.filter(job=job))
    job_transition(
        job=job,
        to_state=S.CANCELLED,
        actor=actor,
        reason="cancelled",
        message=reason or "Cancelled.",
        request=request,
    )
    if freed:
        transaction.on_commit(request_cycle)
    return job


@transaction.atomic
def job_release_from_approval(*, job: Job, actor: Any | None) -> Job:
    """An approved job leaves ``pending_approval`` for the queue (called by the tenants approval flow)."""
    job = _lock_job(job)
    if job.state != S.PENDING_APPROVAL:
        raise ConflictError(f"Job {job.pk} is {job.state}, not waiting for approval.", code="invalid_transition")
    job_transition(job=job, to_state=S.QUEUED, actor=actor, reason="approved", message="Approved.")
    transaction.on_commit(request_cycle)
    return job


@transaction.atomic
def job_reject_from_approval(*, job: Job, actor: Any | None, comment: str = "") -> Job:
    """A rejected job fails with the approver's comment (called by the tenants approval flow)."""
    job = _lock_job(job)
    if job.state != S.PENDING_APPROVAL:
        raise ConflictError(f"Job {job.pk} is {job.state}, not waiting for approval.", code="invalid_transition")
    return job_transition(
        job=job, to_state=S.FAILED, actor=actor, reason="rejected", message=f"Rejected: {comment}"[:500]
    )


# --- reports from agents ------------------------------------------------------------------------------


def _requeue(job: Job, *, reason: str, message: str) -> None:
    """Back to the queue (resuming from its checkpoint when it has one)."""
    suffix = " It resumes from its last checkpoint." if job.last_checkpoint_at else ""
    job_transition(job=job, to_state=S.QUEUED, actor=None, reason=reason, message=message + suffix)


@transaction.atomic
def workload_status_report(
    *,
    node: Node,
    job_id: int,
    replica: int,
    state: str,
    exit_code: int | None,
    last_checkpoint_at: datetime | None,
    message: str = "",
    log_tail: str = "",
    reason: str = "",
    command_id: int = 0,
) -> str:
    """Apply an agent's ``workload.status`` for one replica; idempotent (a repeated report changes nothing).

    ``reason`` is the agent's cause of a final state when it knows one (``oom_killed``, ``sandbox_failed``,
    ``rejected``); a failed job's transition carries it instead of the bare ``failed``. A replica ``stopped`` with
    reason ``fenced`` (its agent lost the portal and stopped it) requeues the job, as a lost node does.

    ``command_id`` is the ``workload.start`` of the run the report is about (0 from agents before it): a report on
    an earlier run of the replica on this node — a late or repeated one, after the job was requeued and placed
    here again — is ``stale_run`` and changes nothing (before, its ``stopped`` failed the new run).

    Returns what it came to: ``applied`` (the report was for the run the node holds; it may still have changed
    nothing, e.g. a second ``succeeded``), or why it was ignored: ``unknown_job``, ``not_held`` (the node never
    held the job), ``stale_run``, ``not_allocated`` (the node no longer holds that replica). A workload still
    running that is not the node's to run is told to stop in each of those cases.
    """
    # The job row only, FOR NO KEY UPDATE (project lock order: Job before Allocation and Node rows).
    job = Job.objects.select_for_update(of=("self",), no_key=True).select_related("tenant").filter(pk=job_id).first()
    if job is None:
        logger.warning("workload.status for unknown job %s from node %s", job_id, node.pk)
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=None, job_id=job_id, replica=replica, reason="unknown_job")
        return "unknown_job"
    if not Allocation.objects.filter(job=job, node=node).exists():
        # Only a node the job ran on may report on it: another node's agent (or a stolen credential) must not
        # fail, finish or move the checkpoint of a job it never held. Its own copy is stopped: nothing runs
        # on a node that the portal did not place there.
        logger.warning("workload.status for job %s from node %s, which never held it: ignored", job_id, node.pk)
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=job, job_id=job_id, replica=replica, reason="not_allocated")
        return "not_held"
    if command_id and command_id < _current_start_id(job=job, node=node, replica=replica):
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=job, job_id=job_id, replica=replica, reason="superseded")
        return "stale_run"
    if last_checkpoint_at is not None and (
        job.last_checkpoint_at is None or last_checkpoint_at > job.last_checkpoint_at
    ):
        job.last_checkpoint_at = last_checkpoint_at
        job.save(update_fields=["last_checkpoint_at", "updated_at"])
    replica_allocations = Allocation.objects.active().filter(job=job, replica=replica, node=node)
    if not replica_allocations.exists():
        # A run this node holds no devices for any more: the job was requeued (the node was declared lost, or a
        # stop timed out) while this copy went on. Its report must not finish, fail or move the job, whose
        # current run is elsewhere; a copy still running is told to stop, so the job never runs twice.
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=job, job_id=job_id, replica=replica, reason="not_allocated")
        return "not_allocated"
    details = {"replica": replica, "node": node.name, "exit_code": exit_code}
    if log_tail:
        details["log_tail"] = log_tail[-2000:]
    text = message[:300]

    if state in ("starting", "checkpointed"):
        return "applied"
    if state == "stopped" and replica in (job.scaling_down_replicas or []):
        _scale_down_replica_stopped(job=job, replica=replica, node=node)
        return "applied"
    if state == "running":
        if job.state == S.ADMITTED and replica_allocations.exists():
            job_transition(job=job, to_state=S.RUNNING, actor=None, reason="running", message=text, details=details)
        return "applied"

    freed = _end_allocations(replica_allocations) > 0
    if freed:
        transaction.on_commit(request_cycle)
    if job.state not in ACTIVE_JOB_STATES:
        return "applied"  # already cancelled, requeued or finished: the report only confirms the stop
    remaining = Allocation.objects.active().filter(job=job)

    if state == "succeeded":
        if not remaining.exists():
            job.exit_code = exit_code
            job.save(update_fields=["exit_code"])
            job_transition(job=job, to_state=S.SUCCEEDED, actor=None, reason="succeeded", message=text, details=details)
    elif state == "stopped" and reason == protocol.FENCED and job.state != S.PREEMPTING:
        # The node's agent lost the portal and stopped the job itself (fencing), before the grace period would
        # have moved it: not the job's failure. Like a lost node: the gang's other members stop, and it resumes
        # from its checkpoint wherever it is placed next.
        outbox.stop_active_replicas(job=job, reason="gang_member_fenced")
        _end_allocations(remaining)
        why = f"Node {node.name} lost contact with the portal, and its agent stopped the job there (fencing)."
        job_transition(job=job, to_state=S.NODE_LOST, actor=None, reason="fenced", message=why, details=details)
        _requeue(job, reason="fenced", message=f"{why.removesuffix('.')}; requeued.")
    elif state == "failed" or (state == "stopped" and job.state != S.PREEMPTING):
        # A gang cannot go on without one of its members: stop the others and fail the job.
        outbox.stop_active_replicas(job=job, reason="gang_member_failed")
        _end_allocations(remaining)
        job.exit_code = exit_code
        job.save(update_fields=["exit_code"])
        why = text or (
            f"replica {replica} exited with code {exit_code}" if exit_code is not None else "replica stopped"
        )
        cause = reason[:32] if state == "failed" and reason else state
        job_transition(job=job, to_state=S.FAILED, actor=None, reason=cause, message=why, details=details)
    elif state == "stopped":
        if not remaining.exists():
            _requeue(job, reason="preempted", message="Preempted and requeued.")
    elif state == "lost":
        outbox.stop_active_replicas(job=job, reason="gang_member_lost")
        _end_allocations(remaining)
        job_transition(
            job=job, to_state=S.NODE_LOST, actor=None, reason="lost", message=text or "Workload lost.", details=details
        )
        _requeue(job, reason="lost", message="The workload was lost; requeued.")
    else:
        logger.warning("unknown workload state %r for job %s", state, job_id)
    return "applied"


def _current_start_id(*, job: Job, node: Node, replica: int) -> int:
    """The id of the newest ``workload.start`` of ``job``'s ``replica`` on ``node`` (its latest run there), or 0."""
    starts = AgentCommand.objects.filter(job=job, node=node, command_type="workload.start", payload__replica=replica)
    return starts.order_by("-pk").values_list("pk", flat=True).first() or 0


def _stop_stray_copy(*, node: Node, job: Job | None, job_id: int, replica: int, reason: str) -> None:
    """Tell ``node`` to stop its copy of ``job_id``/``replica`` unless a stop for it is already on its way."""
    pending = AgentCommand.objects.unacked().filter(
        node=node, command_type="workload.stop", payload__job_id=job_id, payload__replica=replica
    )
    if pending.exists():
        return
    logger.warning("node %s runs job %s replica %s, which is not its to run: stopping it", node.name, job_id, replica)
    if job is not None:
        outbox.workload_stop_create(job=job, replica=replica, node_id=node.pk, reason=reason)
    else:  # no job row to point at (a job the portal does not know)
        stop = protocol.WorkloadStop(command_id=0, job_id=job_id, replica=replica, reason=reason)
        outbox.commands_bulk_create([(node.pk, None, stop)])


@transaction.atomic
def node_jobs_requeue(
    *, node: Node, reason: str = "node_lost", job_ids: Collection[int] | None = None, message: str = ""
) -> int:
    """Every job with an active allocation on ``node`` loses all its allocations and goes back to the queue.

    Replicas on other nodes are told to stop (a gang cannot go on without its lost members), and so are the
    lost node's own: a node declared lost may only be cut off (or too slow to heartbeat), and the stop waits in
    the outbox until its agent is heard from again, so the old copy never runs beside the requeued one.
    ``job_ids`` limits it to those jobs (a reconnected agent that no longer has them); ``message`` replaces
    "Node <name> was lost." in the job's history. Returns the number of jobs requeued.
    """
    held = Allocation.objects.active().filter(node=node)
    if job_ids is not None:
        held = held.filter(job_id__in=list(job_ids))
    job_ids = sorted(set(held.values_list("job_id", flat=True)))
    why = message or f"Node {node.name} was lost."
    count = 0
    for job_id in job_ids:
        job = _lock_job(job_id)
        replicas = Allocation.objects.active().filter(job=job)
        for replica, node_id in replicas.values_list("replica", "node_id").distinct().order_by("replica", "node_id"):
            outbox.workload_stop_create(job=job, replica=replica, node_id=node_id, reason=reason)
        _end_allocations(Allocation.objects.filter(job=job))
        if job.state in ACTIVE_JOB_STATES:
            job_transition(job=job, to_state=S.NODE_LOST, actor=None, reason=reason, message=why)
            _requeue(job, reason=reason, message=f"{why.removesuffix('.')}; requeued.")
            count += 1
    if job_ids:
        transaction.on_commit(request_cycle)
    return count


# --- nodes and flavors (system admin) -----------------------------------------------------------------


def _require_system_admin(actor: Any | None) -> None:
    if actor is not None and not access.is_system_admin(actor):
        raise PermissionDeniedError("Only a system admin may change nodes and flavors.")


def _node_set_status(*, node: Node, actor: Any | None, status: str, action: str) -> Node:
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    before = node.status
    node.status = status
    node.save(update_fields=["status"])
    audit_record(
        action=action,
        actor=actor,
        target=f"node:{node.pk}",
        details={"before": {"status": before}, "after": {"status": status}, "node": node.name},
    )
    transaction.on_commit(request_cycle)
    return node


@transaction.atomic
def node_cordon(*, node: Node, actor: Any | None) -> Node:
    """No new work lands on the node; running work stays."""
    _require_system_admin(actor)
    return _node_set_status(node=node, actor=actor, status=NodeStatus.CORDONED, action="node.cordon")


@transaction.atomic
def node_drain(*, node: Node, actor: Any | None, grace_s: float = outbox.DEFAULT_STOP_GRACE_S) -> Node:
    """Cordon the node and ask every job on it to checkpoint and stop; they are requeued when stopped."""
    _require_system_admin(actor)
    node = _node_set_status(node=node, actor=actor, status=NodeStatus.DRAINING, action="node.drain")
    job_ids = sorted(set(Allocation.objects.active().filter(node=node).values_list("job_id", flat=True)))
    for job_id in job_ids:
        job = _lock_job(job_id)
        if job.state not in (S.ADMITTED, S.RUNNING):
            continue
        outbox.stop_active_replicas(job=job, grace_s=grace_s, reason="node_drain")
        job_transition(
            job=job, to_state=S.PREEMPTING, actor=actor, reason="node_drain", message=f"Node {node.name} is draining."
        )
    return node


@transaction.atomic
def node_uncordon(*, node: Node, actor: Any | None) -> Node:
    """Schedulable again: ``ready`` if its agent is alive (recent heartbeat), else ``not_ready``."""
    _require_system_admin(actor)
    lease_s = getattr(settings, "GPUPOOL_HEARTBEAT_INTERVAL_S", 5) * getattr(settings, "GPUPOOL_LEASE_MISSES", 3)
    alive = node.last_heartbeat_at is not None and node.last_heartbeat_at >= timezone.now() - timedelta(seconds=lease_s)
    status = NodeStatus.READY if alive else NodeStatus.NOT_READY
    return _node_set_status(node=node, actor=actor, status=status, action="node.uncordon")


@transaction.atomic
def flavor_create(
    *, actor: Any | None, name: str, vendor: str, model: str, memory_mib: int, description: str = ""
) -> ResourceFlavor:
    _require_system_admin(actor)
    if ResourceFlavor.objects.filter(name=name).exists():
        raise ConflictError(f"A flavor named {name!r} already exists.", code="duplicate")
    flavor = ResourceFlavor.objects.create(
        name=name, vendor=vendor, model=model, memory_mib=memory_mib, description=description
    )
    audit_record(
        action="flavor.create",
        actor=actor,
        target=f"flavor:{flavor.pk}",
        details={"after": {"name": name, "vendor": vendor, "model": model, "memory_mib": memory_mib}},
    )
    return flavor


# --- the cycle ----------------------------------------------------------------------------------------


def request_cycle() -> bool:
    """Ask for a scheduling cycle now; call it after the change is committed (``on_commit``).

    Sets the dirty flag, then queues a ``scheduler.cycle_requested`` task unless one is already claimed: that
    one sees the flag and runs another cycle when its current one ends, so a burst of requests costs one or two
    cycles, never one each, and no request waits for a timer. Returns whether this call queued the task.
    """
    # Redis (cache and broker) being down must not fail the caller: its change is committed already (a 500
    # here made clients retry a submit that had worked: a duplicated job), and beat runs a cycle every few
    # seconds anyway once Redis is back.
    try:
        cache.set(CYCLE_DIRTY_KEY, 1, timeout=None)
        if not cache.add(CYCLE_CLAIM_KEY, 1, timeout=CYCLE_CLAIM_TTL_S):
            return False
    except Exception:
        logger.warning("could not ask for a scheduling cycle: the cache is unreachable", exc_info=True)
        return False
    try:
        cycle_task_send()
    except Exception:
        logger.warning("could not queue a scheduling cycle", exc_info=True)
        with contextlib.suppress(Exception):
            cache.delete(CYCLE_CLAIM_KEY)
        return False
    return True


def cycle_task_send(*, queue: str | None = None) -> None:
    """Queue a ``scheduler.cycle_requested`` task (on ``queue``, else ``CYCLE_QUEUE``, else the default)."""
    from scheduler.tasks import cycle_requested  # here: the tasks module imports this one

    # apply_async, not send_task by name: GPUPOOL_CELERY_EAGER (scripts, some tests) then runs it inline.
    cycle_requested.apply_async(queue=queue or CYCLE_QUEUE)


@dataclass
class RequestedCycles:
    cycles: int = 0  # cycles run (those that found the lock busy for CYCLE_LOCK_WAIT_S are not counted)
    hand_over: bool = False  # still asked for after CYCLE_LOOP_MAX_S: the caller queues a fresh task


def run_requested_cycles(*, max_s: float = CYCLE_LOOP_MAX_S, lock_wait_s: float = CYCLE_LOCK_WAIT_S) -> RequestedCycles:
    """Run cycles for as long as they are asked for (``request_cycle``), one right after the other.

    The dirty flag is cleared before each cycle reads the pool, so a request made while a cycle runs is seen
    after it and gets a cycle of its own. Before returning, the claim is released and the flag looked at once
    more: a request that came in between (it found the claim still held, so queued nothing) is served here.
    """
    from time import monotonic

    deadline = monotonic() + max_s
    result = RequestedCycles()
    while True:
        cache.set(CYCLE_CLAIM_KEY, 1, timeout=CYCLE_CLAIM_TTL_S)  # renewed: this task is alive and looping
        cache.delete(CYCLE_DIRTY_KEY)
        try:
            ran = run_cycle(lock_wait_s=lock_wait_s).ran
        except BaseException:
            cache.set(CYCLE_DIRTY_KEY, 1, timeout=None)  # not served: the retry (or the next claimant) runs it
            raise
        if ran:
            result.cycles += 1
        else:  # another cycle held the lock all that time; it may have read the pool before the request
            cache.set(CYCLE_DIRTY_KEY, 1, timeout=None)
        if cache.get(CYCLE_DIRTY_KEY):
            if monotonic() < deadline:
                continue
            result.hand_over = True  # the claim stays held for the fresh task
            return result
        cache.delete(CYCLE_CLAIM_KEY)
        if cache.get(CYCLE_DIRTY_KEY) and cache.add(CYCLE_CLAIM_KEY, 1, timeout=CYCLE_CLAIM_TTL_S):
            continue
        return result


def cycle_claim_release() -> None:
    """Forget a claim a dead worker left behind and serve any request it left; a worker calls it as it starts
    (``portal.celery``), so a worker restart does not leave prompt cycles blocked for ``CYCLE_CLAIM_TTL_S``. With
    several workers this may leave two cycle tasks looping for a while: they take turns on the cycle lock."""
    try:
        cache.delete(CYCLE_CLAIM_KEY)
        if cache.get(CYCLE_DIRTY_KEY):
            request_cycle()
    except Exception:
        logger.warning("could not release the cycle claim: the cache is unreachable", exc_info=True)


@dataclass
class CycleResult:
    ran: bool
    placed: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    explained: int = 0
    skipped: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def run_cycle(*, hold_lock: bool = True, now: datetime | None = None, lock_wait_s: float = 0.0) -> CycleResult:
    """One scheduling cycle: snapshot → ``scheduler.core.plan`` → persist, in one transaction.

    With ``hold_lock`` (always, except in tests that race the persist step on purpose) it takes the cycle lock,
    waiting up to ``lock_wait_s`` for it, and returns ``ran=False`` when another worker holds it all that time.
    ``stats`` has the plan's figures and the seconds each step took (``snapshot_s``, ``plan_s``, ``persist_s``).
    """
    from contextlib import nullcontext
    from time import perf_counter, time

    from scheduler import eta, locks, persist, snapshot

    lock = locks.cycle_lock(wait_s=lock_wait_s) if hold_lock else nullcontext(True)
    with transaction.atomic(), lock as acquired:
        if not acquired:
            return CycleResult(ran=False)
        try:  # a figure for monitoring: never a reason to fail the cycle
            cache.set(CYCLE_STARTED_KEY, time(), timeout=None)
        except Exception:
            logger.warning("could not record the start of a scheduling cycle: the cache is unreachable")
        started = perf_counter()
        stored: dict[int, tuple] = {}
        snap = snapshot.build_snapshot(
            now=now, previous_usage=cache.get(snapshot.USAGE_CACHE_KEY), stored_explanations=stored
        )
        planning = perf_counter()
        plan = snapshot.plan_for(snap)
        persisting = perf_counter()
        outcome = persist.persist_plan(plan, now=now, stored_explanations=stored)
        done = perf_counter()
        # Kept for the next cycle's decay; losing it (cache flush) only restarts the average.
        record = {"at": snap.now, "usage": {t: dict(f) for t, f in snap.usage.items()}}
        transaction.on_commit(lambda: cache.set(snapshot.USAGE_CACHE_KEY, record, timeout=7 * 24 * 3600))
        if len(outcome.placed) + len(outcome.preempted) >= settings.GPUPOOL_ETA_CHANGE_JOBS:
            transaction.on_commit(eta.estimates_refresh_request)  # the queue moved: new start-time estimates
        return CycleResult(
            ran=True,
            placed=outcome.placed,
            preempted=outcome.preempted,
            explained=outcome.explained,
            skipped=outcome.skipped,
            stats={
                **plan.stats,
                "snapshot_s": round(planning - started, 4),
                "plan_s": round(persisting - planning, 4),
                "persist_s": round(done - persisting, 4),
            },
        )


def jobs_awaiting_stop_sweep(*, older_than_s: float = 300.0) -> int:
    """Requeue preempting jobs whose agents never confirmed the stop (e.g. a silent node) after a timeout."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    stale = list(
        Job.objects.filter(state=S.PREEMPTING, updated_at__lt=cutoff).filter(~Q(allocations__isnull=True)).distinct()
    )
    count = 0
    for job in stale:
        with transaction.atomic():
            locked = _lock_job(job.pk)
            if locked.state != S.PREEMPTING:
                continue
            _end_allocations(Allocation.objects.filter(job=locked))
            _requeue(locked, reason="stop_timeout", message="The node did not confirm the stop in time; requeued.")
            count += 1
    return count + _scale_down_stop_sweep(cutoff=cutoff)


def _scale_down_stop_sweep(*, cutoff: datetime) -> int:
    """Replicas stopped for a scale-down whose stop was never confirmed: treated as stopped after the timeout,
    as preempted jobs are, so the service's capacity does not stay in limbo."""
    stale = Job.objects.filter(
        kind=JobKind.INFERENCE, state__in=[S.ADMITTED, S.RUNNING], updated_at__lt=cutoff
    ).exclude(scaling_down_replicas=[])
    count = 0
    for pk in stale.values_list("pk", flat=True):
        with transaction.atomic():
            job = _lock_job(pk)
            for replica in list(job.scaling_down_replicas):
                nodes = Allocation.objects.active().filter(job=job, replica=replica).values_list("node_id", flat=True)
                for node in Node.objects.filter(pk__in=set(nodes)).order_by("pk"):
                    _scale_down_replica_stopped(job=job, replica=replica, node=node)
            if job.scaling_down_replicas:  # replicas whose allocations had already ended
                job.scaling_down_replicas = []
                job.save(update_fields=["scaling_down_replicas", "updated_at"])
            count += 1
    return count


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
    job = _lock_job(job)
    if actor is not None and not access.can_manage_job(actor, job):
        raise PermissionDeniedError("Only the submitter, a tenant admin or a system admin may scale this job.")
    if job.kind != JobKind.INFERENCE:
        raise DomainError(f"Job {job.pk} is a {job.kind} job; only inference services scale.", code="not_scalable")
    if job.state not in ACTIVE_JOB_STATES and job.state not in PENDING_JOB_STATES:
        raise ConflictError(f"Job {job.pk} is {job.state}; there is nothing to scale.", code="job_finished")
    least, most = replica_bounds(job)
    if not least <= replicas <= most:
        raise DomainError(
            f"replicas: must be between min_replicas ({least}) and max_replicas ({most}); "
            "submit the service with a larger max_replicas to scale further.",
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
    job = _lock_job(job)
    if actor is not None and not access.can_manage_job(actor, job):
        raise PermissionDeniedError("Only the submitter, a tenant admin or a system admin may report its load.")
    if load < 0 or math.isnan(load) or math.isinf(load):
        raise DomainError("load: must be a number >= 0 (1.0 = every replica saturated).", code="invalid_load")
    if job.kind != JobKind.INFERENCE:
        raise DomainError(f"Job {job.pk} is a {job.kind} job; only inference services scale.", code="not_scalable")
    least, most = replica_bounds(job)
    running = len(_running_replicas(job)) or job.replicas
    wanted = desired_replicas(running=running, load=load, least=least, most=most)
    if wanted == job.replicas:
        return job
    return job_scale(job=job, replicas=wanted, actor=actor, reason=f"load {load:.2f} per replica", request=request)


def _scale_down_replica_stopped(*, job: Job, replica: int, node: Node) -> None:
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
    _end_allocations(Allocation.objects.filter(pk__in=[row.pk for row in rows]), now=now)
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


def reservations_release(*, job: Job) -> int:
    """Delete every reservation of ``job`` (the caller's transaction). Work that borrowed them keeps running
    as ordinary allocations, on capacity the release has just freed. Returns the rows deleted."""
    deleted, _ = InferenceReservation.objects.filter(job=job).delete()
    if deleted:
        Allocation.objects.active().filter(reservation_of=job).update(reservation_of=None)
    return deleted
