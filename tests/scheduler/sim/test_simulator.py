"""The discrete-event simulator: time, cycles, preemption and failure costs, on scenarios small enough to
work out by hand."""

from __future__ import annotations

import pytest

from scheduler.sim import SimConfig, SimJob, Workload, policies, simulate
from scheduler.sim.metrics import summarize
from scheduler.sim.workload import uniform_nodes

FAST = SimConfig(cycle_interval_s=1.0)


def two_tenants(jobs, *, nodes=2, gpus=1) -> Workload:
    """``nodes`` nodes of ``gpus`` cards; tenants t1 and t2 each guaranteed half, limited to the whole."""
    capacity = nodes * gpus * 1000
    return Workload(
        "tiny",
        uniform_nodes(nodes, gpus),
        tuple(jobs),
        guarantees={"t1": {"gpu": capacity // 2}, "t2": {"gpu": capacity // 2}},
        limits={"t1": {"gpu": capacity}, "t2": {"gpu": capacity}},
    )


def three_jobs() -> Workload:
    return two_tenants([SimJob("a", "t1", 0, 100), SimJob("b", "t1", 0, 100), SimJob("c", "t2", 10, 50)])


def times(result):
    return {j.job_id: (j.first_start_s, j.finish_s) for j in result.jobs}


def test_fifo_on_two_cards_gives_hand_computed_metrics():
    result = simulate(three_jobs(), policies.get("fifo"), FAST)
    s = summarize(result)

    assert times(result) == {"a": (0, 100), "b": (0, 100), "c": (100, 150)}
    assert s["queue_delay_avg_s"] == pytest.approx(30.0)
    assert s["queue_delay_p95_s"] == pytest.approx(81.0)  # [0, 0, 90] interpolated at rank 1.9
    assert s["jct_avg_s"] == pytest.approx(340 / 3)
    assert s["makespan_s"] == 150
    assert s["gpu_allocation"] == pytest.approx(250 / 300)  # 2 cards x 100 s + 1 card x 50 s over 2 x 150
    assert s["gpu_utilisation"] == pytest.approx(250 / 300)
    assert s["preemptions"] == 0
    t2_speed = 50 / 140
    assert s["jain_fairness"] == pytest.approx((1 + t2_speed) ** 2 / (2 * (1 + t2_speed**2)))


def test_static_partition_keeps_a_tenant_at_its_guarantee():
    result = simulate(three_jobs(), policies.get("static"), FAST)

    assert times(result) == {"a": (0, 100), "b": (100, 200), "c": (10, 60)}
    assert summarize(result)["makespan_s"] == 200


def test_preempted_borrower_loses_work_since_its_checkpoint_and_pays_the_restart():
    # No borrowing back-off here: b borrows again as soon as c is done.
    policy = policies.get("gpupool", min_runtime_before_preempt_s=0, grace_period_s=5, borrow_backoff_s=None)
    config = SimConfig(cycle_interval_s=1.0, restart_cost_s=3, checkpoint_interval_s=4)
    result = simulate(three_jobs(), policy, config)
    jobs = {j.job_id: j for j in result.jobs}

    # c arrives at 10 within t2's guarantee and reclaims the card b borrowed; b stops after 5 s of grace,
    # having worked 15 s of which 12 are checkpointed. c runs 15..65, then b restarts: 3 s + 88 s left.
    assert times(result) == {"a": (0, 100), "b": (0, 156), "c": (15, 65)}
    assert jobs["b"].preemptions == 1 and jobs["b"].starts == 2
    assert result.preemptions == 1
    assert result.lost_gpu_s == pytest.approx(3.0)
    assert result.overhead_gpu_s == pytest.approx(3.0)
    s = summarize(result)
    assert s["gpu_utilisation"] == pytest.approx(250 / (2 * 156))
    assert s["gpu_allocation"] == pytest.approx((100 + 15 + 50 + 91) / (2 * 156))


def test_checkpoint_on_preempt_keeps_all_work_done_before_the_stop():
    policy = policies.get("gpupool", min_runtime_before_preempt_s=0, grace_period_s=5, borrow_backoff_s=None)
    config = SimConfig(cycle_interval_s=1.0, restart_cost_s=3, checkpoint_interval_s=4, checkpoint_on_preempt=True)
    result = simulate(three_jobs(), policy, config)

    assert times(result)["b"] == (0, 65 + 3 + 85)
    assert result.lost_gpu_s == 0


def test_fresh_jobs_are_protected_until_the_minimum_runtime_then_preempted_on_a_later_cycle():
    policy = policies.get("gpupool", min_runtime_before_preempt_s=30, grace_period_s=0, borrow_backoff_s=None)
    result = simulate(
        three_jobs(), policy, SimConfig(cycle_interval_s=1.0, restart_cost_s=0, checkpoint_interval_s=None)
    )

    # Nothing happens between t=10 and the tick at 31 (b's 30 s minimum runtime + 1): b is stopped then, c
    # starts on the next cycle (debounced to 32), and b starts over from scratch (no checkpoints) after c.
    assert times(result)["c"] == (32, 82)
    assert times(result)["b"] == (0, 182)
    assert result.lost_gpu_s == pytest.approx(31)


def test_capacity_freed_at_an_instant_is_used_by_a_job_arriving_at_the_same_instant():
    w = two_tenants([SimJob("a", "t1", 0, 10), SimJob("b", "t1", 10, 5)], nodes=1)
    result = simulate(w, policies.get("fifo"), FAST)

    assert times(result) == {"a": (0, 10), "b": (10, 15)}


def test_cycles_are_debounced_and_batch_the_arrivals_in_between():
    jobs = [SimJob("a", "t1", 0, 500), SimJob("b", "t1", 1, 500), SimJob("c", "t2", 2, 500)]
    result = simulate(two_tenants(jobs, nodes=2, gpus=4), policies.get("gpupool"), SimConfig(cycle_interval_s=60))

    assert times(result) == {"a": (0, 500), "b": (60, 560), "c": (60, 560)}
    assert result.cycles == 2


def test_node_failure_requeues_its_jobs_which_resume_from_their_checkpoint():
    w = two_tenants([SimJob("a", "t1", 0, 1000)], nodes=1)
    config = SimConfig(
        cycle_interval_s=1.0, restart_cost_s=5, checkpoint_interval_s=30, failures=((100.0, "n0000", 50.0),)
    )
    result = simulate(w, policies.get("gpupool"), config)
    a = result.jobs[0]

    # 90 of the first 100 s are checkpointed; back at 150, 5 s restart, 910 s of work left.
    assert (a.first_start_s, a.finish_s) == (0, 150 + 5 + 910)
    assert a.failures == 1 and a.starts == 2
    assert result.failure_requeues == 1 and result.node_failures == 1
    assert result.lost_gpu_s == pytest.approx(10)
    assert a.queued_s == pytest.approx(50)


def test_a_job_larger_than_its_partition_never_starts_and_the_run_still_ends():
    w = two_tenants([SimJob("big", "t1", 0, 10, millis=2000)], nodes=1, gpus=2)
    result = simulate(w, policies.get("static"), FAST)
    s = summarize(result)

    assert s["never_started"] == 1 and s["finished"] == 0


def test_within_guarantee_counts_jobs_that_waited_while_their_tenant_was_below_its_guarantee():
    result = simulate(three_jobs(), policies.get("fifo"), SimConfig(cycle_interval_s=1.0, guarantee_tolerance_s=10))

    # c waited 90 s although t2 held nothing of its one-card guarantee.
    assert result.jobs[2].starved_s == pytest.approx(90)
    assert summarize(result)["within_guarantee"] == pytest.approx(2 / 3)


def test_same_seed_gives_the_same_figures():
    jobs = [
        SimJob(f"j{i}", f"t{1 + i % 2}", i * 7.0, 50 + (i * 37) % 400, millis=1000 * (1 + i % 3)) for i in range(60)
    ]
    w = two_tenants(jobs, nodes=3, gpus=4)
    config = SimConfig(cycle_interval_s=5, mtbf_s=2000, repair_s=100, seed=3)

    def figures():
        s = summarize(simulate(w, policies.get("gpupool-random", min_runtime_before_preempt_s=10), config))
        return {k: v for k, v in s.items() if k not in ("wall_s", "plan_ms_per_cycle")}

    first = figures()
    assert first == figures()
    assert first["node_failures"] > 0


def test_a_preemptor_gets_the_capacity_its_victims_freed_before_they_can_take_it_back():
    jobs = [SimJob("a", "t1", 0, 200), SimJob("b", "t1", 0, 200), SimJob("c", "t2", 20, 50)]
    # FIFO order puts the requeued victim b (submitted first) ahead of its preemptor c. The borrowing back-off,
    # its limit and reclaim by usage are off, to show what the holds alone do: without holds and back-off, reclaim by
    # usage would stop a and b in turn (each re-borrowing the card the other freed) and neither would finish.
    policy = policies.get(
        "gpupool",
        ordering="fifo",
        min_runtime_before_preempt_s=10,
        grace_period_s=5,
        borrow_backoff_s=None,
        borrow_preemption_limit=None,
        max_preemptions_per_job=None,
        reclaim_by_usage=False,
    )

    held = simulate(two_tenants(jobs), policy, FAST)
    loop = simulate(two_tenants(jobs), policy, SimConfig(cycle_interval_s=1.0, hold_for_preemptor=False))

    assert times(held)["c"] == (25, 75)
    assert held.preemptions == 1
    # Without the engine's holds fed back, b would re-borrow the freed card each time and c preempt it again
    # once b is 10 s old; c's claim on its tenant's guarantee (issue 33) now keeps b from borrowing that card.
    assert loop.preemptions == 1
    assert times(loop)["c"][0] <= 25 + 1.0


def test_total_time_queued_counts_the_wait_after_a_preemption_and_starvation_while_others_borrow():
    policy = policies.get("gpupool", min_runtime_before_preempt_s=0, grace_period_s=5, borrow_backoff_s=None)
    config = SimConfig(cycle_interval_s=1.0, restart_cost_s=3, checkpoint_interval_s=4)
    result = simulate(three_jobs(), policy, config)
    s = summarize(result)

    # b first starts at 0 but waits 15..65 after its preemption; c waits 10..15 while t1 borrows c's card.
    assert s["queue_delay_avg_s"] == pytest.approx(5 / 3)
    assert s["queued_avg_s"] == pytest.approx((0 + 50 + 5) / 3)
    assert result.starved_while_borrowed_s == pytest.approx(5.0)
    assert s["starved_while_borrowed"] == pytest.approx(5.0 / 156)
    assert s["preemptions_per_job_max"] == 1
    assert s["preempted_3plus"] == 0
    assert s["jct_p95_s"] == pytest.approx(100 + 0.9 * (156 - 100))  # [55, 100, 156] at rank 1.9


def test_per_tenant_rows_cover_every_tenant():
    from scheduler.sim.metrics import per_tenant

    rows = per_tenant(simulate(three_jobs(), policies.get("static"), FAST))

    assert [r["tenant"] for r in rows] == ["t1", "t2"]
    assert [r["jobs"] for r in rows] == [2, 1]
    assert rows[0]["guarantee_gpus"] == 1


def test_room_in_a_guarantee_is_owed_to_one_waiting_job_at_a_time_in_queue_order():
    jobs = [SimJob("a", "t1", 0, 100), SimJob("b", "t1", 0, 100), SimJob("c", "t2", 10, 50), SimJob("d", "t2", 10, 50)]
    policy = policies.get("gpupool", min_runtime_before_preempt_s=0, grace_period_s=5)
    result = simulate(two_tenants(jobs), policy, SimConfig(cycle_interval_s=1.0, guarantee_tolerance_s=3))
    c, d = result.jobs[2], result.jobs[3]

    # t2's one-card guarantee is borrowed by b; c reclaims it and starts at 15. d would fit in the same card on
    # its own (starved 5 s alone), but that card is owed to c, ahead of it in t2's queue: d is not starved.
    assert c.first_start_s == 15 and (c.starved_s, c.starved_alone_s) == (5, 5)
    assert (d.starved_s, d.starved_alone_s) == (0, 5)
    s = summarize(result)
    assert (s["within_guarantee"], s["within_guarantee_alone"]) == (pytest.approx(3 / 4), pytest.approx(2 / 4))


def test_the_room_skips_a_job_too_big_for_it_and_goes_to_a_smaller_one_behind():
    # t2's two cards are borrowed by t1 until 100; t2's 4-card job is first in its queue but can never be owed
    # room in a 2-card guarantee: the one-card job behind it is owed a card and is starved, the big one is not.
    w = two_tenants(
        [
            SimJob("a", "t1", 0, 100, millis=4000),
            SimJob("big", "t2", 10, 50, millis=4000),
            SimJob("small", "t2", 11, 50),
        ],
        nodes=1,
        gpus=4,
    )
    result = simulate(w, policies.get("fifo"), SimConfig(cycle_interval_s=1.0, guarantee_tolerance_s=10))
    _, big, small = result.jobs

    assert big.starved_s == 0 and big.starved_alone_s == 0
    assert small.starved_s == pytest.approx(100 - 11) and small.starved_alone_s == pytest.approx(100 - 11)


def test_a_borrower_is_preempted_at_most_three_times_then_borrows_only_guarantee_left_idle_for_a_while():
    # t1's 2-card job can only run on loan (t1's guarantee is one card); t2 sends a one-card job every 100 s.
    # Each reclaims its card, until the big job reaches the ceiling. From then on it may not be preempted, so
    # it borrows again only once t2's use has decayed (half-life 1 h): t2's later jobs start at once.
    jobs = [SimJob("big", "t1", 0, 1000, millis=2000)] + [SimJob(f"s{i}", "t2", 100.0 * i, 20) for i in range(1, 9)]
    w = two_tenants(jobs, nodes=1, gpus=2)

    def run(ceiling):
        policy = policies.get(
            "gpupool",
            min_runtime_before_preempt_s=10,
            grace_period_s=5,
            borrow_backoff_s=None,
            max_preemptions_per_job=ceiling,
        )
        return simulate(w, policy, SimConfig(cycle_interval_s=1.0, guarantee_tolerance_s=30))

    capped, uncapped = run(3), run(None)

    assert capped.jobs[0].preemptions == 3
    assert uncapped.jobs[0].preemptions == 8
    assert all(j.first_start_s - j.submit_s <= 5 for j in capped.jobs[1:])  # t2 never waits past the grace
    assert summarize(capped)["within_guarantee"] == 1.0
    assert capped.jobs[0].finish_s > 3600 + uncapped.jobs[0].finish_s  # the price: the big job waits for idle


def test_the_longest_owed_wait_beyond_the_reclaim_promise_is_reported_per_tenant():
    from scheduler.sim.metrics import per_tenant

    # t2's card is borrowed by b when c arrives at 10. The promise: grace 5 + minimum runtime 0 + one 1 s cycle.
    quick = {"min_runtime_before_preempt_s": 0, "grace_period_s": 5, "borrow_backoff_s": None}
    kept = simulate(three_jobs(), policies.get("gpupool", **quick), FAST)
    broken = simulate(three_jobs(), policies.get("fifo", **quick), FAST)  # no preemption: c waits until 100

    assert kept.reclaim_bound_s == broken.reclaim_bound_s == 6
    assert {r["tenant"]: r["owed_wait_beyond_s"] for r in per_tenant(kept)} == {"t1": 0, "t2": 0}
    assert {r["tenant"]: r["owed_wait_beyond_s"] for r in per_tenant(broken)} == {"t1": 0, "t2": 90 - 6}
    assert summarize(broken)["owed_wait_max_s"] == 90 - 6
