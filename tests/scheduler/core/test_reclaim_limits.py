"""Reclaim through every limit (issue 33, item 1): a job within its tenant's guarantee gets its room back whichever
limit blocks it — the cluster's capacity, its parent's limit, an ancestor's — by reclaiming borrowed use below
that limit, within grace + minimum runtime + one cycle."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import plan
from scheduler.core.quota import QuotaBook
from scheduler.core.types import (
    Allocation,
    PendingJob,
    PendingReason,
    Policy,
    PreemptReason,
    Quota,
    ReplicaRequest,
    Snapshot,
    Tenant,
)

from .builders import FLAVOR, MEM, alloc, job, node, quota, snapshot

NOW = 10_000.0
OLD = NOW - 3600

# The demo's tree (portal/demo.py): research is guaranteed and limited to the whole 8-card pool, each team is
# guaranteed 3 and may borrow up to 8.
DEMO_TENANTS = [
    Tenant("acme", None),
    Tenant("acme-research", "acme"),
    Tenant("acme-vision", "acme-research"),
    Tenant("acme-nlp", "acme-research"),
]
DEMO_QUOTAS = [quota("acme", 8, 8), quota("acme-research", 8, 8), quota("acme-vision", 3, 8), quota("acme-nlp", 3, 8)]


def _demo(*, bob_started_at: float, carol_cards: int = 2, pool_cards: int = 8) -> Snapshot:
    """bob's team runs a preemptible 6-card job (3 of them borrowed), alice's department a card of its own and
    carol's team half a card; carol asks for ``carol_cards`` within NLP's guarantee (0.5 + 2 <= 3)."""
    allocations = [
        alloc("bob", f"n1-gpu{i}", "acme-vision", borrowed_millis=500, started_at=bob_started_at) for i in range(6)
    ]
    allocations.append(alloc("alice", "n1-gpu6", "acme-research", preemptible=False, started_at=OLD))
    allocations.append(alloc("carol-small", "n1-gpu7", "acme-nlp", millis=500, preemptible=False, started_at=OLD))
    return snapshot(
        [node("n1", pool_cards)],
        pending=[job("carol", "acme-nlp", cards=carol_cards)],
        allocations=allocations,
        quotas=DEMO_QUOTAS,
        tenants=DEMO_TENANTS,
        now=NOW,
    )


def _explained(result, job_id):
    return next(e for e in result.explanations if e.job_id == job_id)


def test_a_parents_limit_held_by_borrowed_use_is_reclaimed_for_a_job_within_its_guarantee():
    result = plan(_demo(bob_started_at=OLD), Policy())
    assert {p.job_id: p.reason for p in result.preemptions} == {"bob": PreemptReason.RECLAIM_BORROWED}
    assert _explained(result, "carol").code == PendingReason.WAITING_FOR_PREEMPTION
    assert len({h.device_uuid for h in result.holds if h.job_id == "carol"}) == 2


def test_an_ancestors_limit_is_reclaimed_from_borrowers_anywhere_below_it():
    # The grandparent's limit binds (the parent has none): a borrower in a cousin team is reclaimed.
    tenants = [Tenant("org", None), Tenant("dept-a", "org"), Tenant("dept-b", "org")]
    tenants += [Tenant("team-a", "dept-a"), Tenant("team-b", "dept-b")]
    quotas = [quota("org", 4, 4), quota("dept-a", 2), quota("dept-b", 2), quota("team-a", 2), quota("team-b", 2)]
    s = snapshot(
        [node("n1", 8)],  # the pool has room: only org's limit stands in the way
        allocations=[
            alloc("b1", "n1-gpu0", "team-b", started_at=OLD),
            alloc("b2", "n1-gpu1", "team-b", started_at=OLD),
            alloc("b3", "n1-gpu2", "team-b", borrowed_millis=1000, started_at=OLD),
            alloc("b4", "n1-gpu3", "team-b", borrowed_millis=1000, started_at=OLD),
        ],
        pending=[job("a", "team-a", cards=1)],
        quotas=quotas,
        tenants=tenants,
        now=NOW,
    )
    result = plan(s, Policy())
    assert len(result.preemptions) == 1
    (pre,) = result.preemptions
    assert pre.job_id in {"b3", "b4"} and pre.reason == PreemptReason.RECLAIM_BORROWED
    assert _explained(result, "a").code == PendingReason.WAITING_FOR_PREEMPTION


def test_work_within_other_guarantees_is_not_taken_for_a_limit():
    # The limit is held by use within its tenants' guarantees: nothing is borrowed, nothing is reclaimed.
    tenants = [Tenant("org", None), Tenant("team-a", "org"), Tenant("team-b", "org")]
    quotas = [quota("org", 4, 3), quota("team-a", 1), quota("team-b", 3)]
    s = snapshot(
        [node("n1", 8)],
        allocations=[alloc(f"b{i}", f"n1-gpu{i}", "team-b", started_at=OLD) for i in range(3)],
        pending=[job("a", "team-a", cards=1)],
        quotas=quotas,
        tenants=tenants,
        now=NOW,
    )
    result = plan(s, Policy())
    assert result.preemptions == ()
    assert _explained(result, "a").code == PendingReason.QUOTA_LIMIT


def test_while_the_borrower_is_protected_the_reason_says_the_reclaim_is_coming():
    min_runtime = 300.0
    result = plan(_demo(bob_started_at=NOW - 100), Policy(min_runtime_before_preempt_s=min_runtime))
    assert result.preemptions == ()
    explain = _explained(result, "carol")
    assert explain.code == PendingReason.QUOTA_LIMIT
    minutes = -int(-(min_runtime - 100) // 60)
    assert "acme-research" in explain.message
    assert f"reclaimed for it once they have run the minimum runtime, in about {minutes} min" in explain.message


def test_a_borrowing_job_does_not_reclaim_through_a_limit():
    # carol asks for more than NLP's unused guarantee: she would borrow, so a limit refusing her stands.
    result = plan(_demo(bob_started_at=OLD, carol_cards=3), Policy())
    assert result.preemptions == ()
    assert _explained(result, "carol").code == PendingReason.QUOTA_LIMIT


def test_headroom_is_what_admission_allows_under_every_limit_on_the_path():
    s = _demo(bob_started_at=OLD)
    book = QuotaBook(s, {FLAVOR: 8000}, require_quota=True)
    # research is at 7.5/8: NLP's unused guarantee (2.5) does not matter, the parent's limit leaves 0.5.
    assert book.headroom("acme-nlp", FLAVOR) == 500
    assert book.admit(tenant="acme-nlp", flavor=FLAVOR, millis=500, preemptible=True, borrowing=True).ok
    assert not book.admit(tenant="acme-nlp", flavor=FLAVOR, millis=510, preemptible=True, borrowing=True).ok


# -- the rule as a property: random quota trees, cycles through the pure core with a clock ---------------------

CYCLE_S = 30.0
GRACE_S = 60.0
MIN_RUNTIME_S = 300.0
POLICY = Policy(grace_period_s=GRACE_S, min_runtime_before_preempt_s=MIN_RUNTIME_S)
BOUND_S = GRACE_S + MIN_RUNTIME_S + CYCLE_S
NODE_CARDS = 4


@dataclass
class Tree:
    parents: dict[str, str | None]
    guaranteed: dict[str, int]  # cards
    limits: dict[str, int | None]  # cards

    def leaves(self) -> list[str]:
        inner = {p for p in self.parents.values() if p is not None}
        return [t for t in self.parents if t not in inner]


@st.composite
def trees(draw, capacity_cards: int) -> Tree:
    """A random tree whose guarantees nest: the roots share at most the pool, children at most their parent's
    guarantee; limits anywhere (none, or at least the guarantee)."""
    parents: dict[str, str | None] = {}
    for i in range(draw(st.integers(2, 7))):
        parents[f"t{i}"] = draw(st.sampled_from([None, *parents]))
    guaranteed: dict[str, int] = {}
    left = {None: capacity_cards}
    for name, parent in parents.items():  # parents come before their children
        g = draw(st.integers(0, left[parent]))
        left[parent] -= g
        guaranteed[name] = g
        left[name] = g
    limits = {name: draw(st.one_of(st.none(), st.integers(guaranteed[name], capacity_cards + 2))) for name in parents}
    return Tree(parents, guaranteed, limits)


@dataclass
class Sim:
    """The Django side in miniature: allocations, the queue, victims stopping after their grace, holds."""

    snapshot: Snapshot
    running: dict[str, tuple[Allocation, ...]] = field(default_factory=dict)
    pending: dict[str, PendingJob] = field(default_factory=dict)
    stopping: dict[str, tuple[float, str]] = field(default_factory=dict)  # victim -> (stops at, victim of)
    started_at: dict[str, float] = field(default_factory=dict)  # first start of each job
    pending_of: dict[str, PendingJob] = field(default_factory=dict)  # each running job as it was queued
    holds: tuple = ()

    def cycle(self, t: float) -> None:
        for victim, (stops_at, by) in sorted(self.stopping.items()):
            if stops_at <= t:
                del self.stopping[victim]
                del self.running[victim]
                old = self.pending_of[victim]
                self.pending[victim] = replace(
                    old,
                    preempted_by=old.preempted_by | {by},
                    preemptions=old.preemptions + 1,
                    last_preempted_at=stops_at - GRACE_S,
                )
        allocations = tuple(a for rows in self.running.values() for a in rows)
        s = replace(self.snapshot, now=t, allocations=allocations, pending=tuple(self.pending.values()))
        result = plan(replace(s, holds=self.holds), POLICY)
        self.holds = result.holds
        for place in result.places:
            pj = self.pending.pop(place.job_id)
            self.pending_of[place.job_id] = pj
            borrowed_left = place.borrowed_millis
            rows = []
            for a in place.assignments:
                borrowed = min(borrowed_left, a.millis)
                borrowed_left -= borrowed
                rows.append(
                    Allocation(
                        job_id=place.job_id,
                        replica=a.replica,
                        device_uuid=a.device_uuid,
                        node=a.node,
                        tenant=pj.tenant,
                        flavor=place.flavor,
                        millis=a.millis,
                        memory_mib=a.memory_mib,
                        priority=int(pj.priority),
                        preemptible=pj.preemptible,
                        borrowed_millis=borrowed,
                        started_at=t,
                        preemptions=pj.preemptions,
                    )
                )
            self.running[place.job_id] = tuple(rows)
            self.started_at.setdefault(place.job_id, t)
        for pre in result.preemptions:
            assert pre.job_id in self.running and pre.job_id not in self.stopping
            self.stopping[pre.job_id] = (t + pre.grace_s, pre.victim_of)
            # A victim that is stopping is nobody's victim again (the Django side marks it so).
            self.running[pre.job_id] = tuple(replace(a, preemptible=False) for a in self.running[pre.job_id])

    def used(self, tree: Tree, tenant: str) -> int:
        """Millis held now in ``tenant``'s subtree."""

        def under(t: str) -> bool:
            while t is not None:
                if t == tenant:
                    return True
                t = tree.parents[t]
            return False

        return sum(a.millis for rows in self.running.values() for a in rows if under(a.tenant))


