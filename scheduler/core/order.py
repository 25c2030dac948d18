"""Step 1, order: priority class, then aged gangs, then jobs within their tenant's guarantee, then tenant fair
share, then submit time (ties: a stable numeric order of the job ids).

Fair share is dominant-resource fairness (DRF): a tenant's share is the largest, over flavors, of
``max(millis held now, time-decayed usage) / usable millis of the flavor``, divided by the tenant's
``fair_share_weight``. The decayed usage (``Snapshot.usage``) is an average of millis held that the caller
updates with what is held now, so it already contains the allocations: adding the two would count current
use twice. The larger of the two charges a tenant for what it holds even before its average catches up,
and for recent use it no longer holds while that decays. It is hierarchical — shares are compared root first
along the tenant tree, so departments are balanced before the teams inside them. Within one priority class
the queue is served tenant by tenant, always from the tenant with the lowest share, and a tenant's share
grows as its jobs are placed during the cycle — so two tenants with equal weight alternate instead of the
first submitter taking everything.

Two promises come before fair share inside a priority class:

- **guarantees**: a tenant whose next job fits in its unused guarantee is served before any tenant whose next
  job would borrow (``within`` callable from the engine), so capacity that frees up goes to the lender first
  and borrowers only ever get what no guarantee wants now;
- **gangs not starved**: a gang of at least ``Policy.gang_aging_cards`` cards that has waited
  ``Policy.gang_aging_s`` is served before both (oldest first), so it becomes the head of its flavor's queue
  and gets capacity held for it (``backfill.py``) instead of losing every freed node to small jobs.

Ties on the submit time break on the job id in *numeric* order (``job-9`` before ``job-10``), never on the
string: a trace with thousands of jobs submitted in the same second must not be ordered by naming.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections.abc import Callable, Iterator

from .types import MILLIS_PER_DEVICE, Ordering, PendingJob, Policy, Snapshot


def decay_usage(previous_millis: float, current_millis: float, elapsed_s: float, half_life_s: float) -> float:
    """Exponentially decayed average of millis held, for ``Snapshot.usage``.

    The caller keeps one value per (tenant, flavor) and updates it every cycle: the old value loses half its
    weight every ``half_life_s`` and the rest comes from what the tenant holds now.
    """
    if half_life_s <= 0 or elapsed_s <= 0:
        return current_millis if half_life_s <= 0 else previous_millis
    keep = math.pow(0.5, elapsed_s / half_life_s)
    return previous_millis * keep + current_millis * (1.0 - keep)


_DIGITS = re.compile(r"(\d+)")


def natural_key(job_id: str) -> tuple[tuple[int, int, str], ...]:
    """``"job-10"`` → parts compared numerically where they are digits: ``job-9`` < ``job-10`` < ``job-10a``."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(job_id) if part)


def job_key(job: PendingJob) -> tuple[float, tuple[tuple[int, int, str], ...]]:
    """Submit time, then a stable numeric order of the job id (see the module docstring)."""
    return (job.submitted_at, natural_key(job.job_id))


