"""What-if: the same jobs under the policy in force and a proposed change, side by side; settings are checked."""

from __future__ import annotations

import pytest

from scheduler.core.types import Ordering, Policy
from scheduler.sim import SimConfig, SimJob, Workload
from scheduler.sim.policies import parse_settings
from scheduler.sim.whatif import allocation_chart, compare, svg
from scheduler.sim.workload import uniform_nodes

CONFIG = SimConfig(cycle_interval_s=1.0, restart_cost_s=3, checkpoint_interval_s=4)
CURRENT = Policy(min_runtime_before_preempt_s=0, grace_period_s=5)


def borrower_and_lender() -> Workload:
    return Workload(
        "tiny",
        uniform_nodes(2, 1),
        (SimJob("a", "t1", 0, 100), SimJob("b", "t1", 0, 100), SimJob("c", "t2", 10, 50)),
        guarantees={"t1": {"gpu": 1000}, "t2": {"gpu": 1000}},
        limits={"t1": {"gpu": 2000}, "t2": {"gpu": 2000}},
    )


def test_turning_preemption_off_shows_fewer_preemptions_and_a_longer_wait_for_the_lender():
    whatif = compare(borrower_and_lender(), CURRENT, {"preemption": "false"}, CONFIG)

    assert whatif.changes == {"preemption": False}
    assert whatif.current.policy.preemption and not whatif.proposed.policy.preemption
    rows = {row["key"]: row for row in whatif.rows()}
    assert (rows["preemptions"]["current"], rows["preemptions"]["proposed"]) == (1, 0)
    assert rows["preemptions"]["better"] is True
    # Without preemption c waits for a card until t=100 (not 5 s): its tenant is starved of its guarantee.
    assert rows["queued_p99_s"]["proposed"] > rows["queued_p99_s"]["current"]
    assert rows["within_guarantee"]["proposed"] < rows["within_guarantee"]["current"]
    assert rows["within_guarantee"]["better"] is False
    # Each job judged alone reads the same here (c is the only job owed room); the page shows both.
    assert rows["within_guarantee_alone"]["proposed"] < rows["within_guarantee_alone"]["current"]
    t2 = {row["key"]: row for row in whatif.tenant_rows() if row["tenant"] == "t2"}
    assert t2["within_guarantee_alone"]["proposed"] < t2["within_guarantee_alone"]["current"]
    assert t2["queued_avg_s"]["current"] == 5 and t2["queued_avg_s"]["proposed"] == 90


def test_the_result_is_json_ready_and_charted_without_script():
    whatif = compare(borrower_and_lender(), CURRENT, {"min_runtime_before_preempt_s": "900"}, CONFIG)

    data = whatif.as_dict()
    assert data["changes"] == {"min_runtime_before_preempt_s": 900.0}
    assert data["proposed_policy"]["min_runtime_before_preempt_s"] == 900.0
    assert len(data["allocated_share_hourly"]["current"]) == 1
    chart = allocation_chart(whatif)
    assert chart.current and chart.proposed
    assert "<script" not in svg(whatif) and "<polyline" in svg(whatif)


def test_unknown_settings_and_bad_values_are_refused_with_the_valid_choices():
    with pytest.raises(ValueError, match=r"unknown setting 'preempt'; the settings are preemption, borrowing"):
        compare(borrower_and_lender(), CURRENT, {"preempt": "false"}, CONFIG)
    with pytest.raises(ValueError, match="expected true or false"):
        parse_settings(["preemption=nope"])
    with pytest.raises(ValueError, match="expected one of priority_fairshare, fifo"):
        parse_settings(["ordering=lifo"])
    with pytest.raises(ValueError, match="expected NAME=VALUE"):
        parse_settings(["preemption"])


def test_settings_take_their_fields_types():
    assert parse_settings(
        ["preemption=false", "min_runtime_before_preempt_s=900", "ordering=fifo", "max_jobs_per_cycle=none", "seed=3"]
    ) == {
        "preemption": False,
        "min_runtime_before_preempt_s": 900.0,
        "ordering": Ordering.FIFO,
        "max_jobs_per_cycle": None,
        "seed": 3,
    }


@pytest.mark.parametrize("pair", ["grace_period_s=-1", "seed=inf", "usage_half_life_s=nan"])
def test_negative_or_endless_numbers_are_refused(pair):
    with pytest.raises(ValueError, match="expected a number of at least 0"):
        parse_settings([pair])
