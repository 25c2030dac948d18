"""Job state changes, the one module that writes a job's state (``tests/scheduler/test_one_state_writer.py``
holds every other module to it): the allowed transitions; ``jobs_transition``, the bulk form (many jobs' rows,
their ``JobEvent`` rows and audit records in a few statements) and ``job_transition``, its case of one job;
``job_create`` and ``job_array_create`` for jobs born past ``submitted``; ending allocations, requeueing, and
releasing an inference service's reservations.
"""

from __future__ import annotations

import functools
import operator
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Q
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
    JobArray,
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


def job_array_create(*, first: Job, count: int, to_state: str, reason: str, message: str, now: datetime) -> JobArray:
    """Insert an array as one record: task 0 (the unsaved ``first``, with its two events, as ``job_create``) and
    the ``JobArray`` that holds tasks 1..count-1 as one index range, not as rows (``array_tasks_materialize``
    makes rows of them when a cycle may place them). Two statements whatever the count. The caller writes the
    array's one audit record."""
    job_create(job=first, to_state=to_state, reason=reason, message=message, now=now)
    record = JobArray(
        array_id=first.array_id,
        tenant_id=first.tenant_id,
        head=first,
        count=count,
        unmaterialized=[[1, count]] if count > 1 else [],
        waiting=count - 1,
    )
    record.save(force_insert=True)
    return record


#: Job fields a task copies from its array's head (task 0): what the spec says. The rest of a task's row is its
#: own life: it starts queued, with the array's submit time, and nothing else set.
_TASK_COPIED_FIELDS = frozenset(
    {
        "tenant",
        "submitter",
        "name",
        "kind",
        "priority_class",
        "preemptible",
        "replicas",
        "min_replicas",
        "max_replicas",
        "flavors",
        "any_flavor",
        "millis_per_replica",
        "memory_mib_per_replica",
        "cpu_millicores_per_replica",
        "host_memory_mib_per_replica",
        "topology",
        "node_selector",
        "command",
        "working_dir",
        "max_runtime_s",
        "checkpoint_dir",
        "runtime_estimate_s",
        "spec",
        "array_id",
        "submitted_at",
    }
)


def array_tasks_materialize(*, array: JobArray, indices: Sequence[int], message: str) -> list[int]:
    """Make job rows of the array's tasks ``indices`` (each still in ``array.unmaterialized``; the caller holds the
    array's row locked): queued copies of the head but for ``array_index`` and ``GPUPOOL_ARRAY_INDEX``, submitted
    and queued when the array was, each with the two events a job submitted then would have. Takes the indices out
    of ``array.unmaterialized`` and saves the array. Three statements however many. Returns the new ids in the
    order of ``indices``."""
    indices = sorted(set(indices))
    if not indices:
        return []
    left = ranges_minus(array.unmaterialized, indices)
    if ranges_count(array.unmaterialized) - ranges_count(left) != len(indices):
        raise ConflictError(
            scheduler_messages.ARRAY_TASKS_ALREADY_ROWS(array_id=array.array_id), code="array_task_not_waiting"
        )
    head = Job.objects.get(pk=array.head_id)
    queued_at = head.queued_at or head.submitted_at
    if connection.vendor == "postgresql":
        job_ids = _task_rows_insert_sql(head=head, indices=indices, message=message, queued_at=queued_at)
    else:
        job_ids = _task_rows_insert_orm(head=head, indices=indices, message=message, queued_at=queued_at)
    _task_events_insert(job_ids=job_ids, submitter_id=head.submitter_id, message=message, at=queued_at)
    array.unmaterialized = left
    array.waiting = ranges_count(left)
    array.save(update_fields=["unmaterialized", "waiting"])
    return job_ids


def _task_row_values(head: Job, *, message: str, queued_at: datetime) -> dict[str, Any]:
    """The values of a new task's row other than its index and env: copied from the head or its own fresh life."""
    now = timezone.now()
    values: dict[str, Any] = {}
    for f in Job._meta.concrete_fields:
        if f.primary_key or f.name in ("array_index", "env"):
            continue
        if f.name in _TASK_COPIED_FIELDS:
            values[f.attname] = getattr(head, f.attname)
        elif f.name == "state":
            values[f.attname] = S.QUEUED
        elif f.name == "state_message":
            values[f.attname] = message[:500]
        elif f.name == "queued_at":
            values[f.attname] = queued_at
        elif f.name == "updated_at":
            values[f.attname] = now
        else:
            values[f.attname] = f.get_default()
    return values


def _task_rows_insert_orm(*, head: Job, indices: list[int], message: str, queued_at: datetime) -> list[int]:
    values = _task_row_values(head, message=message, queued_at=queued_at)
    tasks = [Job(**values, array_index=index, env={**head.env, "GPUPOOL_ARRAY_INDEX": str(index)}) for index in indices]
    Job.objects.bulk_create(tasks, batch_size=ARRAY_INSERT_BATCH)
    ids = [task.pk for task in tasks]
    Job.objects.filter(pk__in=ids).update(submitted_at=head.submitted_at)  # bulk_create set auto_now_add's now
    return ids


