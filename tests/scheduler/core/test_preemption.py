"""Step 4: reclaim of borrowed capacity, priority preemption, victim choice, protections."""

from __future__ import annotations

from scheduler.core import plan
from scheduler.core.types import PendingReason, Policy, PreemptReason

from .builders import alloc, job, node, quota, snapshot

NOW = 10_000.0
OLD = NOW - 3600  # started long enough ago to be preemptible


def _explained(result, job_id):
    return next(e for e in result.explanations if e.job_id == job_id)


def _victims(result) -> dict[str, PreemptReason]:
    return {p.job_id: p.reason for p in result.preemptions}


def test_higher_priority_job_preempts_lower_priority_work_of_its_tenant():
    s = snapshot(
        [node("n1", 2)],
        allocations=[
            alloc("low", "n1-gpu0", priority=200, started_at=OLD),
            alloc("low2", "n1-gpu1", priority=200, started_at=OLD),
        ],
        pending=[job("high", cards=1, priority=800)],
    )
    result = plan(s, Policy(grace_period_s=30))
    assert len(result.preemptions) == 1
    (pre,) = result.preemptions
    assert pre.reason == PreemptReason.PRIORITY and pre.victim_of == "high" and pre.grace_s == 30
    assert not result.places
    assert _explained(result, "high").code == PendingReason.WAITING_FOR_PREEMPTION


def test_equal_priority_never_preempts():
    s = snapshot(
        [node("n1", 1)],
        allocations=[alloc("peer", "n1-gpu0", priority=500, started_at=OLD)],
        pending=[job("j", priority=500)],
    )
    result = plan(s, Policy())
    assert not result.preemptions
    assert _explained(result, "j").code == PendingReason.INSUFFICIENT_CAPACITY


def test_non_preemptible_work_is_never_a_victim():
    s = snapshot(
        [node("n1", 1)],
        allocations=[alloc("pinned", "n1-gpu0", priority=0, preemptible=False, started_at=OLD)],
        pending=[job("j", priority=1000)],
    )
    assert not plan(s, Policy()).preemptions


def test_preemption_off_means_no_victims():
    s = snapshot(
        [node("n1", 1)],
        allocations=[alloc("low", "n1-gpu0", priority=0, started_at=OLD)],
        pending=[job("j", priority=1000)],
    )
    assert not plan(s, Policy(preemption=False)).preemptions


def test_fresh_work_is_protected_by_the_minimum_runtime():
    s = snapshot(
        [node("n1", 1)],
        allocations=[alloc("fresh", "n1-gpu0", priority=0, started_at=NOW - 60)],
        pending=[job("j", priority=1000)],
    )
    assert not plan(s, Policy(min_runtime_before_preempt_s=300)).preemptions
    assert _victims(plan(s, Policy(min_runtime_before_preempt_s=30))) == {"fresh": PreemptReason.PRIORITY}


def test_no_preemption_loop_a_job_never_preempts_the_job_that_preempted_it():
    s = snapshot(
        [node("n1", 1)],
        allocations=[alloc("x", "n1-gpu0", priority=200, started_at=OLD)],
        pending=[job("y", priority=800, preempted_by=frozenset({"x"}))],
    )
    assert not plan(s, Policy()).preemptions


def test_lender_reclaims_borrowed_capacity_from_another_tenant_whatever_the_priority():
    quotas = [quota("team-a", 1, 2), quota("team-b", 1, 2)]
    s = snapshot(
        [node("n1", 2)],
        allocations=[
            alloc("b-own", "n1-gpu0", "team-b", priority=1000, started_at=OLD),
            alloc("b-borrowed", "n1-gpu1", "team-b", priority=1000, borrowed_millis=1000, started_at=OLD),
        ],
        pending=[job("a", "team-a", priority=200)],
        quotas=quotas,
    )
    result = plan(s, Policy())
    assert _victims(result) == {"b-borrowed": PreemptReason.RECLAIM_BORROWED}


def test_work_within_another_tenants_guarantee_is_never_taken_by_priority():
    quotas = [quota("team-a", 1, 2), quota("team-b", 1, 2)]
    s = snapshot(
        [node("n1", 1)],
        allocations=[alloc("b-own", "n1-gpu0", "team-b", priority=0, started_at=OLD)],
        pending=[job("a", "team-a", priority=1000)],
        quotas=quotas,
    )
    assert not plan(s, Policy()).preemptions


def test_borrowing_job_does_not_reclaim_but_may_preempt_lower_priority_borrowers():
    quotas = [quota("team-a", 1, 4), quota("team-b", 1, 4), quota("team-c", 4)]
    allocations = [
        alloc("b-borrow", "n1-gpu0", "team-b", priority=800, borrowed_millis=1000, started_at=OLD),
        alloc("b-own", "n1-gpu1", "team-b", priority=200, started_at=OLD),
        alloc("a-own", "n1-gpu2", "team-a", priority=800, started_at=OLD),
    ]
    s = snapshot([node("n1", 3)], allocations=allocations, pending=[job("a2", "team-a", priority=500)], quotas=quotas)
    # a2 would borrow (team-a's guarantee of 1 is in use): it may not reclaim b-borrow (priority 800 > 500),
    # and b-own is inside team-b's guarantee.
    assert not plan(s, Policy()).preemptions
    lower = [
        alloc("b-borrow", "n1-gpu0", "team-b", priority=200, borrowed_millis=1000, started_at=OLD),
        *allocations[1:],
    ]
    s2 = snapshot([node("n1", 3)], allocations=lower, pending=[job("a2", "team-a", priority=500)], quotas=quotas)
    assert _victims(plan(s2, Policy())) == {"b-borrow": PreemptReason.PRIORITY}


