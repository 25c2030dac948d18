"""The scheduling cycle: requesting one (a dirty flag and one claimed task, so a burst of requests costs one or
two cycles), running requested cycles one after the other, and ``run_cycle`` itself: snapshot →
``scheduler.core.plan`` → persist, in one transaction under the cycle lock.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from kernel.task_queue import task_queue
from scheduler import eta, live_snapshot, locks, persist, snapshot
from scheduler.services.array_rows import array_tasks_top_up
from scheduler.services.never_fits import never_fits_notify

logger = logging.getLogger(__name__)

# Prompt cycles (``request_cycle`` / ``run_requested_cycles``): a change sets the dirty flag; the first request
# that finds no cycle task claimed queues one at once; the task runs cycles until the flag stays clear.
CYCLE_DIRTY_KEY = "scheduler:cycle:dirty"
CYCLE_CLAIM_KEY = "scheduler:cycle:claimed"
# How long a claim outlives its task: a worker that dies mid-cycle blocks prompt cycles this long at most (beat
# still runs one every few seconds, and a restarted worker clears the claim at once). Renewed before a cycle
# once a quarter of it has gone by (not before every cycle: each cache call costs the worker a fraction of a
# millisecond, and a busy one runs a cycle per submit and per finish).
CYCLE_CLAIM_TTL_S = 60
# A task that keeps finding new requests hands over to a fresh task after this long (other tasks get a turn).
CYCLE_LOOP_MAX_S = 30.0
# How long a requested cycle waits for the cycle lock (a beat cycle, or another worker's) before trying again.
CYCLE_LOCK_WAIT_S = 10.0
# When the last cycle started (epoch seconds): for monitoring and ``benchmarks/scheduler_db_cycle.py``.
CYCLE_STARTED_KEY = "scheduler:cycle:started-at"
# The Celery queue requested cycles are sent to (None: the default queue); tests point it at their worker.
CYCLE_QUEUE: str | None = None


# This worker process's kept state of the pool (``scheduler.live_snapshot``), made on its first cycle.
_live: live_snapshot.LiveSnapshot | None = None


def _live_snapshot() -> live_snapshot.LiveSnapshot | None:
    global _live
    if not settings.GPUPOOL_SNAPSHOT_INCREMENTAL:
        return None
    if _live is None or _live.full_every_s != settings.GPUPOOL_SNAPSHOT_CHECK_S:
        _live = live_snapshot.LiveSnapshot(full_every_s=settings.GPUPOOL_SNAPSHOT_CHECK_S)
    return _live


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
    # By name (the tasks module imports this one), through apply_async: GPUPOOL_CELERY_EAGER still runs it inline.
    task_queue("scheduler.cycle_requested", queue=queue or CYCLE_QUEUE)


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
    renewed_at: float | None = None
    while True:
        if renewed_at is None or monotonic() - renewed_at >= CYCLE_CLAIM_TTL_S / 4:
            cache.set(CYCLE_CLAIM_KEY, 1, timeout=CYCLE_CLAIM_TTL_S)  # renewed: this task is alive and looping
            renewed_at = monotonic()
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
            renewed_at = monotonic()
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

    lock = locks.cycle_lock(wait_s=lock_wait_s) if hold_lock else nullcontext(True)
    with transaction.atomic(), lock as acquired:
        if not acquired:
            return CycleResult(ran=False)
        try:  # a figure for monitoring: never a reason to fail the cycle
            cache.set(CYCLE_STARTED_KEY, time(), timeout=None)
        except Exception:
            logger.warning("could not record the start of a scheduling cycle: the cache is unreachable")
        started = perf_counter()
        # Arrays are one record each: the tasks this cycle may place become rows first (none: one indexed read).
        topped_up = array_tasks_top_up()
        stored: dict[int, tuple] = {}
        live = _live_snapshot()
        build = live.build if live is not None else snapshot.build_snapshot
        snap = build(now=now, previous_usage=cache.get(snapshot.USAGE_CACHE_KEY), stored_explanations=stored)
        planning = perf_counter()
        plan = snapshot.plan_for(snap)
        persisting = perf_counter()
        outcome = persist.persist_plan(
            plan,
            now=now,
            stored_explanations=stored,
            holds_stored=bool(snap.holds),
            explanations_known=live is not None and live_snapshot.supported(),
        )
        if live is not None:
            live.explanations_written(outcome.explanations)
        else:
            transaction.on_commit(live_snapshot.log_prune_unread)
        never_fits_notify(explanations=plan.explanations, stored=stored)
        done = perf_counter()
        # Kept for the next cycle's decay; losing it (cache flush) only restarts the average.
        record = {"at": snap.now, "usage": {t: dict(f) for t, f in snap.usage.items()}}
        transaction.on_commit(lambda: cache.set(snapshot.USAGE_CACHE_KEY, record, timeout=7 * 24 * 3600))
        if topped_up.arrays_waiting and outcome.placed:
            # Cards may still be free for the array's next tasks: the next cycle makes their rows and places them.
            transaction.on_commit(request_cycle)
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
                "array_rows_made": topped_up.rows_made,
                "snapshot_s": round(planning - started, 4),
                "snapshot_read": live.last.mode if live is not None else "full",
                "snapshot_changed_rows": live.last.changed_rows if live is not None else None,
                "plan_s": round(persisting - planning, 4),
                "persist_s": round(done - persisting, 4),
            },
        )