def _task_rows_insert_sql(*, head: Job, indices: list[int], message: str, queued_at: datetime) -> list[int]:
    """One ``INSERT … SELECT`` over ``unnest(indices)`` on PostgreSQL: the rows are built inside the database (a
    cycle that opens 1,000 tasks binds one array, not 1,000 model instances)."""
    quote = connection.ops.quote_name
    values = _task_row_values(head, message=message, queued_at=queued_at)
    fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
    columns, expressions, params = [], [], []
    for f in fields:
        columns.append(quote(f.column))
        if f.name == "array_index":
            expressions.append("g.n")
        elif f.name == "env":
            expressions.append("%s::jsonb || jsonb_build_object('GPUPOOL_ARRAY_INDEX', g.n::text)")
            params.append(f.get_db_prep_save(head.env, connection))
        else:
            expressions.append("%s")
            params.append(f.get_db_prep_save(values[f.attname], connection))
    table = quote(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(expressions)} "
            "FROM unnest(%s::integer[]) AS g(n) ORDER BY g.n RETURNING id, array_index",
            [*params, indices],
        )
        by_index = {index: pk for pk, index in cursor.fetchall()}
    return [by_index[index] for index in indices]


def _task_events_insert(*, job_ids: list[int], submitter_id: int | None, message: str, at: datetime) -> None:
    """The two events of each new task (``job_create``'s: submitted, then queued), at the array's submit time."""
    rows = []
    for pk in job_ids:
        rows.append((pk, "", S.SUBMITTED, "submitted", "", submitter_id, {}, at))
        rows.append((pk, S.SUBMITTED, S.QUEUED, "submitted", message[:500], submitter_id, {}, at))
    insert_rows(
        JobEvent, ("job_id", "from_state", "to_state", "reason", "message", "actor_id", "details", "created_at"), rows
    )


# --- index ranges (an array's tasks that are not rows yet) ------------------------------------------------


def ranges_count(ranges: Iterable[Sequence[int]]) -> int:
    """How many indices sorted disjoint ``[start, end)`` ranges hold."""
    return sum(end - start for start, end in ranges)


def ranges_first(ranges: Iterable[Sequence[int]], limit: int) -> list[int]:
    """The lowest ``limit`` indices of ``ranges``."""
    taken: list[int] = []
    for start, end in ranges:
        if len(taken) >= limit:
            break
        taken.extend(range(start, min(end, start + limit - len(taken))))
    return taken


def ranges_minus(ranges: Iterable[Sequence[int]], indices: Iterable[int]) -> list[list[int]]:
    """``ranges`` without ``indices`` (those not in it are ignored), still sorted, disjoint and merged."""
    removed: list[list[int]] = []
    for index in sorted(set(indices)):
        if removed and removed[-1][1] == index:
            removed[-1][1] = index + 1
        else:
            removed.append([index, index + 1])
    return ranges_subtract(ranges, removed)


def ranges_subtract(ranges: Iterable[Sequence[int]], removed: Iterable[Sequence[int]]) -> list[list[int]]:
    """``ranges`` without the indices of ``removed`` (both sorted disjoint ``[start, end)`` ranges), range by
    range: cancelling ``0-999999`` of a million-task array walks two ranges, not a million indices."""
    cuts = [tuple(cut) for cut in removed]
    result: list[list[int]] = []
    position = 0
    for start, end in ranges:
        while position < len(cuts) and cuts[position][1] <= start:
            position += 1
        cursor = start
        scan = position
        while scan < len(cuts) and cuts[scan][0] < end:
            cut_start, cut_end = cuts[scan]
            if cut_start > cursor:
                result.append([cursor, cut_start])
            cursor = max(cursor, cut_end)
            scan += 1
        if cursor < end:
            result.append([cursor, end])
    return result


def ranges_q(field: str, ranges: Iterable[Sequence[int]]) -> Q:
    """A filter for rows whose ``field`` is in ``ranges``: one comparison pair per range."""
    conditions = [
        Q(**{f"{field}__gte": start, f"{field}__lt": end}) if end - start > 1 else Q(**{field: start})
        for start, end in ranges
    ]
    return functools.reduce(operator.or_, conditions) if conditions else Q(pk__in=[])


def ranges_contains(ranges: Iterable[Sequence[int]], index: int) -> bool:
    return any(start <= index < end for start, end in ranges)


def ranges_text(ranges: Iterable[Sequence[int]]) -> str:
    """Slurm's notation: ``[[1, 5], [7, 8]]`` → ``"1-4,7"``."""
    return ",".join(str(start) if end - start == 1 else f"{start}-{end - 1}" for start, end in ranges)


def ranges_parse(text: str, *, count: int) -> list[list[int]]:
    """``"3-7,9"`` → ``[[3, 8], [9, 10]]`` (indices below ``count``, merged); ValueError naming what is wrong."""
    spans: list[tuple[int, int]] = []
    for part in (piece.strip() for piece in str(text).split(",")):
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            start, stop = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"{part!r} is not an index or a range like 3-7") from None
        if start < 0 or stop < start or stop >= count:
            raise ValueError(f"{part!r} is outside 0-{count - 1}")
        spans.append((start, stop + 1))
    if not spans:
        raise ValueError("name at least one index, e.g. 3-7,9")
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


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
