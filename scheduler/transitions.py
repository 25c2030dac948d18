"""Job state changes, the one module that writes a job's state (``tests/scheduler/test_one_state_writer.py``
holds every other module to it): the allowed transitions; ``jobs_transition``, the bulk form (many jobs' rows,
their ``JobEvent`` rows and audit records in a few statements) and ``job_transition``, its case of one job;
``job_create`` and ``job_array_create`` for jobs born past ``submitted``; ending allocations, requeueing, and
releasing an inference service's reservations.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from audit.services import audit_record
from kernel.api import ConflictError, NotFoundError
from kernel.db.bulk import insert_instance_with_children, insert_instances, insert_rows, update_instance, update_rows
from scheduler import messages as scheduler_messages
from scheduler.fleet import outbox
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


@dataclass
class JobMove:
    """One job's move to ``to_state`` for ``jobs_transition``. ``also_save``: fields the caller changed on
    ``job``, written by the same UPDATE as the state."""

    job: Job
    to_state: str
    reason: str = ""
    message: str = ""
    details: dict = field(default_factory=dict)
    also_save: Iterable[str] = ()


#: A ``JobEvent`` that records no move (``from_state == to_state``: a service scaling up), written by
#: ``jobs_transition`` in the same INSERT as the moves' events: ``(job_id, state, reason, message, details)``.
JobNote = tuple[int, str, str, str, dict]

_EVENT_COLUMNS = ("job_id", "from_state", "to_state", "reason", "message", "actor_id", "details", "created_at")


def _refuse_illegal(moves: Sequence[JobMove]) -> None:
    """Raise before anything changes when one of ``moves`` is not an allowed transition."""
    for move in moves:
        if move.to_state not in ALLOWED_TRANSITIONS.get(move.job.state, frozenset()):
            raise ConflictError(
                scheduler_messages.JOB_CANNOT_BECOME(pk=move.job.pk, state=move.job.state, to_state=move.to_state),
                code="invalid_transition",
            )


def _apply(move: JobMove, *, now: datetime) -> set[str]:
    """Set on ``move.job`` what its new state implies (timestamps, the pending explanation cleared, the state
    message) and return the fields that changed."""
    job, to_state, message = move.job, move.to_state, move.message
    job.state = to_state
    job.updated_at = now
    update = {"state", "updated_at", *move.also_save}
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
    return update


def _rows_update(changed: Sequence[tuple[Job, set[str]]]) -> None:
    """The moved jobs' rows: one UPDATE per set of changed fields (usually one for the whole batch). A value all
    rows share is a parameter of the SET clause; only values that differ travel per row."""
    groups: dict[tuple[str, ...], list[Job]] = defaultdict(list)
    for job, fields in changed:
        groups[tuple(sorted(fields))].append(job)
    quote = connection.ops.quote_name
    for names, jobs in groups.items():
        columns: list[tuple[str, str]] = [("id", "bigint")]
        varying: list[list[Any]] = []
        assignments, params = [], []
        for name in names:
            model_field = Job._meta.get_field(name)
            values = [getattr(job, model_field.attname) for job in jobs]
            if all(value == values[0] for value in values):
                assignments.append(f"{quote(model_field.column)} = %s")
                params.append(model_field.get_db_prep_save(values[0], connection))
            else:
                columns.append((f"v_{name}", model_field.cast_db_type(connection)))
                assignments.append(f"{quote(model_field.column)} = v.v_{name}")
                varying.append([model_field.get_db_prep_save(value, connection) for value in values])
        update_rows(
            Job,
            columns=columns,
            rows=[(job.pk, *(column[index] for column in varying)) for index, job in enumerate(jobs)],
            set_sql=", ".join(assignments),
            set_params=params,
        )


def jobs_transition(
    *,
    moves: Sequence[JobMove],
    actor: Any | None,
    request: Any | None = None,
    now: datetime | None = None,
    audit: bool = True,
    notes: Sequence[JobNote] = (),
) -> None:
    """Move every job of ``moves`` (rows locked by the caller) in a few statements, whatever their number;
    refuses the whole batch, before changing anything, when one move is not allowed.

    Writes, in the caller's transaction: the rows (one UPDATE per set of changed fields), the ``JobEvent`` rows
    (one INSERT, ``notes`` included), and one audit record per move (``audit_record`` buffers them to the
    commit; ``audit=False`` where the caller records the batch as one act, as an array cancel does). A single
    move writes what ``job_transition`` always has (one UPDATE, one INSERT); more use ``kernel.db.bulk``'s
    statements for many rows.
    """
    if not moves and not notes:
        return
    _refuse_illegal(moves)
    now = now or timezone.now()
    from_states = [move.job.state for move in moves]
    changed = [(move.job, _apply(move, now=now)) for move in moves]
    user_id = actor.pk if getattr(actor, "pk", None) else None
    single = len(moves) == 1 and not notes
    if single and moves[0].job.pk is None:
        moves[0].job.save()
    elif single:
        update_instance(*changed[0])  # one plain UPDATE: Model.save composed it anew on every transition
    else:
        _rows_update(changed)
    leaving = [m.job.pk for m in moves if m.to_state not in ACTIVE_JOB_STATES and m.job.kind == JobKind.INFERENCE]
    if leaving:
        # Requeued, finished or cancelled: a service keeps no idle capacity (a new placement reserves anew).
        _reservations_release(leaving)
    events = [
        (m.job.pk, str(before), str(m.to_state), m.reason[:40], m.message[:500], user_id, m.details or {}, now)
        for m, before in zip(moves, from_states, strict=True)
    ]
    events += [
        (job_id, str(state), str(state), reason[:40], message[:500], user_id, details, now)
        for job_id, state, reason, message, details in notes
    ]
    if single:
        insert_instances([JobEvent(**dict(zip(_EVENT_COLUMNS, events[0], strict=True)))])
    else:
        insert_rows(JobEvent, _EVENT_COLUMNS, events)
    if not audit:
        return
    for move, from_state in zip(moves, from_states, strict=True):
        audit_record(
            action=TRANSITION_AUDIT_ACTIONS.get(move.to_state, "job.transition"),
            actor=actor,
            tenant=move.job.tenant_id,  # the id is all the record takes: the tenant row need not be loaded
            target=f"job:{move.job.pk}",
            details={
                "before": {"state": from_state},
                "after": {"state": move.to_state},
                "reason": move.reason,
                **(move.details or {}),
            },
            request=request,
        )


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

    ``jobs_transition`` of one job: the JobEvent and the audit record in the same transaction, the timestamps
    and the pending explanation kept consistent with the new state. ``also_save``: fields the caller changed on
    ``job``, written by the same UPDATE as the state (one statement instead of two).
    """
    move = JobMove(
        job=job, to_state=to_state, reason=reason, message=message, details=details or {}, also_save=also_save
    )
    jobs_transition(moves=[move], actor=actor, request=request)
    return job


