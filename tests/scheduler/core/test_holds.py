"""Holds: the capacity a preemption frees stays with its preemptor across cycles (``Snapshot.holds``)."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core import plan
from scheduler.core.types import Hold, JobKind, Ordering, PendingReason, Policy, PreemptReason, Reservation

from .builders import FLAVOR, MEM, alloc, job, node, quota, snapshot

NOW = 10_000.0
OLD = NOW - 3600
POLICY = Policy(ordering=Ordering.FIFO, min_runtime_before_preempt_s=10, grace_period_s=30)


def _explained(result, job_id):
    return next(e for e in result.explanations if e.job_id == job_id)


def _lender_and_borrower(*, now: float, allocations, pending, holds=()):
    # team-a is guaranteed the one card; team-b may only borrow it.
    return snapshot(
        [node("n1", 1)],
        allocations=allocations,
        pending=pending,
        quotas=[quota("team-a", 1), quota("team-b", 0, 1)],
        holds=tuple(holds),
        now=now,
    )


def test_freed_capacity_goes_to_the_preemptor_across_cycles_not_to_the_requeued_victim():
    borrower = alloc("victim", "n1-gpu0", "team-b", borrowed_millis=1000, started_at=OLD)
    # FIFO puts the victim (submitted first) ahead of its preemptor once it is back in the queue.
    victim_again = job("victim", "team-b", submitted_at=1.0, preempted_by=frozenset({"lender"}))
    lender = job("lender", "team-a", submitted_at=5.0)

    first = plan(_lender_and_borrower(now=NOW, allocations=[borrower], pending=[lender]), POLICY)
    assert [(p.job_id, p.reason) for p in first.preemptions] == [("victim", PreemptReason.RECLAIM_BORROWED)]
    assert first.holds == (Hold("lender", "n1-gpu0", ("victim",), NOW),)

    # Cycle 2: the victim is in its grace period (the caller marks stopping work not preemptible).
    stopping = replace(borrower, preemptible=False)
    second = plan(
        _lender_and_borrower(now=NOW + 10, allocations=[stopping], pending=[lender], holds=first.holds), POLICY
    )
    assert second.preemptions == () and second.places == ()
    assert _explained(second, "lender").code == PendingReason.WAITING_FOR_PREEMPTION
    assert second.holds == first.holds  # the same hold, still waiting for the same victim

    # Cycle 3: the victim has stopped and is queued again, ahead of the lender.
    third_snapshot = _lender_and_borrower(
        now=NOW + 40, allocations=[], pending=[victim_again, lender], holds=second.holds
    )
    third = plan(third_snapshot, POLICY)
    assert [p.job_id for p in third.places] == ["lender"]
    assert third.places[0].assignments[0].device_uuid == "n1-gpu0"
    assert third.holds == ()  # the preemptor started: nothing is held any more
    # Without the hold the victim would take the card back first — the start of a preemption loop — but for
    # the lender's claim on its own guarantee (issue 33): a borrower is not lent guarantee a queued job is owed.
    unheld = plan(replace(third_snapshot, holds=()), POLICY)
    assert [p.job_id for p in unheld.places] == ["lender"]
    unclaimed = plan(replace(third_snapshot, holds=(), pending=(victim_again,)), POLICY)
    assert [p.job_id for p in unclaimed.places] == ["victim"]


def test_a_preemptor_waiting_for_its_victims_searches_for_no_new_ones():
    # Two low-priority jobs on two cards; "high" preempted "low0" last cycle. "low1" is an equally good
    # victim, but the preemptor waits for the one already stopping instead of preempting another.
    allocations = [
        alloc("low0", "n1-gpu0", priority=200, started_at=OLD, preemptible=False),
        alloc("low1", "n1-gpu1", priority=200, started_at=OLD),
    ]
    held = (Hold("high", "n1-gpu0", ("low0",), NOW - 5),)
    s = snapshot([node("n1", 2)], allocations=allocations, pending=[job("high", priority=800)], holds=held, now=NOW)
    result = plan(s, POLICY)
    assert result.preemptions == ()
    assert result.holds == held
    assert _explained(result, "high").code == PendingReason.WAITING_FOR_PREEMPTION
    # The hold is what keeps it from preempting: without it, it picks a victim at once.
    assert [p.job_id for p in plan(replace(s, holds=()), POLICY).preemptions] == ["low1"]


def test_held_capacity_is_not_given_to_a_job_ahead_of_the_preemptor():
    # The victim has stopped; a job ahead in the queue that fits the freed card does not get it.
    held = (Hold("second", "n1-gpu0", ("gone",), NOW - 60),)
    s = snapshot(
        [node("n1", 1)],
        pending=[job("first", submitted_at=1.0), job("second", submitted_at=2.0)],
        holds=held,
        now=NOW,
    )
    result = plan(s, POLICY)
    assert [p.job_id for p in result.places] == ["second"]
    assert _explained(result, "first").code == PendingReason.INSUFFICIENT_CAPACITY


def test_a_stopping_victim_is_not_preempted_again_for_another_job():
    # "low" is stopping for "mid" (even if the caller forgot to mark it not preemptible); "top" arrives and
    # must not pick it again.
    allocations = [alloc("low", "n1-gpu0", priority=0, started_at=OLD)]
    held = (Hold("mid", "n1-gpu0", ("low",), NOW - 5),)
    pending = [job("mid", priority=500), job("top", priority=1000)]
    result = plan(snapshot([node("n1", 1)], allocations=allocations, pending=pending, holds=held, now=NOW), POLICY)
    assert result.preemptions == ()
    assert result.holds == held


def test_a_hold_whose_victims_are_gone_and_which_still_does_not_fit_is_dropped():
    # The held card's node failed after the victim stopped; the preemptor is scheduled afresh elsewhere.
    allocations = [alloc("low", "n2-gpu0", priority=200, started_at=OLD)]
    held = (Hold("high", "n1-gpu0", ("gone",), NOW - 60),)
    s = snapshot(
        [node("n1", 1, schedulable=False), node("n2", 1)],
        allocations=allocations,
        pending=[job("high", priority=800)],
        holds=held,
        now=NOW,
    )
    result = plan(s, POLICY)
    assert [p.job_id for p in result.preemptions] == ["low"]
    assert result.holds == (Hold("high", "n2-gpu0", ("low",), NOW),)


def test_the_hold_of_a_job_that_is_no_longer_pending_is_dropped():
    held = (Hold("cancelled", "n1-gpu0", (), NOW - 60),)
    s = snapshot([node("n1", 1)], pending=[job("other")], holds=held, now=NOW)
    result = plan(s, POLICY)
    assert [p.job_id for p in result.places] == ["other"]
    assert result.holds == ()


def test_a_service_reclaiming_its_reservation_preempts_each_borrower_once():
    reservation = Reservation("svc", "team-inf", "n1", "n1-gpu0", FLAVOR, 1000, MEM)
    borrower = alloc("train", "n1-gpu0", reservation_of="svc", started_at=NOW - 5)
    scale_up = job("svc", "team-inf", kind=JobKind.INFERENCE, first_replica=1)

    def cycle(now, allocations, holds, pending=(scale_up,)):
        s = snapshot(
            [node("n1", 1)],
            reservations=(reservation,),
            allocations=allocations,
            pending=list(pending),
            holds=holds,
            now=now,
        )
        return plan(s, POLICY)

    first = cycle(NOW, [borrower], ())
    assert [(p.job_id, p.reason) for p in first.preemptions] == [("train", PreemptReason.RESERVATION_RECLAIM)]
    assert first.holds == (Hold("svc", "n1-gpu0", ("train",), NOW),)
    second = cycle(NOW + 10, [replace(borrower, preemptible=False)], first.holds)
    assert second.preemptions == ()  # not preempted a second time while it stops
    assert _explained(second, "svc").code == PendingReason.WAITING_FOR_PREEMPTION
    retrain = job("train", submitted_at=0.0, preempted_by=frozenset({"svc"}))
    third = cycle(NOW + 40, [], second.holds, pending=(retrain, scale_up))
    (place,) = [p for p in third.places if p.job_id == "svc"]
    assert place.assignments[0].reservation_of == "svc" and place.assignments[0].replica == 1
    assert third.holds == ()
