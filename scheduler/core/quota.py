"""Step 2, admit: the hierarchical quota tree — guarantee, borrowing from the cohort, limits.

Per flavor, the quota tree holds only tenants with a ``Quota`` row for that flavor; a tenant without a row is
accounted to its nearest ancestor with one (a team without its own quota spends its department's).

For a node N with guarantee g, subtree usage u, own usage (jobs accounted to N itself) o and children C:

- ``lendable(N) = min(lending_limit, max(0, g - u))`` — idle guarantee N offers its siblings;
- ``demand(N) = max(0, Σ demand(C) + o - (g - Σ g(C)) - Σ lendable(C))`` — what N's subtree must borrow
  from N's siblings (for a leaf simply ``max(0, u - g)``).

A job within its tenant's guarantee is admitted whenever no limit on the path is exceeded (the guarantee is
an entitlement: if borrowers occupy it, they are reclaimed by preemption). A job that would go above the
guarantee (it *borrows*) must be preemptible and, after adding it, every level on its path must still
satisfy ``Σ demand ≤ Σ lendable (+ unassigned guarantee of the parent)``; at the top the unassigned pool is
the usable capacity of the flavor not promised to any root tenant.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.core import sentences
from scheduler.core.sentences import clauses, say

from .types import MILLIS_PER_DEVICE, Allocation, PendingReason, Quota, Snapshot

_ROOT = "\x00root"  # the virtual parent of every top-level quota node


def cards(millis: int) -> str:
    """Millis as a card count for messages: ``8``, ``2.5``."""
    whole, rest = divmod(millis, MILLIS_PER_DEVICE)
    return str(whole) if rest == 0 else f"{millis / MILLIS_PER_DEVICE:g}"


@dataclass(frozen=True, slots=True)
class Admission:
    ok: bool
    borrowed_millis: int = 0
    code: PendingReason | None = None
    message: str = ""
    accounted_to: str | None = None  # the quota node the job is charged to


class _FlavorTree:
    __slots__ = (
        "_paths",
        "children",
        "claimed",
        "demand",
        "guaranteed",
        "jobs",
        "lend_limit",
        "lendable",
        "limit",
        "max_jobs",
        "own",
        "parent",
        "root_pool",
        "sum_child_demand",
        "sum_child_g",
        "sum_child_lendable",
        "used",
        "version",
    )

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}
        self.children: dict[str, list[str]] = {_ROOT: []}
        self.guaranteed: dict[str, int] = {_ROOT: 0}
        self.limit: dict[str, int | None] = {_ROOT: None}
        self.lend_limit: dict[str, int | None] = {_ROOT: None}
        self.max_jobs: dict[str, int | None] = {_ROOT: None}
        self.used: dict[str, int] = {_ROOT: 0}
        self.own: dict[str, int] = {_ROOT: 0}
        self.jobs: dict[str, int] = {_ROOT: 0}
        self.demand: dict[str, int] = {_ROOT: 0}
        self.lendable: dict[str, int] = {_ROOT: 0}
        self.sum_child_demand: dict[str, int] = {_ROOT: 0}
        self.sum_child_lendable: dict[str, int] = {_ROOT: 0}
        self.sum_child_g: dict[str, int] = {_ROOT: 0}
        # Millis of the subtree's guarantee owed to queued jobs within it (``QuotaBook.claim``): not lent.
        self.claimed: dict[str, int] = {_ROOT: 0}
        self.root_pool = 0
        self._paths: dict[str, list[str]] = {}
        # Counts the changes to the tables above: an answer computed at the same version is still the answer.
        self.version = 0

    def add(self, name: str, quota: Quota | None) -> None:
        self.version += 1
        self.children[name] = []
        self.guaranteed[name] = quota.guaranteed_millis if quota else 0
        self.limit[name] = quota.limit_millis if quota else None
        self.lend_limit[name] = quota.lending_limit_millis if quota else None
        self.max_jobs[name] = quota.max_running_jobs if quota else None
        for table in (self.used, self.own, self.jobs, self.demand, self.sum_child_demand, self.claimed):
            table[name] = 0
        self.sum_child_lendable[name] = 0
        self.sum_child_g[name] = 0
        self.lendable[name] = 0

    def path(self, name: str) -> list[str]:
        """``name`` and its ancestors with a quota row, nearest first (cached: the tree does not move)."""
        cached = self._paths.get(name)
        if cached is None:
            cached = []
            node = name
            while node != _ROOT:
                cached.append(node)
                node = self.parent[node]
            self._paths[name] = cached
        return cached

    def _values(
        self, name: str, used: int, own: int, child_demand: int, child_lendable: int, claimed: int
    ) -> tuple[int, int]:
        g = self.guaranteed[name]
        lend = self.lend_limit[name]
        idle = max(0, g - used - claimed)
        lendable = idle if lend is None else min(lend, idle)
        unassigned = max(0, g - self.sum_child_g[name])
        demand = max(0, child_demand + own - unassigned - child_lendable)
        return demand, lendable

    def evaluate(self, name: str, millis: int, claim: int = 0) -> tuple[list[tuple[str, int, int, int]], int]:
        """New (node, used, demand, lendable) along the path if ``millis`` were charged to ``name`` (and
        ``claim`` more of its guarantee owed to its queued jobs); and the slack at the top (negative: the cohort
        cannot lend enough)."""
        updates = []
        d_demand = 0
        d_lendable = 0
        for node in self.path(name):
            used = self.used[node] + millis
            own = self.own[node] + (millis if node == name else 0)
            demand, lendable = self._values(
                node,
                used,
                own,
                self.sum_child_demand[node] + d_demand,
                self.sum_child_lendable[node] + d_lendable,
                self.claimed[node] + claim,
            )
            d_demand = demand - self.demand[node]
            d_lendable = lendable - self.lendable[node]
            updates.append((node, used, demand, lendable))
        top_demand = self.sum_child_demand[_ROOT] + d_demand
        top_lendable = self.sum_child_lendable[_ROOT] + d_lendable
        return updates, self.root_pool + top_lendable - top_demand

    def charge(self, name: str, millis: int, jobs: int, claim: int = 0) -> None:
        self.version += 1
        updates, _ = self.evaluate(name, millis, claim)
        self.own[name] += millis
        for node, used, demand, lendable in updates:
            self.claimed[node] += claim
            parent = self.parent[node]
            self.sum_child_demand[parent] += demand - self.demand[node]
            self.sum_child_lendable[parent] += lendable - self.lendable[node]
            self.used[node] = used
            self.demand[node] = demand
            self.lendable[node] = lendable
            self.jobs[node] += jobs


class QuotaBook:
    """Usage per quota node and flavor, kept up to date as the cycle admits jobs."""

    def __init__(self, snapshot: Snapshot, capacity_millis: dict[str, int], *, require_quota: bool) -> None:
        self.require_quota = require_quota
        self.tenant_parent: dict[str, str | None] = {t.name: t.parent for t in snapshot.tenants}
        self._ancestors: dict[str, list[str]] = {}
        self._accounts: dict[tuple[str, str], str | None] = {}
        self._subtree: dict[tuple[str, str], bool] = {}
        # ``admit``'s answers, each with the version of its flavor's tree it was computed at: between two
        # charges the cycle asks the same question for every job of the same shape and tenant.
        self._admitted: dict[tuple, tuple[int, Admission]] = {}
        self.trees: dict[str, _FlavorTree] = {}
        rows: dict[str, dict[str, Quota]] = {}
        for q in snapshot.quotas:
            rows.setdefault(q.flavor, {})[q.tenant] = q
        flavors = set(rows) | set(capacity_millis)
        for flavor in sorted(flavors):
            tree = _FlavorTree()
            by_tenant = rows.get(flavor, {})
            # Insert parents before children: sort by depth, then name.
            for tenant in sorted(by_tenant, key=lambda t: (len(self.ancestors(t)), t)):
                tree.add(tenant, by_tenant[tenant])
                parent = self._nearest_row(self.tenant_parent.get(tenant), by_tenant)
                tree.parent[tenant] = parent
                tree.children[parent].append(tenant)
            for tenant, kids in tree.children.items():
                tree.sum_child_g[tenant] = sum(tree.guaranteed[k] for k in kids)
            for tenant in tree.parent:
                tree.lendable[tenant], _ = self._initial_lendable(tree, tenant)
            promised = sum(tree.guaranteed[k] for k in tree.children[_ROOT])
            tree.root_pool = max(0, capacity_millis.get(flavor, 0) - promised)
            # Lendable is read from the tree's tables by ``_values``; seed the parents' sums.
            for tenant in tree.parent:
                tree.sum_child_lendable[tree.parent[tenant]] += tree.lendable[tenant]
            self.trees[flavor] = tree
        self._charge_existing(snapshot)

    # -- tree helpers ----------------------------------------------------------------------------------------

    def ancestors(self, tenant: str) -> list[str]:
        cached = self._ancestors.get(tenant)
        if cached is not None:
            return cached
        out: list[str] = []
        seen = {tenant}
        parent = self.tenant_parent.get(tenant)
        while parent is not None and parent not in seen:  # tolerate a cycle in bad input
            out.append(parent)
            seen.add(parent)
            parent = self.tenant_parent.get(parent)
        self._ancestors[tenant] = out
        return out

    def in_subtree(self, tenant: str, root: str) -> bool:
        key = (tenant, root)
        found = self._subtree.get(key)
        if found is None:
            found = tenant == root or root in self.ancestors(tenant)
            self._subtree[key] = found
        return found

    def _nearest_row(self, tenant: str | None, by_tenant: dict[str, Quota]) -> str:
        while tenant is not None:
            if tenant in by_tenant:
                return tenant
            tenant = self.tenant_parent.get(tenant)
        return _ROOT

    @staticmethod
    def _initial_lendable(tree: _FlavorTree, tenant: str) -> tuple[int, int]:
        g = tree.guaranteed[tenant]
        lend = tree.lend_limit[tenant]
        return (g if lend is None else min(lend, g)), 0

    def account(self, tenant: str, flavor: str) -> str | None:
        """The quota node a job of ``tenant`` on ``flavor`` is charged to; None when there is none."""
        key = (tenant, flavor)
        if key in self._accounts:
            return self._accounts[key]
        found = self._account(tenant, flavor)
        self._accounts[key] = found
        return found

    def _account(self, tenant: str, flavor: str) -> str | None:
        tree = self.trees.get(flavor)
        if tree is None:
            tree = _FlavorTree()
            self.trees[flavor] = tree
        if tenant in tree.parent:
            return tenant
        for ancestor in self.ancestors(tenant):
            if ancestor in tree.parent:
                return ancestor
        if self.require_quota:
            return None
        # No quota anywhere up the tree: an unlimited root node with no guarantee (it can only borrow).
        tree.add(tenant, None)
        tree.parent[tenant] = _ROOT
        tree.children[_ROOT].append(tenant)
        return tenant

    def _charge_existing(self, snapshot: Snapshot) -> None:
        per_job: dict[tuple[str, str], tuple[str, int]] = {}
        # A job running on an inference reservation is charged to its own tenant as well (conservative: the
        # reservation stays charged to the service's tenant), so no tenant escapes its limit that way.
        for alloc in snapshot.allocations:
            key = (alloc.job_id, alloc.flavor)
            tenant, millis = per_job.get(key, (alloc.tenant, 0))
            per_job[key] = (tenant, millis + _charged_millis(alloc))
        for res in snapshot.reservations:
            key = (res.job_id, res.flavor)
            tenant, millis = per_job.get(key, (res.tenant, 0))
            per_job[key] = (tenant, millis + res.millis)
        # The tree's state depends only on the totals, so charge each quota node once.
        per_node: dict[tuple[str, str], tuple[int, int]] = {}
        for (_, flavor), (tenant, millis) in per_job.items():
            node = self.account(tenant, flavor)
            if node is not None:
                total, jobs = per_node.get((flavor, node), (0, 0))
                per_node[(flavor, node)] = (total + millis, jobs + 1)
        for (flavor, node), (millis, jobs) in sorted(per_node.items()):
            self.trees[flavor].charge(node, millis, jobs)

    # -- admission -------------------------------------------------------------------------------------------

    def version(self) -> int:
        """Changes whenever any flavor's usage, claims or tree does (the sum of the trees' versions)."""
        return sum(tree.version for tree in self.trees.values())

    def usage(self, node: str, flavor: str) -> int:
        return self.trees[flavor].used[node]

    def guaranteed(self, node: str, flavor: str) -> int:
        return self.trees[flavor].guaranteed[node]

    def admit(
        self,
        *,
        tenant: str,
        flavor: str,
        millis: int,
        preemptible: bool,
        borrowing: bool,
        new_job: bool = True,
        no_borrowing: str = sentences.BORROWING_OFF,
    ) -> Admission:
        """Would a job of ``tenant`` taking ``millis`` of ``flavor`` be admitted now? Changes nothing.
        ``no_borrowing``: why the job may not borrow when ``borrowing`` is False, for the message."""
        node = self.account(tenant, flavor)
        if node is None:
            return Admission(
                False,
                code=PendingReason.NO_QUOTA,
                message=clauses(
                    say(sentences.TENANT_NO_QUOTA, tenant=tenant, flavor=flavor), sentences.ASK_SYSTEM_ADMIN_ONE
                ),
            )
        tree = self.trees[flavor]
        key = (node, flavor, millis, preemptible, borrowing, new_job, no_borrowing)
        known = self._admitted.get(key)
        if known is not None and known[0] == tree.version:
            return known[1]
        admission = self._admit(tree, node, flavor, millis, preemptible, borrowing, new_job, no_borrowing)
        self._admitted[key] = (tree.version, admission)
        return admission

    def _admit(
        self,
        tree: _FlavorTree,
        node: str,
        flavor: str,
        millis: int,
        preemptible: bool,
        borrowing: bool,
        new_job: bool,
        no_borrowing: str,
    ) -> Admission:
        for ancestor in tree.path(node):
            limit = tree.limit[ancestor]
            used = tree.used[ancestor]
            if limit is not None and used + millis > limit:
                reached = dict(flavor=flavor, used=cards(used), limit=cards(limit), need=cards(millis))
                return Admission(
                    False,
                    code=PendingReason.QUOTA_LIMIT,
                    message=say(sentences.TENANT_QUOTA_LIMIT_REACHED, **reached)
                    if ancestor == node
                    else say(sentences.PARENT_TENANT_QUOTA_LIMIT, tenant=ancestor, **reached),
                    accounted_to=node,
                )
            max_jobs = tree.max_jobs[ancestor]
            if new_job and max_jobs is not None and tree.jobs[ancestor] + 1 > max_jobs:
                return Admission(
                    False,
                    code=PendingReason.MAX_RUNNING_JOBS,
                    message=say(
                        sentences.TENANT_ALREADY_RUNS_JOBS,
                        tenant=ancestor,
                        jobs=tree.jobs[ancestor],
                        max=max_jobs,
                        flavor=flavor,
                    ),
                    accounted_to=node,
                )
        g = tree.guaranteed[node]
        used = tree.used[node]
        borrowed = max(0, used + millis - g) - max(0, used - g)
        if borrowed == 0:
            return Admission(True, 0, accounted_to=node)
        exhausted = say(sentences.TENANT_QUOTA_EXHAUSTED, flavor=flavor, used=cards(used), g=cards(g))
        if not borrowing:
            return Admission(
                False,
                code=PendingReason.QUOTA_EXHAUSTED,
                message=say(
                    sentences.TENANT_QUOTA_EXHAUSTED_BECAUSE,
                    flavor=flavor,
                    used=cards(used),
                    g=cards(g),
                    why=no_borrowing,
                ),
                accounted_to=node,
            )
        if not preemptible:
            return Admission(
                False,
                code=PendingReason.QUOTA_EXHAUSTED,
                message=clauses(exhausted, sentences.ONLY_PREEMPTIBLE_JOBS_MAY),
                accounted_to=node,
            )
        for ancestor in tree.path(node):
            # A borrower may not take room under a limit that queued jobs within their guarantees are owed:
            # they would find it taken by work too fresh to reclaim, and wait another minimum runtime.
            limit = tree.limit[ancestor]
            owed = tree.claimed[ancestor]
            if limit is not None and owed > 0 and tree.used[ancestor] + owed + millis > limit:
                return Admission(
                    False,
                    code=PendingReason.NO_LENDABLE_CAPACITY,
                    message=clauses(
                        exhausted,
                        say(
                            sentences.CARDS_LEFT_UNDER_QUOTA,
                            left=cards(max(0, limit - tree.used[ancestor])),
                            tenant=ancestor,
                            flavor=flavor,
                        ),
                    ),
                    accounted_to=node,
                )
        _, top_slack = tree.evaluate(node, millis)
        # Each level passes its shortfall up as its parent's demand, so the top slack decides.
        if top_slack < 0:
            return Admission(
                False,
                code=PendingReason.NO_LENDABLE_CAPACITY,
                message=say(
                    sentences.TENANT_QUOTA_EXHAUSTED_NONE_TO_LEND,
                    flavor=flavor,
                    used=cards(used),
                    g=cards(g),
                    borrow=cards(borrowed),
                ),
                accounted_to=node,
            )
        return Admission(True, borrowed, accounted_to=node)

    def charge(self, *, node: str, flavor: str, millis: int, jobs: int = 1) -> None:
        self.trees[flavor].charge(node, millis, jobs)

    def within_guarantee(self, node: str, flavor: str, millis: int) -> bool:
        """``millis`` more would keep ``node`` within its own guarantee: a job that borrows nothing."""
        tree = self.trees[flavor]
        return tree.used[node] + millis <= tree.guaranteed[node]

    def unclaimed_guarantee(self, node: str, flavor: str) -> int:
        """What ``node``'s guarantee leaves unused and not yet owed to its queued jobs (``claim``)."""
        tree = self.trees[flavor]
        return tree.guaranteed[node] - tree.used[node] - tree.claimed[node]

    def claim(self, *, node: str, flavor: str, millis: int) -> None:
        """Mark ``millis`` of ``node``'s unused guarantee as owed to a queued job that fits in it (negative:
        release it). Claimed guarantee is not lent, and borrowers may not take the room claims need under a
        limit; the claiming jobs themselves are admitted as before. So capacity a reclaim frees for a lender is
        not taken by a borrower of higher priority meanwhile (which would start a fresh, protected loan)."""
        self.trees[flavor].charge(node, 0, 0, claim=millis)

    def over_limits(self, node: str, flavor: str, millis: int) -> list[tuple[str, int]]:
        """The quota nodes on ``node``'s path (itself, then its ancestors) whose limit ``millis`` more would
        exceed, each with the millis it would go over by: what reclaim must free under each of them."""
        tree = self.trees[flavor]
        over = []
        for ancestor in tree.path(node):
            limit = tree.limit[ancestor]
            if limit is not None and tree.used[ancestor] + millis > limit:
                over.append((ancestor, tree.used[ancestor] + millis - limit))
        return over

    def headroom(self, tenant: str, flavor: str, *, step_millis: int = 10) -> int:
        """The largest preemptible job (millis, in ``step_millis`` steps) that ``tenant`` could start on
        ``flavor`` now as far as quota goes — its own unused guarantee and what it could borrow, under every
        limit on its path and the lending of every level up to the pool's unpromised capacity; the answer
        ``admit`` would give. 0 when it has no quota. Admission is monotone in the size (every limit and the
        cohort's slack only tighten as a job grows), so a bisection finds it."""
        if self.account(tenant, flavor) is None:
            return 0

        def fits(millis: int) -> bool:
            return self.admit(
                tenant=tenant, flavor=flavor, millis=millis, preemptible=True, borrowing=True, new_job=False
            ).ok

        tree = self.trees[flavor]
        # No job can be larger than every guarantee and every capacity put together (and a top-level limit).
        high = (sum(tree.guaranteed[k] for k in tree.children[_ROOT]) + tree.root_pool) // step_millis + 1
        low = 0  # ``low`` steps fit, ``high`` steps do not
        if fits(high * step_millis):
            return high * step_millis
        while high - low > 1:
            mid = (low + high) // 2
            if fits(mid * step_millis):
                low = mid
            else:
                high = mid
        return low * step_millis

    def idle_guarantee(
        self, node: str, flavor: str, usage: Mapping[str, Mapping[str, float]], waiting: Mapping[str, int]
    ) -> int:
        """Guarantee that its owners have left idle, from ``node``'s point of view: over the siblings of
        ``node`` and of each of its ancestors, what each one's guarantee leaves above what its subtree holds
        now or its time-decayed use (``usage``: tenant -> flavor -> decayed millis), whichever is more, plus
        what its jobs wait for (``waiting``: tenant -> millis of its pending jobs on this flavor); and the
        capacity promised to nobody. A lender busy an hour ago, or with work queued, wants its guarantee soon."""
        tree = self.trees[flavor]
        recent: dict[str, float] = {}
        queued: dict[str, int] = {}
        for tenant in set(usage) | set(waiting):
            value = usage.get(tenant, {}).get(flavor, 0.0)
            wants = waiting.get(tenant, 0)
            account = self.account(tenant, flavor) if value > 0 or wants > 0 else None
            for ancestor in tree.path(account) if account is not None else ():
                recent[ancestor] = recent.get(ancestor, 0.0) + value
                queued[ancestor] = queued.get(ancestor, 0) + wants
        idle = tree.root_pool
        for step in tree.path(node):
            for sibling in tree.children[tree.parent[step]]:
                if sibling != step:
                    busy = max(tree.used[sibling], int(recent.get(sibling, 0.0))) + queued.get(sibling, 0)
                    spare = max(0, tree.guaranteed[sibling] - busy)
                    lend = tree.lend_limit[sibling]
                    idle += spare if lend is None else min(spare, lend)
        return idle

    def borrowed_now(self, node: str, flavor: str) -> int:
        tree = self.trees[flavor]
        return max(0, tree.used[node] - tree.guaranteed[node])


def _charged_millis(alloc: Allocation) -> int:
    return alloc.millis if alloc.millis < MILLIS_PER_DEVICE else MILLIS_PER_DEVICE
