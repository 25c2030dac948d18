"""Step 4, preempt: when an admitted job does not fit, find the cheapest set of running jobs to stop.

Who may be a victim of job J (all must hold):
- the victim is preemptible, runs on the flavor J is trying, and has run at least
  ``Policy.min_runtime_before_preempt_s`` (fresh work is protected); against *priority* preemption the
  protection doubles with every earlier preemption of the victim (``Allocation.preemptions``, at most
  ``Policy.max_protection_doublings`` times), so one job is not stopped again and again just past its minimum
  runtime. Reclaim keeps the base minimum runtime: a lender's wait for its guarantee stays bounded;
- the victim was preempted fewer than ``Policy.max_preemptions_per_job`` times (a hard ceiling on churn);
- J was not preempted by the victim before (``J.preempted_by``): no preemption loops;
- and one of the rules:
  * **reclaim** (``RECLAIM_BORROWED``): J is within its tenant's guarantee and the victim belongs to another
    quota node that holds more than its guarantee — the lender takes its guarantee back, whatever the
    priorities. With ``Policy.reclaim_by_usage`` (the default) any job of that node qualifies, as long as the
    node's excess (less what is already stopping or chosen this cycle) is not used up before it: which of a
    tenant's jobs was flagged "borrowed" when it started is an accident of timing, and the flagged ones may
    all sit on nodes a whole-node gang cannot use. Without it only jobs flagged as borrowing qualify.
    Reclaim answers whichever limit blocks J: the cluster's capacity (J fits no device), or the limit of a
    quota node on J's path — its parent's, an ancestor's (``search_under_limits``): then the victims are the
    reclaimable jobs charged under that limit, as many as take it back under the limit;
  * **priority** (``PRIORITY``): the victim has a strictly lower priority and is either borrowing or charged
    to J's own quota node. Work within another tenant's guarantee is never taken by priority, and nothing is
    ever preempted for a job of equal or lower priority within a guarantee;
  * **relocate** (``RELOCATE``, ``Policy.relocate_for_guarantee``): only when J is within its guarantee and
    reclaim alone frees no node for it — every node that reclaim could empty also holds a small job within
    another tenant's guarantee (one card or less, never preempted, priority no higher than J's). Such jobs may
    join the set, at most half of what J needs on that node, and only as many cards as the excess of
    tenants over their guarantees still leaves after this set's reclaims: the room each relocated job will
    reclaim for itself at once, since its tenant is then below its guarantee. Fragmentation by one tenant's
    one-card jobs otherwise keeps a whole-node job of another starving within its guarantee for hours.

Victim sets are compared by ``(highest victim priority, victims not borrowing, earlier preemptions of the
victims, GPU-seconds lost, number of victims)`` — lowest priority first, borrowed first, jobs preempted
fewer times first (churn is spread, never piled on one job), then the least work lost: the work since each
victim's last checkpoint *plus* ``Policy.restart_cost_s`` (the reload a restart costs), times its cards. A
freshly restarted job has little work since its checkpoint but still costs a restart.
The search is per node: on each node with candidates (cheapest first, at most ``MAX_NODES``), add victims
in cost order until the job fits there, prune the ones not needed, and keep the cheapest node's set. A gang
across nodes does this replica by replica (replicas that fit on free capacity take no victims).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .candidates import Candidates, Listed, Streamed, Tier
from .capacity import Cluster
from .placement import Placer, Take, rollback
from .quota import QuotaBook
from .types import (
    MILLIS_PER_DEVICE,
    Allocation,
    JobKind,
    PendingJob,
    PreemptReason,
    Snapshot,
    Topology,
    at_preemption_ceiling,
)

# Bounds per search, so a cycle stays fast on big clusters: nodes looked at, victims tried on one node,
# fit checks while pruning.
MAX_NODES = 48
MAX_PRUNE_CHECKS = 32
# A job within its guarantee reclaiming borrowed capacity looks further: the reclaim must be complete.
MAX_RECLAIM_NODES = 96
# Relocation (see the module docstring): a relocated job holds at most one card.
RELOCATE_MAX_MILLIS = MILLIS_PER_DEVICE


@dataclass(slots=True)
class Victim:
    job_id: str
    tenant: str
    flavor: str
    priority: int
    preemptible: bool
    borrowed_millis: int
    started_at: float
    work_since_checkpoint_s: float
    kind: JobKind
    reservation_of: str | None
    preemptions: int = 0
    lost_gpu_s: float = 0.0  # (work since checkpoint + restart cost) x cards, set once its rows are known
    # (device id, millis, memory, host cpu millicores, host memory MiB) held now
    rows: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    millis: int = 0  # the sum over ``rows``, set once they are known (read in every search's inner loops)
    key: tuple = ()  # ``cost()``, made on first use (its fields are final once ``build_victims`` returns)

    def cost(self) -> tuple:
        key = self.key
        if not key:
            key = self.key = (
                self.priority,
                0 if self.borrowed_millis > 0 else 1,
                self.preemptions,
                self.lost_gpu_s,
                self.job_id,
            )
        return key


@dataclass(frozen=True, slots=True)
class VictimChoice:
    victims: tuple[tuple[Victim, PreemptReason], ...]
    devices: tuple[int, ...]  # where the preemptor will go once they stop


def set_cost(chosen: list[tuple[Victim, PreemptReason]]) -> tuple:
    return (
        max(v.priority for v, _ in chosen),
        sum(1 for v, _ in chosen if v.borrowed_millis <= 0),
        sum(v.preemptions for v, _ in chosen),
        sum(v.lost_gpu_s for v, _ in chosen),
        len(chosen),
    )


def build_victims(snapshot: Snapshot, cluster: Cluster, restart_cost_s: float = 0.0) -> dict[str, Victim]:
    by_job: dict[str, list[Allocation]] = {}
    for alloc in snapshot.allocations:
        by_job.setdefault(alloc.job_id, []).append(alloc)
    victims: dict[str, Victim] = {}
    for job_id in sorted(by_job):
        rows = by_job[job_id]
        if len(rows) > 1:
            rows.sort(key=lambda a: (a.replica, a.device_uuid))
        v = None
        for alloc in rows:
            d = cluster.dev_id.get(alloc.device_uuid)
            if d is None:
                continue
            if v is None:
                checkpoint = alloc.last_checkpoint_at if alloc.last_checkpoint_at is not None else alloc.started_at
                v = Victim(
                    job_id=job_id,
                    tenant=alloc.tenant,
                    flavor=alloc.flavor,
                    priority=int(alloc.priority),
                    preemptible=alloc.preemptible,
                    borrowed_millis=0,
                    started_at=alloc.started_at,
                    work_since_checkpoint_s=max(0.0, snapshot.now - checkpoint),
                    kind=alloc.kind,
                    reservation_of=alloc.reservation_of,
                )
                victims[job_id] = v
            v.preemptions = max(v.preemptions, alloc.preemptions)
            v.borrowed_millis += alloc.borrowed_millis
            if alloc.started_at < v.started_at:
                v.started_at = alloc.started_at
            whole = alloc.millis >= MILLIS_PER_DEVICE
            v.rows.append(
                (
                    d,
                    MILLIS_PER_DEVICE if whole else alloc.millis,
                    cluster.dev_mem[d] if whole else alloc.memory_mib,
                    alloc.cpu_millicores,
                    alloc.host_memory_mib,
                )
            )
            n = cluster.dev_node[d]
            if n not in v.nodes:
                v.nodes.append(n)
    for v in victims.values():
        v.millis = sum(m for _, m, _, _, _ in v.rows)
        v.lost_gpu_s = (v.work_since_checkpoint_s + restart_cost_s) * v.millis / MILLIS_PER_DEVICE
    return victims


class Preemptor:
    def __init__(
        self,
        *,
        snapshot: Snapshot,
        cluster: Cluster,
        placer: Placer,
        book: QuotaBook,
        min_runtime_s: float,
        stopping: frozenset[str] = frozenset(),
        restart_cost_s: float = 0.0,
        max_doublings: int = 0,
        reclaim_by_usage: bool = False,
        relocate: bool = False,
        max_preemptions: int | None = None,
    ) -> None:
        self.now = snapshot.now
        self.c = cluster
        self.placer = placer
        self.book = book
        self.min_runtime_s = min_runtime_s
        self.max_doublings = max(0, max_doublings)
        self.victims = build_victims(snapshot, cluster, restart_cost_s)
        for v in self.victims.values():
            if at_preemption_ceiling(v.preemptions, max_preemptions):
                v.preemptible = False  # the churn ceiling: preempted often enough already
        self.taken: set[str] = set()  # victims already chosen this cycle
        self.quota_searches = 0
        # Only preemptible victims past the minimum runtime can ever be chosen. Per flavor they are kept in
        # lists sorted by cost (which starts with the priority, so "lower priority than P" is a prefix found
        # by bisection): borrowers in one list, the others per quota node (priority preemption of work within
        # a guarantee only happens inside the preemptor's own quota node).
        self._account: dict[str, str | None] = {}
        self.borrowers: dict[str, list[Victim]] = {}
        self.by_account: dict[str, dict[str | None, list[Victim]]] = {}
        self.stopping = stopping  # already preempted and stopping (``holds.py``): not a victim again
        self.by_usage = reclaim_by_usage
        self.relocate = relocate
        self._movable: dict[str, list[Victim]] = {}  # per flavor: jobs relocation may ever move, cheapest first
        self._held: dict[str, dict[str, int]] = {}  # per flavor: ``_preemptible_held``
        self._by_node: dict[str, dict[int, list[Victim]]] = {}  # per flavor: ``_node_index``
        self._movable_by_node: dict[str, dict[int, list[Victim]]] = {}  # per flavor: ``_movable`` per node
        self._spare = 0  # during a relocation search: the excess that relocated jobs may reclaim for themselves
        # Per (quota node, flavor): millis that will leave it soon — victims stopping, and chosen this cycle —
        # so a node's excess over its guarantee is not reclaimed twice.
        self.leaving: dict[tuple[str, str], int] = {}
        for job_id in stopping:
            v = self.victims.get(job_id)
            account = self._victim_account(v) if v is not None else None
            if v is not None and account is not None:
                self.leaving[(account, v.flavor)] = self.leaving.get((account, v.flavor), 0) + v.millis
        for v in self.victims.values():
            if not v.preemptible or self.now - v.started_at < min_runtime_s or v.job_id in stopping:
                continue
            if v.borrowed_millis > 0:
                self.borrowers.setdefault(v.flavor, []).append(v)
            else:
                self.by_account.setdefault(v.flavor, {}).setdefault(self._victim_account(v), []).append(v)
        for victims in self.borrowers.values():
            victims.sort(key=Victim.cost)
        for groups in self.by_account.values():
            for victims in groups.values():
                victims.sort(key=Victim.cost)
        self._priorities: dict[int, list[int]] = {}

    def _victim_account(self, v: Victim) -> str | None:
        if v.job_id not in self._account:
            self._account[v.job_id] = self.book.account(v.tenant, v.flavor)
        return self._account[v.job_id]

    def excess(self, account: str | None, flavor: str) -> int:
        """Millis the quota node holds above its guarantee that are not already leaving (stopping, or chosen
        this cycle): how much reclaim may still take from it."""
        if account is None:
            return 0
        return self.book.borrowed_now(account, flavor) - self.leaving.get((account, flavor), 0)

    def reclaimable(self, v: Victim, account: str | None) -> bool:
        """``v`` may be stopped to give a lender its guarantee back (the lender's side is checked by the caller)."""
        if self.by_usage:
            excess = self.excess(account, v.flavor)
            return excess > 0 if v.borrowed_millis > 0 else v.millis <= excess
        return v.borrowed_millis > 0

    def rule(self, v: Victim, job: PendingJob, flavor: str, accounted_to: str, borrowing: bool) -> PreemptReason | None:
        """Why ``v`` may be preempted for ``job`` (None: it may not)."""
        if not v.preemptible or v.flavor != flavor or v.job_id in self.taken or v.job_id in job.preempted_by:
            return None
        if v.job_id in self.stopping:
            return None
        if v.job_id == job.job_id or self.now - v.started_at < self.min_runtime_s:
            return None
        lower = v.priority < int(job.priority)
        if v.borrowed_millis <= 0 and not lower and not (self.by_usage and not borrowing):
            return None  # within a guarantee and not lower priority: untouchable (unless its node is over it)
        v_account = self._victim_account(v)
        own = v_account is not None and self.book.in_subtree(v_account, accounted_to)
        if not borrowing and not own and self.reclaimable(v, v_account):
            return PreemptReason.RECLAIM_BORROWED
        if lower and (v.borrowed_millis > 0 or own) and self.now - v.started_at >= self.protection_s(v):
            return PreemptReason.PRIORITY
        return None

    def protection_s(self, v: Victim) -> float:
        """How long ``v`` is protected from priority preemption after it (re)started: the minimum runtime,
        doubled for each earlier preemption of the job (churn protection)."""
        return self.min_runtime_s * (2 ** min(v.preemptions, self.max_doublings))

    def search(
        self,
        *,
        job: PendingJob,
        flavor: str,
        count: int,
        accounted_to: str,
        borrowing: bool,
    ) -> VictimChoice | None:
        def eligible(v: Victim) -> PreemptReason | None:
            return self.rule(v, job, flavor, accounted_to, borrowing)

        # The list ``_candidates`` would give, produced lazily (``candidates.py``): the same victims in the same
        # order, judged only as far as the search reads them.
        lists, listed = self._candidate_sources(flavor, job, accounted_to, borrowing)
        index = self._node_index(flavor)
        cands = Streamed(
            [Tier(lambda: heapq.merge(*lists, key=Victim.cost), lambda n: index.get(n, ()), eligible, listed)]
        )
        if not cands:
            return None
        max_nodes = MAX_NODES if borrowing else MAX_RECLAIM_NODES
        choice = self._search_sets(job, flavor, count, cands, max_nodes)
        if choice is not None or borrowing or not (self.relocate and self.by_usage):
            return choice
        movable = self._relocatable(job, flavor, accounted_to, cands.tiers[0].judge_listed)
        if not Streamed([movable]):
            return None
        self._spare = self._total_excess(flavor, accounted_to)
        try:
            # Relocations last: the cheapest reclaim set is always tried first.
            return self._search_sets(job, flavor, count, cands.then(movable), max_nodes)
        finally:
            self._spare = 0

    def _search_sets(
        self, job: PendingJob, flavor: str, count: int, cands: Candidates, max_nodes: int
    ) -> VictimChoice | None:
        """The cheapest victim set among ``cands``: on one node, or replica by replica for a gang across nodes."""
        if count == 1 or job.topology == Topology.SAME_NODE:
            return self._search_per_node(job, flavor, count, cands, max_nodes)
        return self._search_gang(job, flavor, count, cands, max_nodes)

    def _uncharge(self, victims: list[Victim], flavor: str, sign: int = 1) -> None:
        """Take ``victims`` off their quota nodes' books (``sign`` -1: put them back), for a what-if admission."""
        for v in victims:
            account = self._victim_account(v)
            assert account is not None
            self.book.charge(node=account, flavor=flavor, millis=-sign * v.millis, jobs=-sign)

    def _relocatable(
        self, job: PendingJob, flavor: str, accounted_to: str, listed: Callable[[Victim], PreemptReason | None]
    ) -> Tier:
        """Small jobs of other quota nodes, within their guarantee, that a relocation may move (cheapest first),
        less those ``listed`` already gives a reason."""
        movable = self._movable.get(flavor)
        if movable is None:
            movable = sorted(
                (
                    v
                    for victims in self.by_account.get(flavor, {}).values()
                    for v in victims
                    if v.preemptions == 0
                    and len(v.rows) == 1
                    and v.millis <= RELOCATE_MAX_MILLIS
                    and v.kind != JobKind.INFERENCE
                    and v.reservation_of is None
                ),
                key=Victim.cost,
            )
            self._movable[flavor] = movable
            by_node: dict[int, list[Victim]] = {}
            for v in movable:
                by_node.setdefault(v.nodes[0], []).append(v)
            self._movable_by_node[flavor] = by_node
        by_node = self._movable_by_node[flavor]
        priority = int(job.priority)

        def judge(v: Victim) -> PreemptReason | None:
            may_move = (
                v.priority <= priority
                and v.job_id not in self.taken
                and v.job_id not in job.preempted_by
                and (account := self._victim_account(v)) is not None
                and not self.book.in_subtree(account, accounted_to)
                and listed(v) is None
            )
            return PreemptReason.RELOCATE if may_move else None

        return Tier(lambda: movable, lambda n: by_node.get(n, ()), judge)

    def _total_excess(self, flavor: str, accounted_to: str) -> int:
        """Millis that quota nodes other than the preemptor's hold above their guarantees on ``flavor``, are not
        already leaving and could be reclaimed: each node's excess, at most its preemptible work (a relocated job
        cannot take back what a non-preemptible job holds)."""
        held_by_account = self._preemptible_held(flavor)
        return sum(
            max(0, min(self.excess(account, flavor), held))
            for account, held in held_by_account.items()
            if not self.book.in_subtree(account, accounted_to)
        )

    def _preemptible_held(self, flavor: str) -> dict[str, int]:
        """Per quota node, the millis its preemptible victims on ``flavor`` hold that are not stopping or chosen
        this cycle: summed once per cycle and flavor, then kept up to date by ``commit`` (a walk over every victim
        per relocation search was a fifth of a 10,000-node cycle)."""
        held = self._held.get(flavor)
        if held is None:
            held = {}
            for v in self.victims.values():
                if v.flavor != flavor or not v.preemptible or v.job_id in self.stopping or v.job_id in self.taken:
                    continue
                account = self._victim_account(v)
                if account is not None:
                    held[account] = held.get(account, 0) + v.millis
            self._held[flavor] = held
        return held

    def _may_relocate(self, v: Victim, chosen: list[tuple[Victim, PreemptReason]], need_millis: int) -> bool:
        """``v`` may join ``chosen`` as a relocation: the relocated jobs stay within half of what the preemptor
        needs on the node, and within the excess left after the set's reclaims (where they restart)."""
        moved = v.millis + sum(x.millis for x, r in chosen if r == PreemptReason.RELOCATE)
        reclaimed = sum(x.millis for x, r in chosen if r == PreemptReason.RECLAIM_BORROWED)
        return 2 * moved <= need_millis and moved <= self._spare - reclaimed

    def search_under_limits(
        self,
        *,
        job: PendingJob,
        flavor: str,
        count: int,
        accounted_to: str,
        limits: list[tuple[str, int]],
        admitted: Callable[[], bool],
    ) -> VictimChoice | None:
        """Reclaim through a limit: ``job`` is within its tenant's guarantee, yet ``limits`` on its path (its
        parent's, an ancestor's: ``(quota node, millis over)``) refuse it. With guarantees nested as the tenants
        app keeps them, what holds such a limit beyond the job's guarantee is borrowed use under it: so the
        reclaim rule applies there as it does to the cluster's capacity. Victims (``rule``, as for any job within
        its guarantee) are taken cheapest first among those charged under a limit still exceeded, until the job
        is admitted; if it does not fit yet, the cheapest further victims are added as for a job that fits no
        device; then victims not needed are dropped."""

        def eligible(v: Victim) -> PreemptReason | None:
            return self.rule(v, job, flavor, accounted_to, borrowing=False)

        cands = self._candidates(flavor, job, accounted_to, False, eligible)
        if not cands:
            return None
        need = dict(limits)
        chosen: list[tuple[Victim, PreemptReason]] = []
        for v, r in cands:
            account = self._victim_account(v)
            under = [a for a, left in need.items() if left > 0 and self.book.in_subtree(account or "", a)]
            if not under or not self._within_excess(v, r, chosen):
                continue
            chosen.append((v, r))
            for a in under:
                need[a] -= v.millis
            if all(left <= 0 for left in need.values()):
                break
        if any(left > 0 for left in need.values()):
            return None

        def check(victims: list[Victim]) -> list[int] | None:
            self._uncharge(victims, flavor)
            try:
                if not admitted():
                    return None
                given = self._free(victims)
                try:
                    return self._fits(job, flavor, count, None)
                finally:
                    self._unfree(given)
            finally:
                self._uncharge(victims, flavor, -1)

        victims = [v for v, _ in chosen]
        self._uncharge(victims, flavor)
        try:
            if not admitted():
                return None  # a limit held by use that reclaim may not take (not preemptible, too fresh)
        finally:
            self._uncharge(victims, flavor, -1)
        if check(victims) is None:
            # Admitted, but no devices yet: more victims, with the chosen ones counted as leaving and freed.
            picked = {v.job_id for v in victims}
            rest = [(v, r) for v, r in cands if v.job_id not in picked]
            for v in victims:
                key = (self._victim_account(v) or "", v.flavor)
                self.leaving[key] = self.leaving.get(key, 0) + v.millis
            given = self._free(victims)
            try:
                more = self._search_sets(job, flavor, count, Listed(rest), MAX_RECLAIM_NODES) if rest else None
            finally:
                self._unfree(given)
                for v in victims:
                    key = (self._victim_account(v) or "", v.flavor)
                    self.leaving[key] -= v.millis
            if more is None:
                return None
            chosen += list(more.victims)
            if check([v for v, _ in chosen]) is None:
                return VictimChoice(tuple(chosen), more.devices)
        chosen, devices = self._prune(chosen, check)
        return VictimChoice(tuple(chosen), tuple(devices))

    def reclaim_waits(self, *, flavor: str, accounted_to: str, under: tuple[str, ...]) -> tuple[int, float] | None:
        """Borrowed use charged under the quota nodes ``under`` (outside ``accounted_to``'s subtree) that reclaim
        will be able to take once it has run the minimum runtime: ``(jobs, seconds until the first of them
        may be taken)``; None when there is none. What a job refused by those limits within its guarantee waits
        for, said in its reason."""
        jobs = 0
        soonest = None
        for v in self.victims.values():
            if v.flavor != flavor or not v.preemptible or v.job_id in self.stopping or v.job_id in self.taken:
                continue
            wait = v.started_at + self.min_runtime_s - self.now
            account = self._victim_account(v)
            if wait <= 0 or account is None or self.book.in_subtree(account, accounted_to):
                continue
            if not any(self.book.in_subtree(account, a) for a in under):
                continue
            if v.borrowed_millis <= 0 and not (self.by_usage and self.excess(account, flavor) > 0):
                continue
            jobs += 1
            soonest = wait if soonest is None else min(soonest, wait)
        return None if soonest is None else (jobs, soonest)

    def search_quota(
        self,
        *,
        job: PendingJob,
        flavor: str,
        count: int,
        accounted_to: str,
        admitted: Callable[[], bool],
        aged_gang: bool = False,
    ) -> VictimChoice | None:
        """The job is refused by its own quota (limit, guarantee or max jobs): stop lower-priority preemptible
        work charged to the same quota node (cheapest first) until the job is admitted and fits. An
        ``aged_gang`` that this does not help may then stop its quota node's newer jobs (``_search_newer_own``)."""
        choice = self._search_lower_own(job, flavor, count, accounted_to, admitted)
        if choice is None and aged_gang:
            choice = self._search_newer_own(job, flavor, count, accounted_to, admitted)
        return choice

    def _search_lower_own(
        self, job: PendingJob, flavor: str, count: int, accounted_to: str, admitted: Callable[[], bool]
    ) -> VictimChoice | None:
        def eligible(v: Victim) -> PreemptReason | None:
            reason = self.rule(v, job, flavor, accounted_to, borrowing=True)
            account = self._victim_account(v)
            own = account is not None and self.book.in_subtree(account, accounted_to)
            return reason if reason == PreemptReason.PRIORITY and own else None

        cands = self._candidates(flavor, job, accounted_to, True, eligible)
        if not cands:
            return None
        self.quota_searches += 1
        chosen: list[tuple[Victim, PreemptReason]] = []
        devices = None
        try:
            for v, r in cands:
                self._uncharge([v], flavor)
                chosen.append((v, r))
                if not admitted():
                    continue
                given = self._free([x for x, _ in chosen])
                try:
                    devices = self._fits(job, flavor, count, None)
                finally:
                    self._unfree(given)
                if devices is not None:
                    break
        finally:
            self._uncharge([v for v, _ in reversed(chosen)], flavor, -1)
        if devices is None:
            return None
        return VictimChoice(tuple(chosen), tuple(devices))

    def _search_newer_own(
        self, job: PendingJob, flavor: str, count: int, accounted_to: str, admitted: Callable[[], bool]
    ) -> VictimChoice | None:
        """An aged gang its own quota refuses — its tenant's guarantee is taken by the tenant's own jobs that
        started after the gang was submitted, and nobody lends — may stop those newer jobs of its quota node at
        its priority (never preempted before, each smaller than the gang), node by node as for any victim set,
        so that it starts within the guarantee (as Kueue's ``LowerOrNewerEqualPriority`` within a queue). The
        tenant's guarantee goes to its oldest work instead of to whatever small job came last."""
        priority = int(job.priority)
        size = job.request.millis * count
        cands = sorted(
            (
                v
                for v in self.victims.values()
                if v.flavor == flavor
                and v.priority == priority
                and v.started_at > job.submitted_at
                and v.preemptions == 0
                and v.millis < size
                and v.kind != JobKind.INFERENCE
                and v.reservation_of is None
                and v.preemptible
                and self.now - v.started_at >= self.min_runtime_s
                and v.job_id not in self.taken
                and v.job_id not in self.stopping
                and v.job_id not in job.preempted_by
                and v.job_id != job.job_id
                and (account := self._victim_account(v)) is not None
                and self.book.in_subtree(account, accounted_to)
            ),
            key=Victim.cost,
        )
        if not cands:
            return None
        self.quota_searches += 1
        pairs = [(v, PreemptReason.NEWER_OWN) for v in cands]
        self._uncharge(cands, flavor)
        try:
            if not admitted():
                return None  # even all of them would not make room in the guarantee
            choice = self._search_sets(job, flavor, count, Listed(pairs), MAX_RECLAIM_NODES)
        finally:
            self._uncharge(cands, flavor, -1)
        if choice is None:
            return None
        # The devices are found; the quota may need more of the newer jobs to stop (cheapest first).
        chosen = list(choice.victims)
        self._uncharge([v for v, _ in chosen], flavor)
        try:
            picked = {v.job_id for v, _ in chosen}
            rest = iter(v for v in cands if v.job_id not in picked)
            while not admitted():
                v = next(rest, None)
                if v is None:
                    return None
                self._uncharge([v], flavor)
                chosen.append((v, PreemptReason.NEWER_OWN))
        finally:
            self._uncharge([v for v, _ in chosen], flavor, -1)
        return VictimChoice(tuple(chosen), choice.devices)

    # -- what-if helpers -------------------------------------------------------------------------------------

    def _free(self, victims: list[Victim]) -> list[tuple[int, int, int, int, int]]:
        given = []
        for v in victims:
            for row in v.rows:
                self.c.give(*row)
                given.append(row)
        return given

    def _unfree(self, given: list[tuple[int, int, int, int, int]]) -> None:
        for row in reversed(given):
            self.c.take(*row)

    def _free_millis(self, n: int, flavor: str) -> int:
        """Free millis of node ``n``'s usable ``flavor`` cards (held ones included: an upper bound)."""
        free = self.c.dev_free_millis
        usable = self.c.dev_usable
        return sum(free[d] for d in self.c.node_devs[n].get(flavor, ()) if usable[d])

    def _fits(self, job: PendingJob, flavor: str, count: int, only_node: int | None) -> list[int] | None:
        """Devices the job would get now (then rolled back), or None."""
        log: list[Take] = []
        req = job.request
        if only_node is None:
            ok = self.placer.place_job(job, flavor, log, count=count) is None
        else:
            ok = True
            millis = req.millis
            topology = job.topology
            host = (req.cpu_millicores, req.host_memory_mib)
            if job.topology == Topology.SAME_NODE and req.millis >= MILLIS_PER_DEVICE:
                millis, count_here, topology = req.millis * count, 1, Topology.NONE
                host = (req.cpu_millicores * count, req.host_memory_mib * count)
            else:
                count_here = count
            for i in range(count_here):
                if not self.placer.place_replica(
                    flavor, millis, req.memory_mib, i, topology, job.node_selector, log, only_node, host
                ):
                    ok = False
                    break
        devices = [d for _, d, *_ in log]
        rollback(self.c, log)
        return devices if ok else None

    def _prune(
        self,
        chosen: list[tuple[Victim, PreemptReason]],
        check: Callable[[list[Victim]], list[int] | None],
    ) -> tuple[list[tuple[Victim, PreemptReason]], list[int]]:
        """Drop victims that are not needed, most expensive first."""
        devices = check([v for v, _ in chosen])
        assert devices is not None
        for checks, i in enumerate(range(len(chosen) - 1, -1, -1)):
            if len(chosen) == 1 or checks >= MAX_PRUNE_CHECKS:
                break
            trial = chosen[:i] + chosen[i + 1 :]
            got = check([v for v, _ in trial])
            if got is not None:
                chosen, devices = trial, got
        return chosen, devices

    # -- searches --------------------------------------------------------------------------------------------

    def _prefix(self, victims: list[Victim], priority: int) -> Iterable[Victim]:
        """The victims (sorted by cost) with a priority below ``priority``: read lazily, not copied (a search
        reads the first few hundred of lists that hold every borrower of the flavor)."""
        priorities = self._priorities.get(id(victims))
        if priorities is None:
            priorities = [v.priority for v in victims]
            self._priorities[id(victims)] = priorities
        return itertools.islice(victims, bisect.bisect_left(priorities, priority))

    def _candidate_sources(
        self, flavor: str, job: PendingJob, accounted_to: str, borrowing: bool
    ) -> tuple[list[Iterable[Victim]], Callable[[Victim], bool]]:
        """The lists (each sorted by cost) that hold a search's candidates on ``flavor``, and whether a victim
        of the node index (``_node_index``) is in one of them: a job's own quota subtree below its priority,
        borrowers (at any priority for a job within its guarantee), and with reclaim by usage every job of
        another quota node over its guarantee."""
        priority = int(job.priority)
        lists: list[Iterable[Victim]] = []
        whole: dict[str, bool] = {}  # quota node → its whole list is in (else only below the job's priority)
        for account, victims in self.by_account.get(flavor, {}).items():
            if account is not None and self.book.in_subtree(account, accounted_to):
                lists.append(self._prefix(victims, priority))
                whole[account] = False
        borrowers = self.borrowers.get(flavor, [])
        # Borrowers at any priority may be reclaimed by a job within its guarantee; otherwise only lower ones.
        lists.append(borrowers if not borrowing else self._prefix(borrowers, priority))
        if self.by_usage and not borrowing:
            # Reclaim by usage: every job of another quota node that holds more than its guarantee.
            for account, victims in self.by_account.get(flavor, {}).items():
                if (
                    account is not None
                    and not self.book.in_subtree(account, accounted_to)
                    and self.excess(account, flavor) > 0
                ):
                    lists.append(victims)
                    whole[account] = True

        def listed(v: Victim) -> bool:
            if v.borrowed_millis > 0:
                return not borrowing or v.priority < priority
            everyone = whole.get(self._victim_account(v))  # type: ignore[arg-type]
            return everyone is not None and (everyone or v.priority < priority)

        return lists, listed

    def _node_index(self, flavor: str) -> dict[int, list[Victim]]:
        """Per node, the victims of ``_candidate_sources``' lists on ``flavor`` that hold a card there, cheapest
        first: built once per cycle and flavor, so a search reads a node's candidates without a walk of all."""
        index = self._by_node.get(flavor)
        if index is None:
            victims = list(self.borrowers.get(flavor, []))
            for account, listed in self.by_account.get(flavor, {}).items():
                if account is not None:
                    victims += listed
            victims.sort(key=Victim.cost)
            index = {}
            for v in victims:
                for n in v.nodes:
                    index.setdefault(n, []).append(v)
            self._by_node[flavor] = index
        return index

    def _candidates(
        self, flavor: str, job: PendingJob, accounted_to: str, borrowing: bool, eligible
    ) -> list[tuple[Victim, PreemptReason]]:
        """Eligible victims on ``flavor``, cheapest first."""
        out = []
        for v in heapq.merge(*self._candidate_sources(flavor, job, accounted_to, borrowing)[0], key=Victim.cost):
            r = eligible(v)
            if r is not None:
                out.append((v, r))
        return out

    def _within_excess(self, v: Victim, r: PreemptReason, chosen: list[tuple[Victim, PreemptReason]]) -> bool:
        """Reclaim by usage takes a quota node's jobs only as far as its excess goes, counting the victims
        already in the set: a job started within the guarantee must fit in what is left of the excess whole (so
        reclaim never takes the node below its guarantee, which it would take back at once); a job flagged as
        borrowing needs only some excess left (it may take the node below its guarantee by less than its own
        size, as without this rule)."""
        if not self.by_usage or r != PreemptReason.RECLAIM_BORROWED:
            return True
        account = self._victim_account(v)
        same = sum(x.millis for x, _ in chosen if self._victim_account(x) == account and x.flavor == v.flavor)
        left = self.excess(account, v.flavor) - same
        return left > 0 if v.borrowed_millis > 0 else v.millis <= left

    def _search_per_node(
        self,
        job: PendingJob,
        flavor: str,
        count: int,
        cands: Candidates,
        max_nodes: int = MAX_NODES,
        prior: list[tuple[Victim, PreemptReason]] | None = None,
    ) -> VictimChoice | None:
        need_here = job.request.millis * count  # ``_fits`` puts all ``count`` replicas on the one node
        # The ``max_nodes`` nodes whose cheapest candidate is cheapest (``candidates.py``: without judging or
        # grouping every candidate, which at 10,000 nodes was most of a search).
        nodes = cands.cheapest_nodes(max_nodes, lambda n: self.placer.node_matches(n, job.node_selector))
        best: tuple[tuple, list[tuple[Victim, PreemptReason]], list[int]] | None = None
        for first, n in nodes:
            if best is not None and len(best[1]) == 1 and first >= best[1][0][0].cost():
                # Every set on this and later nodes holds a victim at least as costly as the single victim
                # found, so none is cheaper (``set_cost`` is monotone in its members): stop looking.
                break

            def check(victims: list[Victim], n: int = n) -> list[int] | None:
                given = self._free(victims)
                try:
                    return self._fits(job, flavor, count, n)
                finally:
                    self._unfree(given)

            chosen: list[tuple[Victim, PreemptReason]] = []
            devices = None
            # The full what-if (``check``) is the costly part; it is only tried once the node's free millis
            # plus what the chosen victims free on it could hold the job at all (a necessary condition).
            free_here = self._free_millis(n, flavor)
            for v, r in cands.on_node(n):
                if not self._within_excess(v, r, (prior or []) + chosen):
                    continue
                if r == PreemptReason.RELOCATE and not self._may_relocate(v, (prior or []) + chosen, need_here):
                    continue
                chosen.append((v, r))
                free_here += sum(m for d, m, _, _, _ in v.rows if self.c.dev_node[d] == n)
                if free_here < need_here:
                    continue
                devices = check([x for x, _ in chosen])
                if devices is not None:
                    break
            if devices is None:
                continue
            chosen, devices = self._prune(chosen, check)
            cost = set_cost(chosen)
            if best is None or cost < best[0]:
                best = (cost, chosen, devices)
        if best is None:
            return None
        return VictimChoice(tuple(best[1]), tuple(best[2]))

    def _search_gang(
        self,
        job: PendingJob,
        flavor: str,
        count: int,
        cands: Candidates,
        max_nodes: int = MAX_NODES,
    ) -> VictimChoice | None:
        """Replica by replica: place it on free capacity if it fits, else on the node whose victims are
        cheapest (a per-node search), with the earlier replicas' devices taken and victims freed meanwhile."""
        req = job.request
        host = (req.cpu_millicores, req.host_memory_mib)
        log: list[Take] = []
        freed: list[tuple[int, int, int, int, int]] = []
        chosen: list[tuple[Victim, PreemptReason]] = []
        try:
            for i in range(count):
                replica = job.first_replica + i
                if self.placer.place_replica(
                    flavor, req.millis, req.memory_mib, replica, job.topology, job.node_selector, log, None, host
                ):
                    continue
                rest = cands.without({v.job_id for v, _ in chosen})
                choice = self._search_per_node(job, flavor, 1, rest, max_nodes, prior=chosen)
                if choice is None:
                    return None
                freed.extend(self._free([v for v, _ in choice.victims]))
                chosen.extend(choice.victims)
                node = self.c.dev_node[choice.devices[0]]
                if not self.placer.place_replica(
                    flavor, req.millis, req.memory_mib, replica, job.topology, job.node_selector, log, node, host
                ):
                    return None
            if not chosen:
                return None
            return VictimChoice(tuple(chosen), tuple(d for _, d, *_ in log))
        finally:
            rollback(self.c, log)
            self._unfree(freed)

    def take(self, job_id: str) -> None:
        """``job_id`` is chosen as a victim this cycle (not chosen again; ``_preemptible_held`` no longer counts it)."""
        v = self.victims.get(job_id)
        if job_id in self.taken:
            return
        self.taken.add(job_id)
        if v is None or not v.preemptible or job_id in self.stopping:
            return
        held = self._held.get(v.flavor)
        account = self._victim_account(v)
        if held is not None and account is not None:
            held[account] -= v.millis

    def commit(self, choice: VictimChoice) -> None:
        for v, _ in choice.victims:
            self.take(v.job_id)
            account = self._victim_account(v)
            if account is not None:
                self.leaving[(account, v.flavor)] = self.leaving.get((account, v.flavor), 0) + v.millis
