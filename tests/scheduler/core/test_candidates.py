"""A preemption search's candidates read lazily (``scheduler.core.candidates.Streamed``) are exactly the list
the search built before: the same cheapest nodes, and on each the same victims in the same order."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from scheduler.core import candidates, plan, preempt
from scheduler.core.candidates import Listed, Streamed, Tier
from scheduler.core.preempt import Victim
from scheduler.core.types import JobKind, Policy, PreemptReason

ROOT = Path(__file__).resolve().parents[3]


def _victim(job_id: str, priority: int, nodes: list[int], lost: float = 1.0) -> Victim:
    return Victim(
        job_id=job_id,
        tenant="t",
        flavor="f",
        priority=priority,
        preemptible=True,
        borrowed_millis=0,
        started_at=0.0,
        work_since_checkpoint_s=0.0,
        kind=JobKind.TRAINING,
        reservation_of=None,
        lost_gpu_s=lost,
        nodes=nodes,
    )


def _tier(victims: list[Victim], reason: PreemptReason, judge=lambda v: True) -> Tier:
    ordered = sorted(victims, key=Victim.cost)
    return Tier(
        lambda: ordered,
        lambda n: [v for v in ordered if n in v.nodes],
        lambda v: reason if judge(v) else None,
    )


def _as_list(tiers_victims: list[tuple[list[Victim], PreemptReason]], judge=lambda v: True) -> Listed:
    pairs = []
    for victims, reason in tiers_victims:  # the old form: one tier's list after the other, not merged
        pairs += [(v, reason) for v in sorted(victims, key=Victim.cost) if judge(v)]
    return Listed(pairs)


def test_a_node_is_ranked_by_its_first_candidate_of_the_earliest_tier():
    # Node 2's cheapest job is a relocation (tier 2), but it has a reclaim victim too: it ranks by that one,
    # as the list "reclaims + relocations" ranked it; node 3 has only a relocation and ranks by it.
    reclaim = [_victim("a", 500, [1]), _victim("b", 800, [2])]
    relocate = [_victim("c", 0, [2]), _victim("d", 200, [3])]
    streamed = Streamed([_tier(reclaim, PreemptReason.RECLAIM_BORROWED), _tier(relocate, PreemptReason.RELOCATE)])
    listed = _as_list([(reclaim, PreemptReason.RECLAIM_BORROWED), (relocate, PreemptReason.RELOCATE)])
    every = lambda n: True  # noqa: E731
    assert streamed.cheapest_nodes(3, every) == listed.cheapest_nodes(3, every)
    assert [n for _cost, n in streamed.cheapest_nodes(3, every)] == [3, 1, 2]
    assert [v.job_id for v, _ in streamed.on_node(2)] == ["b", "c"]  # the earlier tier first on the node


def test_a_victim_on_several_nodes_ranks_each_and_ties_go_by_node():
    gang = _victim("g", 0, [7, 4, 9])
    single = _victim("s", 100, [1])
    streamed = Streamed([_tier([gang, single], PreemptReason.PRIORITY)])
    assert streamed.cheapest_nodes(2, lambda n: True) == [(gang.cost(), 4), (gang.cost(), 7)]
    assert streamed.cheapest_nodes(2, lambda n: n != 4) == [(gang.cost(), 7), (gang.cost(), 9)]


def test_picked_victims_leave_the_walk_and_every_node():
    victims = [_victim(f"v{i}", i % 3 * 100, [i % 4], lost=i) for i in range(12)]
    streamed = Streamed([_tier(victims, PreemptReason.PRIORITY)]).without({"v0", "v4", "v8"})
    listed = _as_list([(victims, PreemptReason.PRIORITY)]).without({"v0", "v4", "v8"})
    every = lambda n: True  # noqa: E731
    assert streamed.cheapest_nodes(4, every) == listed.cheapest_nodes(4, every)
    for n in range(4):
        assert list(streamed.on_node(n)) == list(listed.on_node(n))
    assert not Streamed([_tier(victims[:1], PreemptReason.PRIORITY)]).without({"v0"})


def test_a_judge_is_asked_once_per_job_and_the_walks_agree():
    asked: list[str] = []

    def judge(v: Victim) -> bool:
        asked.append(v.job_id)
        return int(v.job_id[1:]) % 2 == 0

    victims = [_victim(f"v{i}", 0, [i % 5], lost=i) for i in range(20)]
    streamed = Streamed([_tier(victims, PreemptReason.PRIORITY, judge)])
    first = streamed.cheapest_nodes(2, lambda n: True)
    again = streamed.without(set()).cheapest_nodes(5, lambda n: True)
    assert first == again[:2]
    for n in range(5):
        streamed.on_node(n)
    assert sorted(asked) == sorted({v.job_id for v in victims})  # each once, though walked twice and by node


@pytest.mark.parametrize(("nodes", "jobs", "seed"), [(40, 400, 5), (100, 1000, 1)])
def test_every_search_of_a_seeded_cycle_reads_what_the_list_would_give(monkeypatch, nodes, jobs, seed):
    """The engine's real searches (reclaim, priority, gangs, relocation's second tier) compared, search by
    search, with the list built from the same tiers."""
    bench = runpy.run_path(str(ROOT / "benchmarks" / "scheduler_cycle.py"))
    searched = preempt.Preemptor._search_per_node
    compared = {"searches": 0, "tiers": 0}

    def both(self, job, flavor, count, cands, max_nodes=preempt.MAX_NODES, prior=None):
        if isinstance(cands, candidates.Streamed):
            pairs = []
            for tier in cands.tiers:
                pairs += [(v, r) for v, r in tier.walk() if v.job_id not in cands.picked]
            listed = Listed(pairs)
            matches = lambda n: self.placer.node_matches(n, job.node_selector)  # noqa: E731
            assert cands.cheapest_nodes(max_nodes, matches) == listed.cheapest_nodes(max_nodes, matches)
            for _cost, n in listed.cheapest_nodes(max_nodes, matches):
                assert list(cands.on_node(n)) == list(listed.on_node(n))
            compared["searches"] += 1
            compared["tiers"] = max(compared["tiers"], len(cands.tiers))
        return searched(self, job, flavor, count, cands, max_nodes, prior)

    monkeypatch.setattr(preempt.Preemptor, "_search_per_node", both)
    result = plan(bench["build_snapshot"](nodes, jobs, seed=seed), Policy())
    assert result.preemptions
    assert compared["searches"] > 20
    assert compared["tiers"] == 2  # relocation's second tier was searched too
