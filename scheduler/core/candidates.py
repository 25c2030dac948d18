"""The victims one preemption search may stop, as the per-node search reads them.

A per-node search (``Preemptor._search_per_node``) needs two things of its candidates: the ``max_nodes`` nodes
whose cheapest candidate is cheapest, and, on each of those nodes, its candidates cheapest first. Built as a
list, that meant judging every running job of the flavor and grouping them all by node on every search: at
10,000 nodes with 70,000 running jobs, most of a cycle went there, for searches that look at 48 or 96 nodes.

``Streamed`` answers the same two questions lazily. The cheapest nodes come from a walk of the candidates in
cost order that stops once enough nodes are seen (every node not yet seen has a dearer cheapest candidate, since
costs are unique); a node's candidates come from the running jobs on that node (a per-node index the preemptor
builds once per cycle). Both give exactly what the list gave, in the same order: the cost order is total
(``Victim.cost`` ends with the job id) and every test of a candidate is the list's own test, asked later.

A search's candidates come in tiers: reclaim and priority victims first, then the jobs a relocation may move
(``Preemptor.search``'s second pass); on a node the later tier's candidates follow the earlier's, and a node is
ranked by its first candidate, as for the list ``first + movable``. ``Listed`` keeps a plain list for the
searches that build one (reclaim under limits, a quota's own newer jobs).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .preempt import Victim
    from .types import PreemptReason

Pair = tuple["Victim", "PreemptReason"]


class Candidates(Protocol):
    def __bool__(self) -> bool: ...

    def cheapest_nodes(self, max_nodes: int, matches: Callable[[int], bool]) -> list[tuple[tuple, int]]:
        """``(cost of its cheapest candidate, node)`` of the ``max_nodes`` nodes (that ``matches``) whose
        cheapest candidate is cheapest, cheapest first (ties by node)."""
        ...

    def on_node(self, node: int) -> Sequence[Pair]:
        """The candidates on ``node``, in the search's order."""
        ...

    def without(self, picked: set[str]) -> Candidates:
        """The same candidates less the jobs ``picked`` (a gang's earlier replicas took them)."""
        ...


class Listed:
    """Candidates given as a list, cheapest first."""

    def __init__(self, pairs: list[Pair]) -> None:
        self.pairs = pairs
        self._per_node: dict[int, list[Pair]] | None = None

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def _grouped(self) -> dict[int, list[Pair]]:
        if self._per_node is None:
            self._per_node = {}
            for v, r in self.pairs:  # cheapest first, so each node's list is sorted
                for n in v.nodes:
                    self._per_node.setdefault(n, []).append((v, r))
        return self._per_node

    def cheapest_nodes(self, max_nodes: int, matches: Callable[[int], bool]) -> list[tuple[tuple, int]]:
        firsts = ((pairs[0][0].cost(), n) for n, pairs in self._grouped().items() if matches(n))
        return heapq.nsmallest(max_nodes, firsts)

    def on_node(self, node: int) -> Sequence[Pair]:
        return self._grouped().get(node, ())

    def without(self, picked: set[str]) -> Listed:
        return Listed([(v, r) for v, r in self.pairs if v.job_id not in picked])


