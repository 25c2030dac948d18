"""Issue 18: promises kept under overload — host CPU and memory, guarantees first and reclaim uncapped, churn
protection, aged gangs, numeric tie-breaks, fragmentation-aware fractions."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core import plan
from scheduler.core.fragment import expected_unusable_millis
from scheduler.core.types import FractionalStrategy, Ordering, PendingReason, Policy, PreemptReason

from .builders import FLAVOR, alloc, job, node, quota, snapshot

NOW = 10_000.0


def with_host(n, cpu_cores: int, host_gib: int = 512):
    return replace(n, cpu_millicores=cpu_cores * 1000, host_memory_mib=host_gib * 1024)


def host_job(job_id: str, tenant: str = "team-a", *, cpu_cores: int, cards: int = 1, host_gib: int = 0, **kw):
    j = job(job_id, tenant, cards=cards, **kw)
    return replace(j, request=replace(j.request, cpu_millicores=cpu_cores * 1000, host_memory_mib=host_gib * 1024))


# -- CPU cores and host memory ------------------------------------------------------------------------------


def test_explanation_names_the_cpu_cores_missing_beside_free_cards():
    # n2 has the cores but one card: the job fits the pool's shape, just not any node's free room.
    nodes = [with_host(node("n1", 2), cpu_cores=8), with_host(node("n2", 1), cpu_cores=16)]
    s = snapshot(nodes, pending=[host_job("big", cards=2, cpu_cores=16)])

    result = plan(s, Policy())

    assert result.places == ()
    (why,) = result.explanations
    assert why.code == PendingReason.INSUFFICIENT_HOST
    assert why.message.startswith(f"no node has 16 free CPU cores beside 2 free {FLAVOR} cards")


def test_cards_go_to_the_node_that_also_has_the_cpu_and_host_memory():
    busy = with_host(node("n1", 8), cpu_cores=4)  # fewest free cards, so best fit would pick it
    roomy = with_host(node("n2", 8), cpu_cores=64)
    s = snapshot(
        [busy, roomy],
        allocations=[alloc("r", f"n1-gpu{i}", cpu_millicores=0) for i in range(6)],
        pending=[host_job("j", cards=2, cpu_cores=8, host_gib=64)],
    )

    (place,) = plan(s, Policy()).places

    assert {a.node for a in place.assignments} == {"n2"}
    assert sum(a.cpu_millicores for a in place.assignments) == 8000
    assert sum(a.host_memory_mib for a in place.assignments) == 64 * 1024


def test_cpu_held_by_running_work_counts_and_preemption_frees_it():
    n = with_host(node("n1", 4), cpu_cores=16)
    victim = alloc("low", "n1-gpu0", "team-a", priority=200, started_at=0.0, cpu_millicores=16_000)
    s = snapshot([n], allocations=[victim], pending=[host_job("high", cpu_cores=8, priority=800)])

    result = plan(s, Policy())

    # Three cards are free, but not one CPU core: the lower-priority job holding them is preempted.
    assert result.places == ()
    assert [(p.job_id, p.reason) for p in result.preemptions] == [("low", PreemptReason.PRIORITY)]


# -- guarantees ---------------------------------------------------------------------------------------------


def test_a_job_within_its_guarantee_is_served_before_a_borrower_with_a_lower_share():
    s = snapshot(
        [node("n1", 2)],
        allocations=[alloc("a-run", "n1-gpu0", "team-a")],
        pending=[job("b1", "team-b", submitted_at=1), job("a1", "team-a", submitted_at=2)],
        quotas=[quota("team-a", 2), quota("team-b", 0)],
        usage={"team-a": {FLAVOR: 4000.0}},  # team-a's share is far above team-b's
    )

    result = plan(s, Policy())

    assert [p.job_id for p in result.places] == ["a1"]


def test_reclaim_for_a_job_within_its_guarantee_is_not_cut_short_by_the_search_cap():
    borrowed = [alloc(f"b{i}", f"n1-gpu{i}", "team-b", borrowed_millis=1000, started_at=0.0) for i in range(2)]
    s = snapshot(
        [node("n1", 2)],
        allocations=borrowed,
        pending=[job("a1", "team-a"), job("b9", "team-b", priority=800)],
        quotas=[quota("team-a", 2), quota("team-b", 0)],
    )

    result = plan(s, Policy(max_preemption_searches=0))

    # a1 reclaims although the cap allows no search; b9 (it would borrow) gets no search.
    assert [(p.job_id, p.victim_of, p.reason) for p in result.preemptions] == [
        ("b0", "a1", PreemptReason.RECLAIM_BORROWED)
    ]


# -- churn --------------------------------------------------------------------------------------------------


def test_priority_protection_doubles_with_each_earlier_preemption():
    def case(preemptions: int):
        running = alloc("low", "n1-gpu0", priority=200, started_at=NOW - 1000, preemptions=preemptions)
        s = snapshot([node("n1", 1)], allocations=[running], pending=[job("high", priority=800)], now=NOW)
        return plan(s, Policy(min_runtime_before_preempt_s=300)).preemptions

    assert [p.job_id for p in case(0)] == ["low"]  # 1000 s > 300 s
    assert [p.job_id for p in case(1)] == ["low"]  # 1000 s > 600 s
    assert case(2) == ()  # 1000 s < 1200 s: still protected


def test_a_job_preempted_as_often_as_the_ceiling_allows_is_not_preempted_again():
    # team-b borrows team-a's card; team-a's job within its guarantee reclaims it — unless the borrower was
    # already preempted three times. Priority preemption inside one tenant stops at the ceiling too.
    def reclaimed(preemptions: int, ceiling: int | None = 3) -> list[str]:
        borrower = alloc(
            "b1", "n1-gpu0", "team-b", borrowed_millis=1000, started_at=NOW - 5000, preemptions=preemptions
        )
        s = snapshot(
            [node("n1", 1)],
            allocations=[borrower],
            pending=[job("a1", "team-a")],
            quotas=[quota("team-a", 1), quota("team-b", 0)],
            now=NOW,
        )
        return [p.job_id for p in plan(s, Policy(max_preemptions_per_job=ceiling)).preemptions]

    def by_priority(preemptions: int) -> list[str]:
        low = alloc("low", "n1-gpu0", priority=200, started_at=NOW - 100_000, preemptions=preemptions)
        s = snapshot([node("n1", 1)], allocations=[low], pending=[job("high", priority=800)], now=NOW)
        return [p.job_id for p in plan(s, Policy()).preemptions]

    assert reclaimed(2) == ["b1"]
    assert reclaimed(3) == []
    assert reclaimed(3, ceiling=None) == ["b1"]
    assert by_priority(2) == ["low"]
    assert by_priority(3) == []


def test_a_job_at_the_ceiling_borrows_only_guarantee_its_owners_left_idle_for_a_while():
    # team-b's 2-card job is larger than its one-card guarantee: it must borrow a card of team-a's (guarantee
    # 2, holding nothing now; the 3 cards are all promised). At the ceiling its loan would be firm, so
    # team-a's recent use counts too.
    def case(preemptions: int, team_a_recent: float = 0.0, firm_out: bool = False, team_a_queued: int = 0):
        big = job("b1", "team-b", cards=2, preemptions=preemptions, last_preempted_at=NOW - 1_000_000)
        # team-a's queued work, waiting for a node of another zone.
        queued = [job("a1", "team-a", cards=team_a_queued, node_selector={"zone": "b"})] if team_a_queued else []
        out = [alloc("b0", "n1-gpu2", "team-b", borrowed_millis=1000, started_at=NOW - 10, preemptions=3)]
        s = snapshot(
            [node("n1", 3)],
            pending=[big, *queued],
            allocations=out if firm_out else [],
            quotas=[quota("team-a", 2), quota("team-b", 1)],
            usage={"team-a": {FLAVOR: team_a_recent}} if team_a_recent else {},
            now=NOW,
        )
        return plan(s, Policy())

    assert [p.job_id for p in case(3).places] == ["b1"]  # team-a has been idle: a firm loan of one card
    busy = case(3, team_a_recent=1500)  # team-a held 1.5 cards on average lately: half a card is idle
    assert busy.places == ()
    (why,) = busy.explanations
    assert why.code == PendingReason.NO_LENDABLE_CAPACITY
    assert "not preempted again, so it borrows only guarantee other tenants have left idle" in why.message
    assert [p.job_id for p in case(2, team_a_recent=1500).places] == ["b1"]  # below the ceiling: an ordinary loan
    assert [p.job_id for p in case(3, team_a_queued=2).places] == []  # team-a has work queued: not idle
    # A firm loan of one card is already out: team-a's two idle cards, less that one, cannot cover the two
    # cards b1 would now borrow.
    assert case(3, firm_out=True).places == ()


def test_reclaim_takes_the_borrower_preempted_fewer_times_before_the_one_with_less_work_lost():
    often = alloc("often", "n1-gpu0", "team-b", borrowed_millis=1000, started_at=NOW - 400, preemptions=3)
    once = alloc("once", "n1-gpu1", "team-b", borrowed_millis=1000, started_at=NOW - 5000, preemptions=0)
    s = snapshot(
        [node("n1", 2)],
        allocations=[often, once],
        pending=[job("a1", "team-a")],
        quotas=[quota("team-a", 2), quota("team-b", 0)],
        now=NOW,
    )

    (pre,) = plan(s, Policy()).preemptions

    assert pre.job_id == "once"


def test_restart_cost_counts_in_victim_choice():
    # The 2-card borrower has less work since its checkpoint (2 x 100 GPU-s against 1 x 300), but stopping it
    # costs two restarts: with the restart cost counted, the 1-card borrower is the cheaper victim.
    def case(restart_cost_s: float) -> str:
        wide = [
            alloc("wide", f"n1-gpu{i}", "team-b", borrowed_millis=1000, started_at=0.0, last_checkpoint_at=NOW - 100)
            for i in range(2)
        ]
        narrow = alloc(
            "narrow", "n2-gpu0", "team-b", borrowed_millis=1000, started_at=0.0, last_checkpoint_at=NOW - 300
        )
        s = snapshot(
            [node("n1", 2), node("n2", 1)],
            allocations=[*wide, narrow],
            pending=[job("a1", "team-a")],
            quotas=[quota("team-a", 3), quota("team-b", 0)],
            now=NOW,
        )
        (pre,) = plan(s, Policy(restart_cost_s=restart_cost_s)).preemptions
        return pre.job_id

    assert case(0) == "wide"
    assert case(600) == "narrow"


# -- order --------------------------------------------------------------------------------------------------


def test_ties_on_submit_time_break_in_numeric_order_of_the_job_ids():
    s = snapshot([node("n1", 1)], pending=[job("job-10", submitted_at=5), job("job-9", submitted_at=5)])

    (place,) = plan(s, Policy(ordering=Ordering.FIFO)).places

    assert place.job_id == "job-9"


def test_a_big_gang_that_waited_long_goes_first_and_gets_capacity_held():
    gang = job("gang", "team-a", cards=8, replicas=2, submitted_at=NOW - 4000)
    small = job("small", "team-b", submitted_at=NOW - 10)
    s = snapshot(
        [node("n1", 8), node("n2", 8)],
        allocations=[alloc("fixed", "n1-gpu0", "team-c", preemptible=False)],
        pending=[gang, small],
        usage={"team-a": {FLAVOR: 16000.0}},  # without aging team-b's lower share would go first
        now=NOW,
    )

    result = plan(s, Policy(gang_aging_cards=16, gang_aging_s=3600))
    assert result.places == ()
    assert [e.job_id for e in result.explanations] == ["gang", "small"]
    assert "held for it" in result.explanations[0].message

    younger = plan(s, Policy(gang_aging_cards=16, gang_aging_s=7200))
    assert [p.job_id for p in younger.places] == ["small"]


# -- fragmentation-aware fractions --------------------------------------------------------------------------


def test_fragmentation_puts_a_fraction_where_the_cards_are_stranded_already():
    roomy = with_host(node("n1", 2), cpu_cores=64)
    starved = with_host(node("n2", 2), cpu_cores=4)  # 4 cores cannot run the usual 1-card, 8-core job
    others = [with_host(node(f"m{i}", 1), cpu_cores=8) for i in range(3)]
    usual = [alloc(f"u{i}", f"m{i}-gpu0", cpu_millicores=8000) for i in range(3)]
    frac = job("frac", millis=500, memory_mib=1024)
    frac = replace(frac, request=replace(frac.request, cpu_millicores=4000))
    s = snapshot([roomy, starved, *others], allocations=usual, pending=[frac])

    (fgd,) = plan(s, Policy(fractional_strategy=FractionalStrategy.FRAGMENTATION)).places
    (best,) = plan(s, Policy(fractional_strategy=FractionalStrategy.BEST_FIT)).places

    assert fgd.assignments[0].node == "n2"  # its cards were unusable anyway
    assert best.assignments[0].node == "n1"  # best fit only looks at the cards


def test_fragmentation_keeps_cpu_beside_cards_the_usual_jobs_will_need():
    # The usual job here takes one card and 11 cores. A 15-core job on the 4-card, 45-core node would leave
    # 30 cores beside 3 cards: one more usual job fits (FGD's one-task test sees no harm), but only two do,
    # so a card strands.
    tight = with_host(node("tight", 4), cpu_cores=45)
    roomy = with_host(node("roomy", 8), cpu_cores=200)
    others = [with_host(node(f"m{i}", 1), cpu_cores=11) for i in range(3)]
    usual = [alloc(f"u{i}", f"m{i}-gpu0", cpu_millicores=11000) for i in range(3)]
    s = snapshot([tight, roomy, *others], allocations=usual, pending=[host_job("big", cpu_cores=15)])

    (fgd,) = plan(s, Policy(fractional_strategy=FractionalStrategy.FRAGMENTATION)).places
    (best,) = plan(s, Policy(fractional_strategy=FractionalStrategy.BEST_FIT)).places

    assert fgd.assignments[0].node == "roomy"
    assert best.assignments[0].node == "tight"  # best fit: the node with the fewest free cards


def test_a_job_of_any_flavor_goes_to_the_flavor_it_fragments_least():
    tight = with_host(node("tight", 4, flavor="model-a"), cpu_cores=45)
    roomy = with_host(node("roomy", 8, flavor="model-b"), cpu_cores=200)
    others = [with_host(node(f"m{i}", 1, flavor="model-a"), cpu_cores=11) for i in range(3)]
    usual = [alloc(f"u{i}", f"m{i}-gpu0", flavor="model-a", cpu_millicores=11000) for i in range(3)]
    big = host_job("big", cpu_cores=15, flavor=("model-a", "model-b"))

    def node_of(any_flavor: bool) -> str:
        j = replace(big, request=replace(big.request, any_flavor=any_flavor))
        s = snapshot([tight, roomy, *others], allocations=usual, pending=[j], quotas=[])
        (place,) = plan(s, Policy(fractional_strategy=FractionalStrategy.FRAGMENTATION, require_quota=False)).places
        return place.assignments[0].node

    assert node_of(False) == "tight"  # flavors in order of preference: the first one it fits on
    assert node_of(True) == "roomy"  # alternatives: where it strands no card of the usual 11-core jobs


def test_fragmentation_counts_how_many_usual_jobs_a_node_can_still_hold():
    shapes = [((500, 0, 8000), 1.0)]  # the usual job: a half card with 8 cores
    # two free cards hold four halves; 24 cores hold only three of them: one half card (500 millis) strands
    assert expected_unusable_millis(shapes, [1000, 1000], 2000, 2, 24000) == 500
    assert expected_unusable_millis(shapes, [1000, 1000], 2000, 2, 32000) == 0
    assert expected_unusable_millis(shapes, [1000, 400], 1400, 1, 32000) == 400  # 400 millis hold no half
    whole = [((1000, 2, 0), 1.0)]  # two whole cards
    assert expected_unusable_millis(whole, [1000, 1000, 1000], 3000, 3, 0) == 1000


# -- reclaim churn: borrowing back-off, reclaim by usage -----------------------------------------------------


def _lender_idle(pending, **kw):
    """team-a lends its idle guarantee of 2 cards; team-b has none of its own."""
    return snapshot([node("n1", 2)], pending=pending, quotas=[quota("team-a", 2), quota("team-b", 0)], now=NOW, **kw)


def test_a_reclaimed_job_does_not_borrow_again_within_its_backoff():
    def case(preemptions: int, ago_s: float):
        j = job("b1", "team-b", preemptions=preemptions, last_preempted_at=NOW - ago_s)
        return plan(_lender_idle([j]), Policy(borrow_backoff_s=1800))

    waiting = case(1, 600)
    assert waiting.places == ()
    (why,) = waiting.explanations
    assert why.code == PendingReason.QUOTA_EXHAUSTED
    assert "preempted 1 time(s), it may borrow idle capacity again in 20 min" in why.message
    assert [p.job_id for p in case(1, 2000).places] == ["b1"]  # 2000 s > 1800 s: it may borrow again
    assert [p.job_id for p in case(0, 600).places] == ["b1"]  # never preempted: no back-off
    assert [
        p.job_id
        for p in plan(
            _lender_idle([job("b1", "team-b", preemptions=1, last_preempted_at=NOW - 600)]),
            Policy(borrow_backoff_s=None),
        ).places
    ] == ["b1"]  # knob off


def test_the_borrowing_backoff_doubles_with_each_preemption():
    def borrows(preemptions: int, ago_s: float) -> bool:
        j = job("b1", "team-b", preemptions=preemptions, last_preempted_at=NOW - ago_s)
        return bool(plan(_lender_idle([j]), Policy(borrow_backoff_s=1800)).places)

    assert borrows(1, 2000)
    assert not borrows(2, 2000)  # 2000 s < 3600 s
    assert borrows(2, 4000)
    assert not borrows(3, 4000)  # 4000 s < 7200 s


def test_a_job_preempted_three_times_that_fits_its_guarantee_stops_borrowing():
    # team-b's one-card guarantee is busy with its own job; team-a lends two idle cards.
    def case(preemptions: int, cards: int = 1, limit: int | None = 3):
        j = job("b1", "team-b", cards=cards, preemptions=preemptions, last_preempted_at=NOW - 100_000)
        s = snapshot(
            [node("n1", 4)],
            pending=[j],
            allocations=[alloc("b0", "n1-gpu0", "team-b")],
            quotas=[quota("team-a", 2), quota("team-b", 1)],
            now=NOW,
        )
        return plan(s, Policy(borrow_backoff_s=1800, borrow_preemption_limit=limit))

    waiting = case(3)
    assert waiting.places == ()
    (why,) = waiting.explanations
    assert "preempted 3 time(s), it no longer borrows idle capacity" in why.message
    assert [p.job_id for p in case(2).places] == ["b1"]  # back-off long over: it borrows
    assert [p.job_id for p in case(3, cards=2).places] == ["b1"]  # larger than its guarantee: it may borrow
    assert [p.job_id for p in case(3, limit=None).places] == ["b1"]  # knob off


def test_a_job_in_its_backoff_still_starts_within_its_tenants_guarantee():
    j = job("b1", "team-b", preemptions=5, last_preempted_at=NOW - 10)
    s = snapshot([node("n1", 2)], pending=[j], quotas=[quota("team-a", 1), quota("team-b", 1)], now=NOW)

    (place,) = plan(s, Policy(borrow_backoff_s=1800)).places

    assert place.job_id == "b1" and place.borrowed_millis == 0


def _over_guarantee(team_b_cards: int):
    """team-b (guarantee ``team_b_cards``) holds all four cards of n1 and n2: one flagged borrower and one job
    started within its guarantee on each node; team-a's 2-card job fits in its own idle guarantee."""
    allocations = []
    for n in ("n1", "n2"):
        allocations.append(alloc(f"{n}-g", f"{n}-gpu0", "team-b", started_at=0.0))
        allocations.append(alloc(f"{n}-b", f"{n}-gpu1", "team-b", borrowed_millis=1000, started_at=0.0))
    return snapshot(
        [node("n1", 2), node("n2", 2)],
        allocations=allocations,
        pending=[job("a1", "team-a", cards=2)],
        quotas=[quota("team-a", 2), quota("team-b", team_b_cards)],
        now=NOW,
    )