def test_victim_set_prefers_lowest_priority_then_borrowed_then_least_work_lost():
    allocations = [
        alloc("p300", "n1-gpu0", priority=300, started_at=OLD),
        alloc("p100-lost-much", "n1-gpu1", priority=100, started_at=OLD, last_checkpoint_at=OLD),
        alloc("p100-checkpointed", "n1-gpu2", priority=100, started_at=OLD, last_checkpoint_at=NOW - 10),
    ]
    s = snapshot([node("n1", 3)], allocations=allocations, pending=[job("j", priority=800)])
    assert _victims(plan(s, Policy())) == {"p100-checkpointed": PreemptReason.PRIORITY}


def test_fewest_victims_win_among_equal_cost_nodes():
    # n1: two fractional jobs hold one card; n2: one job holds one card. One card is needed.
    allocations = [
        alloc("f1", "n1-gpu0", priority=100, millis=500, memory_mib=1000, started_at=OLD, last_checkpoint_at=NOW),
        alloc("f2", "n1-gpu0", priority=100, millis=500, memory_mib=1000, started_at=OLD, last_checkpoint_at=NOW),
        alloc("w", "n2-gpu0", priority=100, started_at=OLD, last_checkpoint_at=NOW),
    ]
    s = snapshot([node("n1", 1), node("n2", 1)], allocations=allocations, pending=[job("j", priority=800)])
    assert set(_victims(plan(s, Policy()))) == {"w"}


def test_only_as_many_victims_as_needed_are_preempted():
    allocations = [alloc(f"low{i}", f"n1-gpu{i}", priority=100, started_at=OLD) for i in range(8)]
    s = snapshot([node("n1", 8)], allocations=allocations, pending=[job("j", cards=3, priority=800)])
    assert len(plan(s, Policy()).preemptions) == 3


def test_preempted_capacity_is_held_for_the_preemptor_not_given_to_later_jobs():
    allocations = [alloc("low", "n1-gpu0", priority=100, millis=500, memory_mib=1000, started_at=OLD)]
    s = snapshot(
        [node("n1", 1)],
        allocations=allocations,
        pending=[job("high", priority=800), job("tiny", millis=300, memory_mib=100, submitted_at=1, priority=800)],
    )
    result = plan(s, Policy())
    assert _victims(result) == {"low": PreemptReason.PRIORITY}
    assert not result.places  # the 500 free millis stay for "high"


def test_multi_replica_gang_preempts_across_nodes():
    allocations = [alloc(f"low{n}{i}", f"n{n}-gpu{i}", priority=100, started_at=OLD) for n in (1, 2) for i in range(2)]
    s = snapshot(
        [node("n1", 2), node("n2", 2)], allocations=allocations, pending=[job("g", cards=2, replicas=2, priority=800)]
    )
    assert len(plan(s, Policy()).preemptions) == 4


def test_a_victim_is_preempted_once_per_cycle():
    allocations = [alloc("low", "n1-gpu0", priority=100, started_at=OLD)]
    s = snapshot(
        [node("n1", 1)],
        allocations=allocations,
        pending=[job("h1", priority=800), job("h2", priority=800, submitted_at=1)],
    )
    result = plan(s, Policy())
    assert [p.job_id for p in result.preemptions] == ["low"]


def test_job_refused_by_its_own_quota_preempts_lower_priority_work_of_the_same_tenant():
    allocations = [alloc(f"low{i}", f"n1-gpu{i}", priority=100, started_at=OLD) for i in range(2)]
    s = snapshot(
        [node("n1", 8)],
        allocations=allocations,
        pending=[job("high", cards=1, priority=800)],
        quotas=[quota("team-a", 2, 2)],
    )
    result = plan(s, Policy())
    assert len(result.preemptions) == 1
    assert result.preemptions[0].reason == PreemptReason.PRIORITY
    assert _explained(result, "high").code == PendingReason.WAITING_FOR_PREEMPTION


def test_quota_preemption_never_reaches_into_another_tenant():
    s = snapshot(
        [node("n1", 8)],
        allocations=[
            alloc("other", "n1-gpu0", "team-b", priority=0, started_at=OLD),
            alloc("mine", "n1-gpu1", "team-a", priority=1000, preemptible=False, started_at=OLD),
        ],
        pending=[job("high", "team-a", cards=1, priority=800)],
        quotas=[quota("team-a", 0, 1), quota("team-b", 2)],
    )
    result = plan(s, Policy())
    assert not result.preemptions
    assert _explained(result, "high").code == PendingReason.QUOTA_LIMIT