def aged_gang(job: PendingJob, policy: Policy, now: float) -> bool:
    """A big gang that has waited long enough to go first in its priority class (``Policy.gang_aging_*``)."""
    if policy.gang_aging_s is None:
        return False
    cards = job.gang_min * max(1, job.request.millis // MILLIS_PER_DEVICE)
    return cards >= policy.gang_aging_cards and now - job.submitted_at >= policy.gang_aging_s


class FairShare:
    """Hierarchical dominant share; ``add`` is called when the cycle places a job.

    A tenant's share is compared as the tuple of shares along its path from the root of the tenant tree, so
    departments are balanced first and teams within a department next (usage rolls up the tree). Per tree
    node and flavor it counts ``max(held now, decayed usage)`` (see the module docstring).
    """

    def __init__(self, snapshot: Snapshot, capacity_millis: dict[str, int]) -> None:
        self.capacity = {f: max(c, MILLIS_PER_DEVICE) for f, c in capacity_millis.items()}
        self.weight = {t.name: (t.fair_share_weight if t.fair_share_weight > 0 else 1.0) for t in snapshot.tenants}
        self.parent = {t.name: t.parent for t in snapshot.tenants}
        self._paths: dict[str, tuple[str, ...]] = {}
        self.held: dict[str, dict[str, float]] = {}  # millis held now (and placed this cycle), rolled up
        self.decayed: dict[str, dict[str, float]] = {}  # the caller's decayed usage, rolled up
        self.charged: dict[str, dict[str, float]] = {}  # max of the two: what the share counts
        # Per quota-tree node, its share as last computed; ``add`` drops the entries of the nodes it changes.
        self._node_shares: dict[str, float] = {}
        self.changes = 0  # counts ``add``: a share read at the same count is still the share
        for tenant, per_flavor in sorted(snapshot.usage.items()):
            for flavor, millis in sorted(per_flavor.items()):
                self._roll_up(self.decayed, tenant, flavor, float(millis))
        for name, per_flavor in self.decayed.items():
            self.charged[name] = dict(per_flavor)
        for alloc in snapshot.allocations:
            self.add(alloc.tenant, alloc.flavor, min(alloc.millis, MILLIS_PER_DEVICE))

    def path(self, tenant: str) -> tuple[str, ...]:
        """Root first, ``tenant`` last."""
        cached = self._paths.get(tenant)
        if cached is None:
            out = [tenant]
            parent = self.parent.get(tenant)
            while parent is not None and parent not in out:  # tolerate a cycle in bad input
                out.append(parent)
                parent = self.parent.get(parent)
            cached = tuple(reversed(out))
            self._paths[tenant] = cached
        return cached

    def _node_share(self, name: str) -> float:
        cached = self._node_shares.get(name)
        if cached is not None:
            return cached
        per_flavor = self.charged.get(name)
        if not per_flavor:
            value = 0.0
        else:
            dominant = max(
                millis / self.capacity.get(flavor, MILLIS_PER_DEVICE) for flavor, millis in per_flavor.items()
            )
            value = dominant / self.weight.get(name, 1.0)
        self._node_shares[name] = value
        return value

    def share(self, tenant: str) -> tuple[float, ...]:
        return tuple(self._node_share(name) for name in self.path(tenant))

    def add(self, tenant: str, flavor: str, millis: float) -> None:
        """``tenant`` holds ``millis`` more of ``flavor`` (a running allocation, or a job placed this cycle)."""
        self.changes += 1
        for name in self.path(tenant):
            bucket = self.held.setdefault(name, {})
            held = bucket.get(flavor, 0.0) + millis
            bucket[flavor] = held
            decayed = self.decayed.get(name, {}).get(flavor, 0.0)
            self.charged.setdefault(name, {})[flavor] = held if held > decayed else decayed
            self._node_shares.pop(name, None)

    def _roll_up(self, table: dict[str, dict[str, float]], tenant: str, flavor: str, millis: float) -> None:
        for name in self.path(tenant):
            bucket = table.setdefault(name, {})
            bucket[flavor] = bucket.get(flavor, 0.0) + millis


def ordered(
    snapshot: Snapshot,
    policy: Policy,
    fair: FairShare,
    within: Callable[[PendingJob], bool] | None = None,
    *,
    by_submit: list[PendingJob] | None = None,
    version: Callable[[], object] | None = None,
) -> Iterator[PendingJob]:
    """Yield pending jobs in the order the cycle serves them (lazily: fair share moves as jobs are placed).

    ``within(job)``: the job would fit in its tenant's unused guarantee now (the engine asks its quota book);
    None treats every job alike. ``by_submit``: the pending jobs already sorted by ``job_key`` (the caller
    sorted them for something else). ``version()``: a value that changes whenever what ``within`` reads
    changes (fair share is counted here): a job's rank is then not recomputed while neither moved."""
    jobs = sorted(snapshot.pending, key=job_key) if by_submit is None else by_submit
    if policy.ordering == Ordering.FIFO:
        yield from jobs
        return
    # Without ``version`` every rank is recomputed: a counter that moves at each read says nothing is fresh.
    moved = itertools.count().__next__ if version is None else lambda: (fair.changes, version())
    by_priority: dict[int, list[PendingJob]] = {}
    for job in jobs:
        by_priority.setdefault(int(job.priority), []).append(job)
    for priority in sorted(by_priority, reverse=True):
        group = by_priority[priority]
        aged = [j for j in group if aged_gang(j, policy, snapshot.now)]
        if aged:
            yield from aged
            taken = {j.job_id for j in aged}
            group = [j for j in group if j.job_id not in taken]
        if not policy.fair_share:
            yield from group
            continue
        yield from _round_robin_by_share(group, fair.share, within, version=moved)


def _round_robin_by_share(
    group: list[PendingJob],
    share: Callable[[str], tuple[float, ...]],
    within: Callable[[PendingJob], bool] | None,
    version: Callable[[], object],
) -> Iterator[PendingJob]:
    # ``group`` is in submit order (``job_key``), so a job's position in it stands for its key in the heap.
    queues: dict[str, list[PendingJob]] = {}
    positions: dict[str, list[int]] = {}
    for position, job in enumerate(group):
        queues.setdefault(job.tenant, []).append(job)
        positions.setdefault(job.tenant, []).append(position)

    def rank(job: PendingJob) -> tuple[int, tuple[float, ...]]:
        # 0: fits in its tenant's unused guarantee; 1: would borrow. Both only grow as the cycle places jobs.
        borrows = 0 if within is None or within(job) else 1
        return (borrows, share(job.tenant))

    # heap of ((borrows, share), position of the head in submit order, tenant, index of the tenant's next job,
    # the version its rank was computed at); positions are unique, so the version is never compared.
    stamp = version()
    heap = [(rank(q[0]), positions[t][0], t, 0, stamp) for t, q in queues.items()]
    heapq.heapify(heap)
    while heap:
        stored, key, tenant, i, at = heapq.heappop(heap)
        queue = queues[tenant]
        # Placing a job raises the shares (and usage) of its tenant's ancestors too, so other tenants' entries
        # go stale; ranks only grow, so re-checking the popped entry (and pushing it back if it grew) is enough.
        # Nothing moved since its rank was computed (same version): it is fresh.
        current = version()
        if at != current:
            fresh = rank(queue[i])
            if fresh > stored:
                heapq.heappush(heap, (fresh, key, tenant, i, current))
                continue
        yield queue[i]  # the consumer may place it, which raises the tenant's share
        i += 1
        if i < len(queue):
            heapq.heappush(heap, (rank(queue[i]), positions[tenant][i], tenant, i, version()))