def test_reclaim_by_usage_takes_any_job_of_a_tenant_over_its_guarantee():
    s = _over_guarantee(2)  # team-b holds 4 cards, 2 above its guarantee

    by_usage = plan(s, Policy())
    flagged_only = plan(s, Policy(reclaim_by_usage=False))

    # A node is freed whole: its flagged borrower and the job beside it, which the excess also covers.
    assert sorted(p.job_id for p in by_usage.preemptions) in (["n1-b", "n1-g"], ["n2-b", "n2-g"])
    assert {p.reason for p in by_usage.preemptions} == {PreemptReason.RECLAIM_BORROWED}
    # Only flagged borrowers: each node keeps a job within team-b's guarantee, so no node can be freed.
    assert flagged_only.preemptions == ()


def test_reclaim_by_usage_takes_no_more_than_the_tenants_excess():
    s = _over_guarantee(3)  # team-b holds 4 cards, only 1 above its guarantee: a node's two jobs are too many

    result = plan(s, Policy())

    assert result.preemptions == ()


# -- relocation: a whole-node job within its guarantee against one-card jobs scattered over every node -------


def _scattered(team_c_guarantee: int, **job_kw):
    """Two nodes of 8 cards. team-b (guarantee 2) has one one-card job on each node, within its guarantee; team-c
    fills the other 14 cards with one-card jobs (7 per node) above its guarantee. team-a's 8-card job fits in
    its idle guarantee, but reclaim alone can empty no node: team-b's job stays on each."""
    allocations = []
    for n in ("n1", "n2"):
        allocations.append(alloc(f"{n}-b", f"{n}-gpu0", "team-b", started_at=0.0))
        allocations += [alloc(f"{n}-c{i}", f"{n}-gpu{i}", "team-c", started_at=0.0) for i in range(1, 8)]
    return snapshot(
        [node("n1", 8), node("n2", 8)],
        allocations=allocations,
        pending=[job("a8", "team-a", cards=8, **job_kw)],
        quotas=[quota("team-a", 8), quota("team-b", 2), quota("team-c", team_c_guarantee)],
        now=NOW,
    )


