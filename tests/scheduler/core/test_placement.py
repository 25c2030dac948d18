"""Step 3: filter, score (best-fit fractions, topology, energy mode) and gang all-or-nothing."""

from __future__ import annotations

from scheduler.core import plan
from scheduler.core.types import FractionalStrategy, PendingReason, Policy, Topology

from .builders import alloc, job, node, snapshot


def _devices(place) -> list[str]:
    return [a.device_uuid for a in place.assignments]


def _explained(result, job_id):
    return next(e for e in result.explanations if e.job_id == job_id)


def test_fraction_goes_onto_the_fullest_card_that_fits():
    s = snapshot(
        [node("n1", 4)],
        allocations=[
            alloc("x", "n1-gpu0", millis=300, memory_mib=8000),
            alloc("y", "n1-gpu1", millis=600, memory_mib=8000),
            alloc("z", "n1-gpu2", millis=800, memory_mib=8000),
        ],
        pending=[job("j", millis=300, memory_mib=4096)],
    )
    (place,) = plan(s, Policy()).places
    assert _devices(place) == ["n1-gpu1"]  # 400 free: the tightest fit (gpu2 has only 200)
    assert place.assignments[0].millis == 300
    assert place.assignments[0].memory_mib == 4096


def test_fraction_respects_card_memory():
    s = snapshot(
        [node("n1", 2)],
        allocations=[alloc("x", "n1-gpu0", millis=300, memory_mib=80000)],
        pending=[job("j", millis=300, memory_mib=4096)],
    )
    (place,) = plan(s, Policy()).places
    assert _devices(place) == ["n1-gpu1"]


def test_worst_fit_spreads_fractions_onto_empty_cards():
    s = snapshot(
        [node("n1", 2)],
        allocations=[alloc("x", "n1-gpu0", millis=300, memory_mib=8000)],
        pending=[job("j", millis=300, memory_mib=4096)],
    )
    (place,) = plan(s, Policy(fractional_strategy=FractionalStrategy.WORST_FIT)).places
    assert _devices(place) == ["n1-gpu1"]


def test_random_fraction_strategy_is_reproducible_with_a_seed():
    s = snapshot(
        [node("n1", 8)],
        allocations=[alloc(f"x{i}", f"n1-gpu{i}", millis=200, memory_mib=100) for i in range(8)],
        pending=[job(f"j{i}", millis=300, memory_mib=100, submitted_at=i) for i in range(6)],
    )
    policy = Policy(fractional_strategy=FractionalStrategy.RANDOM, seed=7)
    assert plan(s, policy).places == plan(s, policy).places


def test_fresh_card_for_a_fraction_comes_from_the_busiest_node():
    s = snapshot(
        [node("idle", 4), node("busy", 4)],
        allocations=[alloc("x", "busy-gpu0"), alloc("y", "busy-gpu1")],
        pending=[job("j", millis=500, memory_mib=1024)],
    )
    (place,) = plan(s, Policy()).places
    assert place.assignments[0].node == "busy"


def test_whole_cards_prefer_the_node_with_fewest_free_cards_that_fit():
    s = snapshot(
        [node("big", 8), node("small", 4)],
        allocations=[alloc("x", "small-gpu0")],
        pending=[job("j", cards=2)],
    )
    (place,) = plan(s, Policy()).places
    assert {a.node for a in place.assignments} == {"small"}


def test_whole_cards_are_exclusive_and_take_the_full_memory():
    s = snapshot([node("n1", 1)], pending=[job("a", cards=1), job("b", millis=100, memory_mib=10, submitted_at=1)])
    result = plan(s, Policy())
    assert [p.job_id for p in result.places] == ["a"]
    assert result.places[0].assignments[0].memory_mib == 81920
    assert _explained(result, "b").code in (PendingReason.INSUFFICIENT_CAPACITY, PendingReason.INSUFFICIENT_MEMORY)


def test_multi_card_replica_prefers_an_nvlink_domain():
    n = node("n1", 8, nvlink=["a", "a", "b", "b", "b", "b", None, None], pcie=["p0"] * 4 + ["p1"] * 4)
    s = snapshot([n], allocations=[alloc("x", "n1-gpu0")], pending=[job("j", cards=4)])
    (place,) = plan(s, Policy()).places
    assert _devices(place) == ["n1-gpu2", "n1-gpu3", "n1-gpu4", "n1-gpu5"]


def test_pcie_switch_beats_numa_beats_across_node():
    n = node("n1", 4, pcie=["p0", "p1", "p1", "p2"], numa=[0, 0, 1, 1])
    (place,) = plan(snapshot([n], pending=[job("j", cards=2)]), Policy()).places
    assert _devices(place) == ["n1-gpu1", "n1-gpu2"]
    n2 = node("n2", 4, numa=[0, 1, 1, 0])
    s2 = snapshot([n2], allocations=[alloc("x", "n2-gpu0")], pending=[job("j", cards=2)])
    (place2,) = plan(s2, Policy()).places
    assert _devices(place2) == ["n2-gpu1", "n2-gpu2"]