@given(data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_a_job_within_its_guarantee_is_never_blocked_by_borrowed_use_beyond_the_bound(data):
    n_nodes = data.draw(st.integers(1, 3), label="nodes")
    capacity = n_nodes * NODE_CARDS
    tree = data.draw(trees(capacity), label="tree")
    leaves = tree.leaves()
    quotas = tuple(
        Quota(
            tenant=name,
            flavor=FLAVOR,
            guaranteed_millis=tree.guaranteed[name] * 1000,
            limit_millis=None if tree.limits[name] is None else tree.limits[name] * 1000,
        )
        for name in tree.parents
    )
    base = Snapshot(
        now=0.0,
        nodes=tuple(node(f"n{i}", NODE_CARDS) for i in range(n_nodes)),
        tenants=tuple(Tenant(name, parent) for name, parent in tree.parents.items()),
        quotas=quotas,
    )
    sim = Sim(base)
    # Borrowers and work within guarantees arrive first and run (no job ever ends: only reclaim frees room).
    for i in range(data.draw(st.integers(1, 3 * capacity), label="early jobs")):
        tenant = data.draw(st.sampled_from(leaves))
        preemptible = data.draw(st.integers(0, 4)) > 0
        sim.pending[f"e{i}"] = PendingJob(
            job_id=f"e{i}",
            tenant=tenant,
            request=ReplicaRequest(flavors=(FLAVOR,), millis=1000 * data.draw(st.integers(1, 2)), memory_mib=MEM),
            priority=data.draw(st.sampled_from([200, 500, 800])),
            preemptible=preemptible,
            submitted_at=0.0,
        )
    # The owed jobs arrive while the borrowers are still protected by their minimum runtime.
    arrive = data.draw(st.sampled_from([CYCLE_S, 2 * CYCLE_S, 4 * CYCLE_S, 12 * CYCLE_S]), label="arrival")
    t = 0.0
    while t < arrive:
        sim.cycle(t)
        t += CYCLE_S
    owed: dict[str, float] = {}
    busy = {pj.tenant for pj in sim.pending.values()}
    for tenant in leaves:
        room = tree.guaranteed[tenant] * 1000 - sim.used(tree, tenant)
        if tenant in busy or room < 1000:
            continue  # a tenant with work of its own queued owes its room to that work first
        for k in range(data.draw(st.integers(0, room // 1000), label=f"owed jobs of {tenant}")):
            job_id = f"o-{tenant}-{k}"
            sim.pending[job_id] = PendingJob(
                job_id=job_id,
                tenant=tenant,
                request=ReplicaRequest(flavors=(FLAVOR,), millis=1000, memory_mib=MEM),
                priority=data.draw(st.sampled_from([200, 500, 800])),
                preemptible=data.draw(st.booleans()),
                submitted_at=t,
            )
            owed[job_id] = t
    end = t + BOUND_S + CYCLE_S
    while t <= end:
        sim.cycle(t)
        t += CYCLE_S
    for job_id, submitted in owed.items():
        started = sim.started_at.get(job_id)
        assert started is not None and started - submitted <= BOUND_S, (
            f"{job_id} within its guarantee waited {None if started is None else started - submitted} s "
            f"(bound {BOUND_S} s)"
        )


def test_an_answer_admission_remembers_is_asked_again_after_a_charge():
    # ``admit`` keeps its answers per tree version: a charge between two equal questions must change the answer.
    s = _demo(bob_started_at=OLD)
    book = QuotaBook(s, {FLAVOR: 8000}, require_quota=True)
    ask = dict(tenant="acme-nlp", flavor=FLAVOR, millis=500, preemptible=True, borrowing=True)
    assert book.admit(**ask).ok
    assert book.admit(**ask).ok  # the same question at the same version: the same answer
    book.charge(node=book.account("acme-nlp", FLAVOR), flavor=FLAVOR, millis=500)
    refused = book.admit(**ask)
    assert not refused.ok
    assert refused.code == PendingReason.QUOTA_LIMIT
    book.charge(node=book.account("acme-nlp", FLAVOR), flavor=FLAVOR, millis=-500, jobs=-1)
    assert book.admit(**ask).ok