def test_a_one_card_job_within_its_guarantee_is_relocated_so_a_whole_node_job_within_its_own_gets_a_node():
    s = _scattered(team_c_guarantee=6)  # team-c holds 14, 8 above its guarantee: room for the relocated job

    result = plan(s, Policy())

    reasons = {p.job_id: p.reason for p in result.preemptions}
    node_name = next(iter(reasons))[:2]
    assert reasons == {
        f"{node_name}-b": PreemptReason.RELOCATE,
        **{f"{node_name}-c{i}": PreemptReason.RECLAIM_BORROWED for i in range(1, 8)},
    }
    moved = next(p for p in result.preemptions if p.reason == PreemptReason.RELOCATE)
    assert "a8 of team-a, within its guarantee, needs 8" in moved.message
    (why,) = result.explanations
    assert why.job_id == "a8" and why.code == PendingReason.WAITING_FOR_PREEMPTION
    # Without relocation the job waits for team-b's jobs to end, however long they run.
    assert plan(s, Policy(relocate_for_guarantee=False)).preemptions == ()


def test_no_job_is_relocated_when_the_borrowers_leave_no_room_for_it_to_restart():
    s = _scattered(team_c_guarantee=7)  # team-c is 7 above its guarantee: all of it goes to team-a's job

    assert plan(s, Policy()).preemptions == ()