class Tier:
    """One tier of a search's candidates: ``walk()`` yields them cheapest first and ``on_node(n)`` gives those
    on node ``n`` in the same order. Both apply the same ``judge`` (the reason the job may be stopped, None when
    it may not), once per job and search, so they always agree; a walk goes on from where the last one stopped
    (a gang's replicas and the relocation pass walk the same tier again). ``listed``: whether a job of
    ``by_node`` is one the walk would come to at all (the walk's sources hold some of a node's jobs only)."""

    def __init__(
        self,
        walk: Callable[[], Iterable[Victim]],
        by_node: Callable[[int], Iterable[Victim]],
        judge: Callable[[Victim], PreemptReason | None],
        listed: Callable[[Victim], bool] = lambda _v: True,
    ) -> None:
        self._source: Iterator[Victim] | None = None
        self._start = walk
        self._by_node = by_node
        self._judge = judge
        self._listed = listed
        self._judged: dict[str, PreemptReason | None] = {}
        self._walked: list[Pair] = []
        self._nodes: dict[int, list[Pair]] = {}

    def judge(self, v: Victim) -> PreemptReason | None:
        """The reason for a job the walk comes to (it is ``listed``)."""
        if v.job_id in self._judged:
            return self._judged[v.job_id]
        reason = self._judged[v.job_id] = self._judge(v)
        return reason

    def judge_listed(self, v: Victim) -> PreemptReason | None:
        """The reason for any job: None for one the walk never comes to."""
        return self.judge(v) if self._listed(v) else None

    def walk(self) -> Iterator[Pair]:
        if self._source is None:
            self._source = iter(self._start())
        index = 0
        while True:
            if index < len(self._walked):  # judged already, by this walk or an earlier one
                yield self._walked[index]
                index += 1
                continue
            v = next(self._source, None)
            if v is None:
                return
            r = self.judge(v)
            if r is not None:
                self._walked.append((v, r))

    def on_node(self, node: int) -> list[Pair]:
        pairs = self._nodes.get(node)
        if pairs is None:
            listed = self._listed
            pairs = [(v, r) for v in self._by_node(node) if listed(v) and (r := self.judge(v)) is not None]
            self._nodes[node] = pairs
        return pairs


def _costed(pairs: Iterable[Pair], tier: int) -> Iterator[tuple[tuple, int, Pair]]:
    for pair in pairs:
        yield pair[0].cost(), tier, pair


class Streamed:
    """Candidates in tiers, produced on demand (see the module docstring)."""

    def __init__(self, tiers: Sequence[Tier], picked: frozenset[str] = frozenset()) -> None:
        self.tiers = tuple(tiers)
        self.picked = picked

    def _walk(self) -> Iterator[tuple[tuple, int, Pair]]:
        walks = [_costed(tier.walk(), index) for index, tier in enumerate(self.tiers)]
        merged = walks[0] if len(walks) == 1 else heapq.merge(*walks, key=lambda item: item[0])
        picked = self.picked
        for item in merged:
            if not picked or item[2][0].job_id not in picked:
                yield item

    def __bool__(self) -> bool:
        return next(self._walk(), None) is not None

    def _earlier_tiers_empty_on(self, node: int, tier: int) -> bool:
        return all(not self._kept(self.tiers[earlier].on_node(node)) for earlier in range(tier))

    def _kept(self, pairs: list[Pair]) -> list[Pair]:
        if not self.picked:
            return pairs
        return [(v, r) for v, r in pairs if v.job_id not in self.picked]

    def cheapest_nodes(self, max_nodes: int, matches: Callable[[int], bool]) -> list[tuple[tuple, int]]:
        first: dict[int, tuple] = {}
        for cost, tier, (v, _r) in self._walk():
            if len(first) >= max_nodes:
                break  # every node not seen yet has a dearer cheapest candidate than all of these
            for n in v.nodes:
                # A node is ranked by its first candidate: one in an earlier tier, where it has one.
                if n not in first and matches(n) and (tier == 0 or self._earlier_tiers_empty_on(n, tier)):
                    first[n] = cost
        return heapq.nsmallest(max_nodes, ((cost, n) for n, cost in first.items()))

    def on_node(self, node: int) -> list[Pair]:
        pairs: list[Pair] = []
        for tier in self.tiers:
            pairs += self._kept(tier.on_node(node))
        return pairs

    def without(self, picked: set[str]) -> Streamed:
        return Streamed(self.tiers, self.picked | picked)

    def then(self, tier: Tier) -> Streamed:
        """These candidates, then ``tier``'s."""
        return Streamed((*self.tiers, tier), self.picked)


__all__ = ["Candidates", "Listed", "Streamed", "Tier"]
