"""What a plan's accepted places and preemptions write, in bulk: allocations, reservations, the jobs'
transitions (``scheduler.transitions.jobs_transition``, the one writer of a job's state), ports, and
the fallback one place at a time when the database refuses the bulk insert. See ``scheduler.persist``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import IntegrityError, transaction

from kernel.db.bulk import AnyOf, insert_rows
from scheduler import launch
from scheduler.core import sentences
from scheduler.core import types as core
from scheduler.core.sentences import say
from scheduler.fleet import outbox
from scheduler.models import Allocation, InferenceReservation, Job, JobState
from scheduler.persist.batch import PlanBatch, plan_job_id
from scheduler.persist.places import PlaceWrite
from scheduler.transitions import JobMove, job_transition, jobs_transition

logger = logging.getLogger("scheduler.persist")

#: Rows per INSERT / UPDATE statement (PostgreSQL takes at most 65,535 parameters per statement).
WRITE_BATCH = 1000
#: What an admission changes on a job (``jobs_transition``), read back when a refused bulk write rolled it back.
MOVED_FIELDS = (
    "state",
    "admitted_at",
    "updated_at",
    "state_message",
    "pending_reason_code",
    "pending_message",
    "position_in_tenant",
    "position_overall",
)


@dataclass
class PersistOutcome:
    placed: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    explained: int = 0
    skipped: list[dict] = field(default_factory=list)
    # The pending explanations written, ``(pk, code, message, in tenant, overall)`` (the live snapshot's copy).
    explanations: list[tuple] = field(default_factory=list)


def _write(writes: Sequence[PlaceWrite], *, now: datetime) -> None:
    """The rows of accepted places, a few statements for all of them."""
    consumed = [reservation.pk for write in writes for reservation in write.consumed]
    if consumed:  # the service's replicas take over their reserved capacity
        InferenceReservation.objects.filter(AnyOf("pk", consumed)).delete()
    insert_rows(
        Allocation,
        ALLOCATION_COLUMNS,
        [
            (
                row.job_id,
                row.replica,
                row.tenant_id,
                row.flavor_id,
                row.device_id,
                row.node_id,
                row.millis,
                row.memory_mib,
                row.borrowed_millis,
                row.reservation_of_id,
                row.started_at,
            )
            for write in writes
            for row in write.allocations
        ],
    )
    InferenceReservation.objects.bulk_create(
        [row for write in writes for row in write.reserved], batch_size=WRITE_BATCH
    )
    # The admitted jobs' rows, their events (with the scaled-up services' notes) and audit records: a few
    # statements for the whole plan (``jobs_transition``).
    jobs_transition(
        moves=[
            JobMove(
                job=write.job,
                to_state=JobState.ADMITTED,
                reason="placed",
                message=write.event_message,
                details=write.details,
            )
            for write in writes
            if not write.scaling
        ],
        actor=None,
        now=now,
        notes=[
            (write.job.pk, write.job.state, "scaled_up", write.event_message, write.details)
            for write in writes
            if write.scaling
        ],
    )


ALLOCATION_COLUMNS = (
    "job_id",
    "replica",
    "tenant_id",
    "flavor_id",
    "device_id",
    "node_id",
    "millis",
    "memory_mib",
    "borrowed_millis",
    "reservation_of_id",
    "started_at",
)


def places_write(writes: list[PlaceWrite], *, now: datetime, outcome: PersistOutcome) -> list[PlaceWrite]:
    """Write every accepted place in bulk; returns those written. When the database refuses the bulk insert (the
    PostgreSQL trigger saw a double booking the checks did not), the places are written one by one, each in a
    savepoint, and only the refused ones are skipped."""
    if not writes:
        return []
    try:
        with transaction.atomic():  # a savepoint: a refusal leaves the rest of the cycle intact
            _write(writes, now=now)
        return writes
    except IntegrityError as exc:
        logger.warning(
            "the database refused the bulk write of %d places (%s); writing them one by one", len(writes), exc
        )
    written = []
    for write in writes:
        for row in (*write.allocations, *write.reserved):  # rolled back: insert afresh
            row.pk = None
            row._state.adding = True
        if not write.scaling:  # rolled back too: the job is queued again, as the transition must find it
            write.job.refresh_from_db(fields=MOVED_FIELDS)
        try:
            with transaction.atomic():
                _write([write], now=now)
        except IntegrityError as exc:
            logger.warning("place of job %s refused by the database: %s", write.job.pk, exc)
            skipped_write(str(write.job.pk), "refused by the database", outcome=outcome)
            continue
        written.append(write)
    return written


def preempt_write(preempt: core.Preempt, *, batch: PlanBatch, outcome: PersistOutcome) -> None:
    job = batch.jobs.get(plan_job_id(preempt.job_id))  # locked by the batch (FOR NO KEY UPDATE, not its tenant)
    if job is None or job.state not in (JobState.ADMITTED, JobState.RUNNING):
        return  # already stopping, finished or gone
    preemptor = plan_job_id(preempt.victim_of)
    if preemptor is not None and preemptor not in job.preempted_by:
        job.preempted_by = [*job.preempted_by, preemptor]
    job.preemption_count += 1
    job.save(update_fields=["preempted_by", "preemption_count"])
    outbox.stop_active_replicas(job=job, grace_s=preempt.grace_s, reason="preempted")
    job_transition(
        job=job,
        to_state=JobState.PREEMPTING,
        actor=None,
        reason=str(preempt.reason),
        message=preempt.message or say(sentences.PREEMPTED_JOB, job=preempt.victim_of),
        details={"preempted_for": preempt.victim_of, "grace_s": preempt.grace_s},
    )
    outcome.preempted.append(job.pk)


def reserve_job_ports(accepted: list[PlaceWrite], *, now: datetime, outcome: PersistOutcome) -> list[PlaceWrite]:
    """The *Reserve* step: each accepted place's ports (``scheduler.launch``); a place whose nodes have none left
    is not written, and its job stays queued saying so (the capacity it was counted with stays counted for the
    rest of this plan: conservative, never a double booking)."""
    requests = [
        launch.PortRequest(
            job=write.job,
            replica_nodes={row.replica: row.node_id for row in write.allocations},
            scaling=write.scaling,
        )
        for write in accepted
    ]
    reserved = launch.ports_reserve(requests, now=now)
    kept = []
    for write in accepted:
        why = reserved.refused.get(write.job.pk)
        if why is None:
            write.layout = reserved.launches[write.job.pk]
            kept.append(write)
            continue
        logger.info("place of job %s skipped: %s", write.job.pk, why)
        outcome.skipped.append({"job_id": str(write.job.pk), "reason": why})
        Job.objects.filter(pk=write.job.pk, state=JobState.QUEUED).update(
            pending_reason_code=str(launch.PORTS_EXHAUSTED), pending_message=why[:500]
        )
    return kept


def skipped_write(job_id: str, reason: str, *, outcome: PersistOutcome) -> None:
    outcome.skipped.append({"job_id": job_id, "reason": reason})
    Job.objects.filter(pk=plan_job_id(job_id), state=JobState.QUEUED).update(
        pending_reason_code=str(core.PendingReason.INSUFFICIENT_CAPACITY),
        pending_message=sentences.DEVICES_CHOSEN_JOB_TAKEN,
    )