def test_relocation_never_moves_a_job_of_higher_priority_or_one_preempted_before():
    higher = _scattered(team_c_guarantee=6, priority=100)  # team-a's job has a lower priority than team-b's
    assert plan(higher, Policy()).preemptions == ()

    s = _scattered(team_c_guarantee=6)
    once = tuple(replace(a, preemptions=1) if a.tenant == "team-b" else a for a in s.allocations)
    assert plan(replace(s, allocations=once), Policy()).preemptions == ()


# -- an aged gang takes its tenant's guarantee back from the tenant's newer jobs -----------------------------


def _guarantee_taken_by_newer_jobs(started_at: float, gang_submitted_at: float = NOW - 4000):
    """team-a (guarantee 16) fills both nodes with four 4-card jobs; its 16-card gang waits, and nobody lends."""
    allocations = [
        alloc(f"a-{n}-{half}", f"{n}-gpu{4 * half + i}", "team-a", started_at=started_at)
        for n in ("n1", "n2")
        for half in (0, 1)
        for i in range(4)
    ]
    return snapshot(
        [node("n1", 8), node("n2", 8)],
        allocations=allocations,
        pending=[job("gang", "team-a", cards=8, replicas=2, submitted_at=gang_submitted_at)],
        quotas=[quota("team-a", 16), quota("team-b", 0)],
        now=NOW,
    )


