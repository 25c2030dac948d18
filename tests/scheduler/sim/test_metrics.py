"""Percentiles, Jain's index and the fragmentation experiment."""

from __future__ import annotations

import math

import pytest

from scheduler.sim import fragmentation
from scheduler.sim.metrics import jain_index, percentile
from scheduler.sim.workload import SimJob, uniform_nodes


def test_percentile_interpolates_between_closest_ranks():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([7], 95) == 7
    assert math.isnan(percentile([], 95))


def test_jain_index_is_one_when_equal_and_one_over_n_when_one_takes_all():
    assert jain_index([2, 2, 2]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([1, 3]) == pytest.approx(16 / 20)


def half_half_whole() -> list[SimJob]:
    return [
        SimJob("h1", "t", 0, 1, millis=500, memory_mib=1),
        SimJob("h2", "t", 0, 1, millis=500, memory_mib=1),
        SimJob("w", "t", 0, 1, millis=1000),
    ]


def test_best_fit_packs_halves_on_one_card_and_leaves_a_whole_card_free():
    curve = fragmentation.fill_cluster(
        uniform_nodes(1, 2), half_half_whole(), "best_fit", max_load=1.0, batch=1, sample=False
    )

    assert curve.placed == 3
    assert curve.unallocated[-1] == 0.0


def test_worst_fit_spreads_halves_and_strands_the_whole_card_request():
    curve = fragmentation.fill_cluster(
        uniform_nodes(1, 2), half_half_whole(), "worst_fit", max_load=1.0, batch=1, sample=False
    )

    assert curve.placed == 2
    assert curve.unallocated[-1] == 0.5
    assert curve.at(1.0) == 0.5


def test_a_batch_places_what_one_by_one_arrivals_would():
    tasks = [SimJob(f"t{i}", "t", 0, 1, millis=m, memory_mib=1) for i, m in enumerate([300, 700, 600, 1000, 400])]
    nodes = uniform_nodes(2, 2)
    one = fragmentation.fill_cluster(nodes, tasks, "best_fit", max_load=1.3, batch=1, seed=4)
    many = fragmentation.fill_cluster(nodes, tasks, "best_fit", max_load=1.3, batch=50, seed=4)

    assert one.unallocated[-1] == many.unallocated[-1]
    assert one.placed == many.placed


def test_the_asked_curve_reads_both_axes_as_the_tasks_asked():
    # 460 millis asked, 500 allocated (as with steps of 100 millis): four of them fill two cards as the engine counts,
    # but the tasks asked for only 1,840 of 2,000 millis.
    tasks = [SimJob(f"f{i}", "t", 0, 1, millis=500, memory_mib=1, trace_millis=460) for i in range(5)]
    curve = fragmentation.fill_cluster(uniform_nodes(1, 2), tasks, "best_fit", max_load=1.0, batch=1, sample=False)

    assert curve.placed == 4
    assert curve.arrived_trace[3] == pytest.approx(0.92)
    assert curve.arrived[3] == pytest.approx(1.0)
    assert curve.at(1.0) == pytest.approx(0.0)  # rounded: full at 100 % arrived
    # asked: the fifth task (460) is dropped; 1,840 of 2,000 millis allocated as asked, read at 100 % asked
    assert curve.arrived_trace[-1] >= 1.0
    assert curve.at(1.0, trace=True) == pytest.approx(0.08)


def test_the_artifacts_rules_place_what_fits_and_stop_at_the_cpu():
    from dataclasses import replace as with_

    small = with_(uniform_nodes(1, 2, prefix="small")[0], cpu_millicores=3000, host_memory_mib=1 << 20)
    big = with_(uniform_nodes(1, 2, prefix="big")[0], cpu_millicores=64000, host_memory_mib=1 << 20)
    task = SimJob("t", "t", 0, 1, millis=1000, cpu_millicores=2000)
    for rule in fragmentation.ARTIFACT_RULES:
        curve = fragmentation.fill_cluster_node_rule([small, big], [task], rule, max_load=1.0, seed=3)
        # the 3-core node runs one 2-core task; its second card strands: 3 of 4 cards allocated
        assert curve.placed == 3, rule
        assert curve.at(1.0, trace=True) == pytest.approx(0.25), rule
    with pytest.raises(ValueError, match="unknown rule"):
        fragmentation.fill_cluster_node_rule([small, big], [task], "packing")
