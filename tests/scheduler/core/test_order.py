"""Step 1: priority class, then fair share (dominant resource, decayed usage), then submit time."""

from __future__ import annotations

from scheduler.core import decay_usage, plan
from scheduler.core.types import Ordering, Policy, Tenant

from .builders import alloc, job, node, snapshot


def _order(plan_result) -> list[str]:
    return [e.job_id for e in plan_result.explanations]


def test_higher_priority_class_is_served_first_even_if_submitted_later():
    s = snapshot(
        [node("n1", 1)],
        pending=[job("low", priority=200, submitted_at=1), job("high", priority=800, submitted_at=5)],
    )
    result = plan(s, Policy())
    assert [p.job_id for p in result.places] == ["high"]
    assert _order(result) == ["low"]


def test_within_a_priority_tenant_with_lower_share_goes_first():
    # team-a already holds 2 cards, team-b none: team-b's job is served first although submitted later.
    s = snapshot(
        [node("n1", 3)],
        allocations=[alloc("run-a", "n1-gpu0", "team-a"), alloc("run-a2", "n1-gpu1", "team-a")],
        pending=[job("a1", "team-a", submitted_at=1), job("b1", "team-b", submitted_at=2)],
    )
    result = plan(s, Policy())
    assert [p.job_id for p in result.places] == ["b1"]


def test_decayed_past_usage_counts_against_a_tenant():
    s = snapshot(
        [node("n1", 1)],
        pending=[job("a1", "team-a", submitted_at=1), job("b1", "team-b", submitted_at=2)],
        usage={"team-a": {"nvidia-h100-80g": 4000.0}},
    )
    assert [p.job_id for p in plan(s, Policy()).places] == ["b1"]


def test_tenants_alternate_as_their_share_grows_during_the_cycle():
    pending = [job(f"a{i}", "team-a", submitted_at=i) for i in range(3)]
    pending += [job(f"b{i}", "team-b", submitted_at=10 + i) for i in range(3)]
    result = plan(snapshot([node("n1", 4)], pending=pending), Policy())
    assert sorted(p.job_id for p in result.places) == ["a0", "a1", "b0", "b1"]


def test_fair_share_weight_gives_a_tenant_a_larger_share():
    pending = [job(f"a{i}", "team-a", submitted_at=i) for i in range(4)]
    pending += [job(f"b{i}", "team-b", submitted_at=i) for i in range(4)]
    s = snapshot([node("n1", 6)], pending=pending, tenants=[Tenant("team-a", None, 2.0), Tenant("team-b")])
    placed = [p.job_id for p in plan(s, Policy()).places]
    assert sum(1 for j in placed if j.startswith("a")) == 4
    assert sum(1 for j in placed if j.startswith("b")) == 2


def test_without_fair_share_submit_time_decides_within_a_priority():
    pending = [job(f"a{i}", "team-a", submitted_at=i) for i in range(3)] + [job("b0", "team-b", submitted_at=9)]
    result = plan(snapshot([node("n1", 3)], pending=pending), Policy(fair_share=False))
    assert [p.job_id for p in result.places] == ["a0", "a1", "a2"]


def test_fifo_ordering_ignores_priority():
    s = snapshot(
        [node("n1", 1)],
        pending=[job("early-low", priority=0, submitted_at=1), job("late-high", priority=1000, submitted_at=2)],
    )
    result = plan(s, Policy(ordering=Ordering.FIFO, preemption=False))
    assert [p.job_id for p in result.places] == ["early-low"]


def test_decay_usage_halves_old_usage_after_one_half_life():
    assert decay_usage(1000.0, 0.0, elapsed_s=3600, half_life_s=3600) == 500.0
    assert decay_usage(0.0, 1000.0, elapsed_s=3600, half_life_s=3600) == 500.0
    assert decay_usage(800.0, 0.0, elapsed_s=0, half_life_s=3600) == 800.0


def test_fair_share_balances_departments_before_teams():
    # dept-x has two teams, dept-y one: with 4 cards, dept-y's team gets 2, not 4/3.
    tenants = [
        Tenant("dept-x"),
        Tenant("dept-y"),
        Tenant("x1", "dept-x"),
        Tenant("x2", "dept-x"),
        Tenant("y1", "dept-y"),
    ]
    pending = [job(f"{t}-{i}", t, submitted_at=i) for t in ("x1", "x2", "y1") for i in range(4)]
    result = plan(snapshot([node("n1", 4)], pending=pending, tenants=tenants), Policy())
    placed = [p.job_id for p in result.places]
    assert sum(1 for j in placed if j.startswith("y1")) == 2
    assert sum(1 for j in placed if j.startswith("x")) == 2


def test_usage_that_includes_what_is_held_now_is_not_counted_twice():
    # The caller's usage is a decayed average of millis held, updated with what is held now (on the Django
    # side's first cycle it *is* what is held now). team-a holds 2 cards and its average is 2; team-b holds
    # nothing now but averaged 3 cards recently. team-b has used more, so team-a is served first. Adding the
    # allocations on top of the average would count team-a's 2 cards twice (4 > 3) and serve team-b.
    s = snapshot(
        [node("n1", 3)],
        allocations=[alloc("run-a", "n1-gpu0", "team-a"), alloc("run-a2", "n1-gpu1", "team-a")],
        pending=[job("a1", "team-a", submitted_at=1), job("b1", "team-b", submitted_at=2)],
        usage={"team-a": {"nvidia-h100-80g": 2000.0}, "team-b": {"nvidia-h100-80g": 3000.0}},
    )
    assert [p.job_id for p in plan(s, Policy()).places] == ["a1"]


def test_a_tenant_holding_more_than_its_decayed_average_is_charged_what_it_holds():
    # team-a just took 2 cards (its average has barely moved); team-b averaged 1 card. What team-a holds now
    # counts, so team-b goes first.
    s = snapshot(
        [node("n1", 3)],
        allocations=[alloc("run-a", "n1-gpu0", "team-a"), alloc("run-a2", "n1-gpu1", "team-a")],
        pending=[job("a1", "team-a", submitted_at=1), job("b1", "team-b", submitted_at=2)],
        usage={"team-a": {"nvidia-h100-80g": 100.0}, "team-b": {"nvidia-h100-80g": 1000.0}},
    )
    assert [p.job_id for p in plan(s, Policy()).places] == ["b1"]