def test_an_aged_gang_stops_its_tenants_jobs_that_started_after_it_was_submitted():
    result = plan(_guarantee_taken_by_newer_jobs(started_at=NOW - 1000), Policy())

    assert sorted(p.job_id for p in result.preemptions) == ["a-n1-0", "a-n1-1", "a-n2-0", "a-n2-1"]
    assert {p.reason for p in result.preemptions} == {PreemptReason.NEWER_OWN}
    assert "waiting since before this job started" in result.preemptions[0].message
    (why,) = result.explanations
    assert why.code == PendingReason.WAITING_FOR_PREEMPTION


def test_an_aged_gang_leaves_older_jobs_and_a_young_gang_stops_nothing():
    older = _guarantee_taken_by_newer_jobs(started_at=NOW - 5000)  # started before the gang was submitted
    young = _guarantee_taken_by_newer_jobs(started_at=NOW - 1000, gang_submitted_at=NOW - 1200)  # not aged yet

    assert plan(older, Policy()).preemptions == ()
    assert plan(young, Policy()).preemptions == ()
    assert plan(_guarantee_taken_by_newer_jobs(started_at=NOW - 1000), Policy(gang_aging_s=None)).preemptions == ()


def test_no_job_is_relocated_when_the_borrowers_excess_is_held_by_work_that_cannot_be_preempted():
    s = _scattered(team_c_guarantee=6)
    # team-c's jobs on n2 cannot be preempted: the one card of excess left after n1's reclaims is not there to
    # take back, so team-b's job would be stopped with nowhere to restart.
    fixed = tuple(
        replace(a, preemptible=False) if a.node == "n2" and a.tenant == "team-c" else a for a in s.allocations
    )

    assert plan(replace(s, allocations=fixed), Policy()).preemptions == ()