# --- jobs born past submitted --------------------------------------------------------------------------

#: Rows per INSERT statement where an array's jobs are inserted by the ORM (databases other than PostgreSQL).
ARRAY_INSERT_BATCH = 2000


def _born(job: Job, *, to_state: str, message: str, now: datetime) -> None:
    """Set on the unsaved ``job`` its first state after ``submitted``, checked like any move."""
    if to_state not in ALLOWED_TRANSITIONS[S.SUBMITTED] or to_state in FINAL_JOB_STATES:
        raise ConflictError(scheduler_messages.NEW_JOB_CANNOT_START(to_state=to_state), code="invalid_transition")
    job.state = to_state
    job.state_message = message
    job.queued_at = now if to_state == S.QUEUED else None


def job_create(*, job: Job, to_state: str, reason: str, message: str, now: datetime) -> list[JobEvent]:
    """Insert the unsaved ``job`` already in ``to_state`` (``queued`` or ``pending_approval``) with the history
    it would have had moving ``submitted`` → ``to_state`` through ``job_transition`` (the console shows the same
    two events): the row and its events in one statement on PostgreSQL. Returns the events. The caller writes
    the audit record of the submit (``job.submit``: one act, not two transitions)."""
    _born(job, to_state=to_state, message=message, now=now)
    events = [
        JobEvent(job=job, from_state="", to_state=S.SUBMITTED, reason="submitted", actor=job.submitter, details={}),
        JobEvent(
            job=job,
            from_state=S.SUBMITTED,
            to_state=to_state,
            reason=reason,
            message=message,
            actor=job.submitter,
            details={},
        ),
    ]
    insert_instance_with_children(job, events, link="job_id")
    return events


def job_array_create(*, first: Job, count: int, to_state: str, reason: str, message: str, now: datetime) -> list[int]:
    """Insert an array's ``count`` jobs already in ``to_state``: the unsaved ``first`` (job 0), its copies
    (``_array_copies_insert``), every job's two events (``job_create``'s): three statements whatever the count.
    Returns the ids in index order. The caller writes the array's one audit record."""
    _born(first, to_state=to_state, message=message, now=now)
    first.save(force_insert=True)
    job_ids = _array_copies_insert(first=first, count=count)
    _array_events_insert(array_id=first.array_id, state=to_state, reason=reason, message=message, now=now)
    return job_ids


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
    """The two events of every job of an array (``job_create``'s: submitted, then its state), written by
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


# --- locks, allocations ------------------------------------------------------------------------------


def job_lock_for_update(job: Job | int) -> Job:
    pk = job if isinstance(job, int) else job.pk
    try:
        # The job row only (FOR NO KEY UPDATE): locking the tenant row too made every transaction of the tenant
        # wait on it, and FOR UPDATE would block the foreign-key checks (FOR KEY SHARE) of concurrent inserts.
        return Job.objects.select_for_update(of=("self",), no_key=True).select_related("tenant").get(pk=pk)
    except Job.DoesNotExist:
        raise NotFoundError(scheduler_messages.NO_JOB_ID(pk=pk)) from None


def allocations_end(queryset, *, now: datetime | None = None) -> int:
    """End the active allocations of ``queryset`` (one job's) and withdraw the starts of their runs that no agent
    acknowledged yet, so a cut-off node that reconnects never starts a run that has ended."""
    active = queryset.filter(ended_at__isnull=True)
    runs = list(active.values_list("job_id", "replica", "node_id").distinct())
    ended = active.update(ended_at=now or timezone.now())
    outbox.workload_starts_withdraw(runs=runs)
    return ended


# --- requeue, reservations ---------------------------------------------------------------------------


def job_requeue(job: Job, *, reason: str, message: str) -> None:
    """Back to the queue (resuming from its checkpoint when it has one)."""
    suffix = " It resumes from its last checkpoint." if job.last_checkpoint_at else ""
    job_transition(job=job, to_state=S.QUEUED, actor=None, reason=reason, message=message + suffix)


def reservations_release(*, job: Job) -> int:
    """Delete every reservation of ``job`` (the caller's transaction). Work that borrowed them keeps running
    as ordinary allocations, on capacity the release has just freed. Returns the rows deleted."""
    return _reservations_release([job.pk])


def _reservations_release(job_ids: Sequence[int]) -> int:
    """``reservations_release`` of the jobs ``job_ids``: the same two statements whatever their number."""
    deleted, _ = InferenceReservation.objects.filter(job_id__in=job_ids).delete()
    if deleted:
        Allocation.objects.active().filter(reservation_of_id__in=job_ids).update(reservation_of=None)
    return deleted
