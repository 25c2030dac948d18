"""Trace loaders on small fixtures in the real formats, and on the real traces when they are present."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from scheduler.sim import loaders
from scheduler.sim.workload import proportional_split

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
REAL = loaders.traces_dir()
needs_real_traces = pytest.mark.skipif(
    not (REAL / loaders.PHILLY_CSV).is_file(), reason=f"real traces not found in {REAL} (set GPUPOOL_TRACES_DIR)"
)


def test_philly_window_keeps_jobs_submitted_in_it_with_times_from_its_start():
    w = loaders.load_philly(FIXTURES, start=datetime(2017, 10, 1), days=1, cluster=64)
    jobs = {j.job_id: j for j in w.jobs}

    assert sorted(jobs) == ["p0", "p1", "p3", "p4"]  # p2 is before the window, p5 after it
    assert jobs["p1"].submit_s == 600 and jobs["p1"].tenant == "vc-b"
    assert (jobs["p1"].replicas, jobs["p1"].millis) == (2, 8000)  # 16 GPUs: a gang of 2 x 8 cards
    assert (jobs["p3"].replicas, jobs["p3"].millis) == (2, 6000)  # 12 GPUs: 2 x 6
    assert jobs["p4"].duration_s == 1.0  # a zero duration still takes a moment


def test_philly_guarantees_follow_gpu_time_of_the_whole_trace_and_sum_to_the_cluster():
    w = loaders.load_philly(FIXTURES, start=datetime(2017, 10, 1), days=1, cluster=64)

    total = sum(g["gpu"] for g in w.guarantees.values())
    assert total == w.capacity_millis == 64_000
    # GPU time: vc-a 3760, vc-b 31200, vc-c 0 → vc-c gets nothing, vc-b about 89 %.
    assert w.guarantees["vc-b"]["gpu"] == 57_000 and w.guarantees["vc-a"]["gpu"] == 7_000
    assert w.guarantees["vc-c"]["gpu"] == 0  # still a quota row, so it may borrow
    assert all(limit["gpu"] == 64_000 for limit in w.limits.values())


def test_philly_cluster_sizes_from_helios_node_counts_or_peak_demand():
    helios = loaders.load_philly(FIXTURES, start=datetime(2017, 10, 1), days=1, cluster="helios")
    peak = loaders.load_philly(FIXTURES, start=datetime(2017, 10, 1), days=1, cluster="peak")

    assert helios.meta["gpus"] == (2 + 3) * 8
    # p0 (1 GPU) overlaps p1 (16); p1 ends at 00:20 as p3 (12) starts: peak 17, in whole 8-GPU nodes 24.
    assert peak.meta["gpus"] == 24


def test_gang_shape_never_spans_a_node_with_one_replica():
    assert loaders.gang_shape(4, 8) == (1, 4)
    assert loaders.gang_shape(24, 8) == (3, 8)
    assert loaders.gang_shape(12, 8) == (2, 6)


def test_alibaba_tasks_become_fractions_rounded_up_or_whole_cards_with_their_models():
    w = loaders.load_alibaba(FIXTURES)
    jobs = {j.job_id: j for j in w.jobs}

    assert [n.name for n in w.nodes] == ["node-0", "node-1"]  # the node without GPUs is left out
    assert {d.flavor for d in w.nodes[1].devices} == {"V100M32"}
    assert "a2" not in jobs  # CPU-only task
    assert (jobs["a1"].millis, jobs["a1"].memory_mib) == (460, 1)  # 460 millis: a step of 10, kept
    assert (loaders.fraction_millis(455), loaders.fraction_millis(50)) == (460, 100)  # up to a step, at least 100
    assert jobs["a1"].duration_s == 450 and jobs["a1"].tenant == "be"
    assert jobs["a1"].flavors == ("V100M32", "T4")  # no gpu_spec: any model, the largest pool first
    assert (jobs["a3"].millis, jobs["a3"].flavors) == (2000, ("V100M32",))
    assert jobs["a3"].duration_s == 2000  # never scheduled: from creation
    assert jobs["a4"].flavors == ("T4",)  # P100 is not in this cluster
    assert jobs["a0"].submit_s == 0  # times from the first arrival


def test_traces_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPOOL_TRACES_DIR", str(tmp_path))
    assert loaders.traces_dir() == tmp_path
    with pytest.raises(loaders.TraceNotFound, match="GPUPOOL_TRACES_DIR"):
        loaders.load_philly()


def test_proportional_split_sums_exactly_and_is_deterministic():
    split = proportional_split(10_000, {"a": 1, "b": 1, "c": 1})
    assert sum(split.values()) == 10_000
    assert split == {"a": 4000, "b": 3000, "c": 3000}


@needs_real_traces
def test_real_philly_has_its_virtual_clusters_as_tenants():
    w = loaders.load_philly(start=datetime(2017, 10, 1), days=1, guarantees_from="trace")

    assert len(w.jobs) > 200
    assert len(w.guarantees) == 15
    assert sum(g["gpu"] for g in w.guarantees.values()) == w.capacity_millis


@needs_real_traces
def test_real_philly_guarantees_are_sized_from_the_replayed_window_by_default():
    w = loaders.load_philly(start=datetime(2017, 10, 1), days=1)

    # Only the tenants that submit in the window get a guarantee, in proportion to their GPU time there.
    assert set(w.guarantees) == {j.tenant for j in w.jobs}
    assert sum(g["gpu"] for g in w.guarantees.values()) == w.capacity_millis
    gpu_time = {t: sum(j.gpus * j.duration_s for j in w.jobs if j.tenant == t) for t in w.guarantees}
    biggest = max(gpu_time, key=gpu_time.get)
    assert w.guarantees[biggest]["gpu"] == max(g["gpu"] for g in w.guarantees.values())


@needs_real_traces
def test_real_alibaba_cluster_has_1213_nodes_of_7_models():
    w = loaders.load_alibaba(max_jobs=100)

    assert len(w.nodes) == 1213
    assert w.meta["gpus"] == 6212
    assert len({d.flavor for n in w.nodes for d in n.devices}) == 7
    assert all(j.millis % 10 == 0 for j in w.jobs)
