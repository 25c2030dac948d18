"""A ``scheduler.core`` Plan → rows, in the caller's transaction, safe against concurrent writers, in bulk.

The plan was computed from a snapshot that may be stale by the time it is written (another worker, a cancel,
a node going away). So every ``Place`` is re-checked under row locks. Locking rule (the project's lock order,
after the cycle's advisory lock): every row is locked once, up front, with
``select_for_update(of=("self",), no_key=True)`` (FOR NO KEY UPDATE: the deferred foreign-key checks of other
transactions, FOR KEY SHARE, never wait on it; never a tenant or user row through ``select_related``), rows
of one table in primary-key order, tables in the order Job → Device → InferenceReservation. The jobs of the
plan's places and preemptions come first, then the devices its places touch, whose active allocations are
summed once inside the transaction and kept up to date in memory as places are accepted.

Each place is checked in memory against that state; a place that no longer fits is skipped (its job stays
queued for the next cycle) and no device is ever double-booked. What the accepted places write is then
written in bulk — a few statements for the whole plan, not a few per place: the allocations and reservations
in one INSERT each, the jobs' ``queued → admitted`` transitions through the bulk form of the one transition
writer (``scheduler.transitions.jobs_transition``: one UPDATE, one INSERT of their ``JobEvent`` rows,
audit records buffered by ``audit_record`` and inserted at commit), the ``workload.start`` commands in
bulk. On PostgreSQL the allocation trigger (migration 0003) is the last line of defence: if it
refuses the bulk insert, the places are written again one by one, each in a savepoint, and only the refused
ones are skipped.

Inference reservations count as used capacity of their device. An assignment on a reservation
(``reservation_of``) uses the reservation's capacity instead: the service's own replica consumes the
reservation row (it becomes the allocation), a borrower's allocation is marked ``reservation_of`` and must
fit in what the reservation has not lent. ``Place.reserved`` becomes reservation rows. The plan's holds
replace the stored ones (``CapacityHold``) in the same transaction.

Pending explanations are written only for the jobs whose stored reason, message or positions differ.

The package follows those steps: ``batch`` (lock and read), ``places`` (check in memory), ``writes`` (write in
bulk), ``explanations`` (pending reasons and holds); ``persist_plan`` here runs them in order.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from scheduler import serving
from scheduler.core import types as core
from scheduler.fleet import outbox
from scheduler.logs import job_log_ends
from scheduler.persist.batch import PlanBatch
from scheduler.persist.explanations import (
    StoredExplanation,
    changed_explanations,
    explanations_write,
    holds_replace,
)
from scheduler.persist.places import PlaceRejected, place_check
from scheduler.persist.writes import (
    WRITE_BATCH,
    PersistOutcome,
    places_write,
    preempt_write,
    reserve_job_ports,
    skipped_write,
)

__all__ = ["WRITE_BATCH", "PersistOutcome", "PlaceRejected", "PlanBatch", "StoredExplanation", "persist_plan"]

logger = logging.getLogger(__name__)


def persist_plan(
    plan: core.Plan,
    *,
    now: datetime | None = None,
    stored_explanations: Mapping[int, StoredExplanation] | None = None,
    holds_stored: bool = True,
    explanations_known: bool = False,
) -> PersistOutcome:
    """Write ``plan``: allocations and ``workload.start`` for each place that still fits, ``workload.stop`` for
    each preemption, pending reasons for the rest (only those that changed; ``stored_explanations`` is what
    the snapshot read, so they need not be read again). ``holds_stored=False`` says the snapshot found no
    stored hold (read under the cycle lock, which every writer of holds holds): a plan without holds then
    writes none. ``explanations_known``: the caller keeps the explanations it is told of (``outcome.explanations``;
    the live snapshot), so their write is not sent through the snapshot's change log. Runs in one transaction
    (the caller's, or its own)."""
    now = now or timezone.now()
    outcome = PersistOutcome()
    # No savepoint inside the cycle's transaction: a failure here fails the whole cycle anyway.
    with transaction.atomic(savepoint=False):
        explained = changed_explanations(plan.explanations, stored=stored_explanations)
        batch = PlanBatch(plan, also_lock=[row[0] for row in explained])
        for preempt in plan.preemptions:
            preempt_write(preempt, batch=batch, outcome=outcome)
        accepted = []
        for place in plan.places:
            try:
                accepted.append(place_check(place, batch=batch, now=now))
            except PlaceRejected as exc:
                logger.info("place of job %s skipped: %s", place.job_id, exc)
                skipped_write(place.job_id, str(exc), outcome=outcome)
        accepted = reserve_job_ports(accepted, now=now, outcome=outcome)
        starts = []
        # Only a job placed before (preempted, requeued; a service scaling up) can have a log: its output comes
        # from the nodes of its allocations. Read before the writes set this placement's admitted_at.
        placed_before = {write.job.pk for write in accepted if write.scaling or write.job.admitted_at is not None}
        written = places_write(accepted, now=now, outcome=outcome)
        # A job that ran before continues its log where the last run ended.
        log_ends = job_log_ends(job_ids=[write.job.pk for write in written if write.job.pk in placed_before])
        for write in written:
            replica_devices: dict[int, list[tuple[int, str, int, int]]] = defaultdict(list)
            replica_node: dict[int, int] = {}
            for row in write.allocations:
                device = batch.by_pk[row.device_id]
                replica_devices[row.replica].append((device.index, device.uuid, row.millis, row.memory_mib))
                replica_node[row.replica] = row.node_id  # a replica's devices are all on one node
            for replica in sorted(replica_devices):
                message = outbox.workload_start_frame(
                    job=write.job,
                    replica=replica,
                    devices=replica_devices[replica],
                    log_offset=log_ends.get((write.job.pk, replica), 0),
                    layout=write.layout,
                )
                starts.append((replica_node[replica], write.job, message))
            outcome.placed.append(write.job.pk)
        outbox.commands_bulk_create(starts)
        if any((write.job.spec or {}).get("ports") for write in written):
            transaction.on_commit(serving.serving_sync)  # new replicas join their endpoints once ready
        if holds_stored or plan.holds:
            holds_replace(plan.holds, now=now)
        outcome.explained = explanations_write(explained, known=explanations_known)
        outcome.explanations = explained
    return outcome
