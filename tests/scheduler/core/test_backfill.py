"""Step 5: a blocked head of the queue gets capacity held; smaller jobs backfill only the holes."""

from __future__ import annotations

from scheduler.core import plan
from scheduler.core.types import PendingReason, Policy

from .builders import alloc, job, node, snapshot

NOW = 10_000.0


def _explained(result, job_id):
    return next(e for e in result.explanations if e.job_id == job_id)


def _blocked_head_snapshot(**kw):
    # n1: 6 of 8 cards busy until NOW+100; n2: 4 of 8 busy until NOW+5000 (all non-preemptible).
    allocations = [alloc(f"r1-{i}", f"n1-gpu{i}", preemptible=False, expected_end_at=NOW + 100) for i in range(6)] + [
        alloc(f"r2-{i}", f"n2-gpu{i}", preemptible=False, expected_end_at=NOW + 5000) for i in range(4)
    ]
    pending = [
        job("head", cards=8, priority=800, submitted_at=1),
        job("small1", cards=2, priority=500, submitted_at=2),
        job("small2", cards=2, priority=500, submitted_at=3),
        job("small3", cards=2, priority=500, submitted_at=4),
    ]
    return snapshot([node("n1", 8), node("n2", 8)], allocations=allocations, pending=pending, now=NOW, **kw)


def test_head_gets_the_devices_that_free_up_first_and_small_jobs_use_the_rest():
    result = plan(_blocked_head_snapshot(), Policy())
    head = _explained(result, "head")
    assert head.code == PendingReason.INSUFFICIENT_CAPACITY
    assert "held for it as the head of the queue" in head.message
    placed = {p.job_id: {a.node for a in p.assignments} for p in result.places}
    # n1 (frees at NOW+100) is held for the head: the 2 free cards there are not used; n2 has 4 free cards.
    assert placed == {"small1": {"n2"}, "small2": {"n2"}}
    assert _explained(result, "small3").code == PendingReason.INSUFFICIENT_CAPACITY


def test_without_backfill_nothing_behind_a_blocked_head_starts_on_its_flavor():
    result = plan(_blocked_head_snapshot(), Policy(backfill=False))
    assert not result.places
    small = _explained(result, "small1")
    assert small.code == PendingReason.BLOCKED_BY_HEAD
    assert "waiting behind job head" in small.message


def test_only_the_first_blocked_job_per_flavor_holds_capacity():
    result = plan(_blocked_head_snapshot(), Policy())
    assert result.stats["head_reservations"] == 1


def test_short_job_may_backfill_held_devices_when_it_ends_before_the_head_could_start():
    base = _blocked_head_snapshot()
    short = job("short", cards=2, priority=500, submitted_at=5, runtime_estimate_s=50)  # ends NOW+50 < NOW+100
    too_long = job("long", cards=2, priority=500, submitted_at=6, runtime_estimate_s=500)
    s = snapshot(
        [node("n1", 8), node("n2", 8)],
        allocations=base.allocations,
        pending=[*base.pending, short, too_long],
        now=NOW,
    )
    result = plan(s, Policy())
    placed = {p.job_id: {a.node for a in p.assignments} for p in result.places}
    assert placed["short"] == {"n1"}  # onto the head's held devices
    assert "long" not in placed
    assert _explained(result, "head").code == PendingReason.INSUFFICIENT_CAPACITY
