"""Never fits (``scheduler.core.feasibility``): the largest shape the registered pool and the quota tree can ever
give, and what the cycle does with a job above it (issue 33, item 2)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import plan
from scheduler.core.engine import _Cycle
from scheduler.core.feasibility import Bound, fleets_of, job_never_fits, quota_paths
from scheduler.core.types import PendingReason, Policy, Quota, Snapshot, Tenant, Topology

from .builders import FLAVOR, MEM, job, node, quota, snapshot


def _never_fits(s: Snapshot, j):
    return job_never_fits(j, fleets_of(s.nodes), quota_paths(j.tenant, s.tenants, s.quotas))


def test_every_registered_node_counts_whatever_its_state():
    # Cordoned or not ready, with unhealthy cards: they may come back, so the job is not impossible.
    nodes = [node("n1", 8, schedulable=False, unhealthy=(0, 1, 2)), node("n2", 2)]
    fleet = fleets_of(nodes)[FLAVOR]
    assert (fleet.cards, fleet.max_cards_per_node, fleet.max_card_memory_mib) == (10, 8, MEM)
    s = snapshot(nodes, pending=[job("j", cards=8)])
    assert _never_fits(s, s.pending[0]) is None
    assert {e.code for e in plan(s, Policy()).explanations} != {PendingReason.NEVER_FITS}


def test_a_job_naming_several_flavors_never_fits_only_when_it_fits_none():
    nodes = [node("n1", 8), node("a1", 4, flavor="ascend-910b")]
    s = snapshot(nodes, pending=[job("both", cards=6, flavor=("ascend-910b", FLAVOR)), job("none", cards=9)])
    assert _never_fits(s, s.pending[0]) is None
    why = _never_fits(s, s.pending[1])
    assert why is not None and [r.bound for r in why.refusals] == [Bound.CARDS_PER_NODE]
    both_refused = _never_fits(s, job("x", cards=9, flavor=("ascend-910b", FLAVOR)))
    assert [(r.flavor, r.largest) for r in both_refused.refusals] == [("ascend-910b", 4), (FLAVOR, 8)]


def test_a_flavor_without_registered_nodes_is_judged_by_its_quota_tree_only():
    s = snapshot([node("n1", 8)], quotas=[quota("team-a", 2, 4, flavor="ascend-910b")])
    assert _never_fits(s, job("j", cards=64, flavor="ascend-910b")) is not None  # over the limit of 4
    assert _never_fits(s, job("j", cards=3, flavor="ascend-910b")) is None  # no node yet: nothing to judge


def test_the_tightest_limit_up_the_tree_bounds_the_job_and_a_job_that_cannot_borrow_its_guarantee():
    tenants = (Tenant("acme"), Tenant("team-a", parent="acme"))
    quotas = (quota("acme", 4, 6), quota("team-a", 2, 8))
    s = snapshot([node("n1", 8)], tenants=tenants, quotas=quotas)
    over = _never_fits(s, job("j", cards=7))
    assert (over.refusals[0].bound, over.refusals[0].by, over.refusals[0].largest) == (Bound.QUOTA_LIMIT, "acme", 6)
    assert _never_fits(s, job("j", cards=6)) is None
    firm = _never_fits(s, job("j", cards=3, preemptible=False))
    assert (firm.refusals[0].bound, firm.refusals[0].field, firm.refusals[0].largest) == (
        Bound.GUARANTEE,
        "preemptible",
        2,
    )


def test_same_node_gangs_and_host_cpu_are_bounded_by_the_largest_node():
    s = snapshot([replace(node("n1", 4), cpu_millicores=32_000), replace(node("n2", 4), cpu_millicores=16_000)])
    same = _never_fits(s, job("j", cards=2, replicas=3, topology=Topology.SAME_NODE))
    assert (same.refusals[0].bound, same.refusals[0].field) == (Bound.SAME_NODE, "topology")
    assert _never_fits(s, job("j", cards=2, replicas=3)) is None  # spread over both nodes it fits
    big = job("j", cards=1)
    cpu = _never_fits(s, replace(big, request=replace(big.request, cpu_millicores=48_000)))
    assert (cpu.refusals[0].bound, cpu.refusals[0].largest) == (Bound.NODE_CPU, 32)


def test_an_impossible_job_at_the_head_of_the_queue_does_not_block_the_jobs_behind_it():
    # Without backfill the head of a flavor's queue holds back everything behind it; an impossible head would
    # have held the pool forever.
    pending = [job("huge", cards=16, submitted_at=1, priority=1000), job("small", cards=2, submitted_at=2)]
    result = plan(snapshot([node("n1", 8)], pending=pending), Policy(backfill=False))
    assert [p.job_id for p in result.places] == ["small"]
    (why,) = result.explanations
    assert (why.job_id, why.code) == ("huge", PendingReason.NEVER_FITS)
    assert why.message == (
        f"per-replica cards: 16 asked, the largest {FLAVOR} node has 8; it cannot start until nodes or quotas change"
    )


# -- soundness: never a refusal of a job the engine could place ------------------------------------------------------


@st.composite
def cases(draw):
    nodes = [
        replace(
            node(f"n{i}", draw(st.integers(1, 4)), memory_mib=draw(st.sampled_from([8192, 16384]))),
            cpu_millicores=draw(st.sampled_from([None, 8000, 16000])),
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    fractional = draw(st.booleans())
    request_cards = draw(st.integers(1, 5))
    pending = job(
        "j",
        cards=None if fractional else request_cards,
        millis=draw(st.sampled_from([300, 500, 900])) if fractional else None,
        memory_mib=draw(st.sampled_from([4096, 8192, 16384, 20000])) if fractional else 0,
        replicas=draw(st.integers(1, 6)),
        topology=draw(st.sampled_from([Topology.NONE, Topology.SAME_NODE])),
        preemptible=draw(st.booleans()),
    )
    pending = replace(pending, request=replace(pending.request, cpu_millicores=draw(st.sampled_from([0, 4000, 12000]))))
    limit = draw(st.sampled_from([None, 2, 6, 12]))
    quotas = [
        Quota(
            "team-a",
            FLAVOR,
            guaranteed_millis=draw(st.sampled_from([0, 2000, 12000])) if limit is None else min(limit, 2) * 1000,
            limit_millis=None if limit is None else limit * 1000,
        )
    ]
    return snapshot(nodes, pending=[pending], quotas=quotas)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_a_job_the_engine_places_on_the_empty_pool_is_never_refused(s):
    # The engine alone (no never-fits step) on an empty pool is the most room the job can ever have.
    placed = bool(_Cycle(s, Policy()).run().places)
    why = _never_fits(s, s.pending[0])
    if placed:
        assert why is None, why
    if why is not None:
        assert not placed