def test_node_with_nvlink_wins_over_a_tighter_node_without():
    plain = node("plain", 2)
    linked = node("linked", 4, nvlink=["a", "a", "a", "a"])
    s = snapshot([plain, linked], pending=[job("j", cards=2)])
    (place,) = plan(s, Policy()).places
    assert {a.node for a in place.assignments} == {"linked"}


def test_required_nvlink_topology_is_explained_when_missing():
    n = node("n1", 4, nvlink=["a", "a", "b", "b"])
    result = plan(snapshot([n], pending=[job("j", cards=4, topology=Topology.NVLINK)]), Policy())
    assert not result.places
    explain = _explained(result, "j")
    assert explain.code == PendingReason.TOPOLOGY
    assert "no node has 4 free nvidia-h100-80g cards on one NVLink domain" in explain.message


def test_energy_mode_packs_onto_busy_nodes():
    linked_idle = node("idle", 8, nvlink=["a"] * 8)
    busy = node("busy", 8)
    s = snapshot([linked_idle, busy], allocations=[alloc("x", "busy-gpu0")], pending=[job("j", cards=2)])
    (normal,) = plan(s, Policy()).places
    (packed,) = plan(s, Policy(energy_mode=True)).places
    assert {a.node for a in normal.assignments} == {"idle"}  # better link wins normally
    assert {a.node for a in packed.assignments} == {"busy"}


def test_unhealthy_and_cordoned_devices_are_filtered_out():
    s = snapshot(
        [node("cordoned", 8, schedulable=False), node("n1", 2, unhealthy=(0,))],
        pending=[job("j", cards=1), job("k", cards=1, submitted_at=1)],
    )
    result = plan(s, Policy())
    assert [_devices(p) for p in result.places] == [["n1-gpu1"]]


def test_node_selector_filters_nodes_and_explains_a_miss():
    s = snapshot(
        [node("a", 2, labels={"zone": "a"}), node("b", 2, labels={"zone": "b"})],
        pending=[job("j", node_selector={"zone": "b"}), job("k", node_selector={"zone": "c"}, submitted_at=1)],
    )
    result = plan(s, Policy())
    assert [p.assignments[0].node for p in result.places] == ["b"]
    assert _explained(result, "k").code == PendingReason.NO_MATCHING_NODE


def test_unknown_flavor_is_explained():
    result = plan(snapshot([node("n1", 1)], pending=[job("j", flavor="ascend-910b")]), Policy(require_quota=False))
    assert _explained(result, "j").code == PendingReason.NO_SUCH_FLAVOR


def test_gang_places_all_replicas_across_nodes():
    s = snapshot([node("n1", 4), node("n2", 4)], pending=[job("g", cards=4, replicas=2)])
    (place,) = plan(s, Policy()).places
    assert place.replicas == 2
    assert {a.node for a in place.assignments if a.replica == 0} != {
        a.node for a in place.assignments if a.replica == 1
    }


def test_gang_is_all_or_nothing():
    s = snapshot(
        [node("n1", 4), node("n2", 4)],
        allocations=[alloc("x", "n2-gpu0", preemptible=False)],
        pending=[job("g", cards=4, replicas=2), job("small", cards=2, submitted_at=1)],
    )
    result = plan(s, Policy())
    assert "g" not in [p.job_id for p in result.places]
    explain = _explained(result, "g")
    assert explain.code == PendingReason.GANG
    assert "only 1 of 2 replicas fit at once" in explain.message


def test_same_node_topology_keeps_all_replicas_together():
    s = snapshot([node("n1", 2), node("n2", 4)], pending=[job("g", cards=2, replicas=2, topology=Topology.SAME_NODE)])
    (place,) = plan(s, Policy()).places
    assert {a.node for a in place.assignments} == {"n2"}
    assert sorted({a.replica for a in place.assignments}) == [0, 1]


def test_same_node_fractions_share_one_node():
    s = snapshot(
        [node("n1", 1), node("n2", 1)],
        allocations=[alloc("x", "n1-gpu0", millis=500, memory_mib=1000)],
        pending=[job("g", millis=400, memory_mib=1000, replicas=2, topology=Topology.SAME_NODE)],
    )
    (place,) = plan(s, Policy()).places
    assert {a.node for a in place.assignments} == {"n2"}


def test_invalid_fraction_is_explained():
    bad = job("j", millis=255, memory_mib=100)
    result = plan(snapshot([node("n1", 1)], pending=[bad]), Policy())
    explain = _explained(result, "j")
    assert explain.code == PendingReason.INVALID_REQUEST
    assert "multiple of 10 millis" in explain.message


def test_inference_places_between_min_and_wanted_replicas_and_reserves_up_to_max():
    s = snapshot(
        [node("n1", 3)],
        pending=[job("svc", kind="inference", replicas=4, min_replicas=2, max_replicas=6)],
    )
    (place,) = plan(s, Policy()).places
    assert place.replicas == 3
    assert place.reserved == ()  # nothing left to reserve
    s2 = snapshot([node("n1", 8)], pending=[job("svc", kind="inference", replicas=2, min_replicas=1, max_replicas=5)])
    (place2,) = plan(s2, Policy()).places
    assert place2.replicas == 2
    assert sorted(a.replica for a in place2.reserved) == [2, 3, 4]
