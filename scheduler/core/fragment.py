"""Fragmentation-aware placement, after FGD (Weng et al., "Beware of Fragmentation", ATC 2023), counting host CPU.

A node's *fragmentation* for a task shape m is the free GPU (millis) on it that m could not use. FGD asks
whether one more task of m fits; we ask how many would: fill the node with m as far as its cards *and* its
free CPU allow, and count the free millis left over. So a node whose CPU runs out before its cards (96 cores
beside 8 cards, 11-core one-card tasks) shows those cards as stranded before the last core is gone, which
FGD's one-task test only sees once it is too late. For a fraction of f millis the cards hold Σ ⌊free/f⌋ of
it; for k whole cards, ⌊fully free cards / k⌋. The node's fragmentation is the mean over the *target
workload* — the shapes of the work the cluster runs and is asked for (the snapshot's allocations and pending
jobs, the most common ``MAX_SHAPES`` of (millis per card, whole cards, CPU)), weighted by how often each
occurs. Host memory is checked by placement but is not part of a shape: it rarely binds, and splitting shapes
by it left the most common 16 covering 70 % of openb's tasks instead of 75 %. Work goes where it raises the
fragmentation the least (FGD's gradient step); ties go to the fuller card (best fit), then the lower device id.

Bounded work per placement: the candidates are the first ``CANDIDATE_CARDS`` partly used cards that fit (in
best-fit order) and a fresh card on each of the first ``CANDIDATE_NODES`` nodes with one (busiest first), and
a candidate's change is computed from the one card and the node's host resources it changes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from .capacity import Cluster
from .types import MILLIS_PER_DEVICE, Snapshot

MAX_SHAPES = 16
CANDIDATE_CARDS = 12
CANDIDATE_NODES = 6

# (per-card millis (< 1000: a fraction), whole cards, CPU millicores)
Shape = tuple[int, int, int]


def target_workload(snapshot: Snapshot) -> list[tuple[Shape, float]]:
    """The most common replica shapes of the snapshot's allocations and pending jobs, with their weights."""
    count: Counter[Shape] = Counter()
    replicas: dict[tuple[str, int], list[int]] = {}
    for a in snapshot.allocations:
        if a.millis <= 0:
            continue  # host-only rows (work that asks no GPU) say nothing about GPU shapes
        row = replicas.setdefault((a.job_id, a.replica), [0, 0, 0])
        if a.millis < MILLIS_PER_DEVICE:
            row[0] = a.millis
        else:
            row[1] += 1
        row[2] += a.cpu_millicores
    for millis, whole, cpu in replicas.values():
        count[(millis if not whole else MILLIS_PER_DEVICE, whole, cpu)] += 1
    for job in snapshot.pending:
        req = job.request
        whole = 0 if req.fractional else req.device_count
        count[(req.millis if req.fractional else MILLIS_PER_DEVICE, whole, req.cpu_millicores)] += job.replicas
    return most_common_shapes(count)


def most_common_shapes(count: Counter[Shape]) -> list[tuple[Shape, float]]:
    """The ``MAX_SHAPES`` most common shapes of ``count`` (ties in shape order), weighted by their share of them."""
    top = sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_SHAPES]
    total = sum(c for _, c in top) or 1
    return [(shape, c / total) for shape, c in top]


def take_whole(frees: list[int], n_cards: int) -> list[int]:
    """``frees`` (free millis per card) after ``n_cards`` fully free cards are taken, the first ones first."""
    after = list(frees)
    for i, f in enumerate(after):
        if not n_cards:
            break
        if f >= MILLIS_PER_DEVICE:
            after[i] = 0
            n_cards -= 1
    return after


def fraction_slots(shapes: list[tuple[Shape, float]], frees: list[int]) -> list[int]:
    """Per shape, how many of it the cards ``frees`` could hold, CPU aside (0 for whole-card shapes)."""
    out = []
    for (millis, whole, _), _ in shapes:
        n = 0
        if not whole:
            for f in frees:  # a plain loop: this is the hot path of a placement
                n += f // millis
        out.append(n)
    return out


def expected_unusable_millis(
    shapes: list[tuple[Shape, float]], frees: list[int], total: int, full: int, cpu: int
) -> float:
    """The fragmentation of one node: the free millis that the target workload (``shapes``, each with its
    probability) could not use, given each usable card's free millis ``frees`` (``total`` of them, ``full`` cards
    entirely free) and the node's free CPU. The simulator's fragmentation experiment scores with this same
    function."""
    return _unusable(shapes, fraction_slots(shapes, frees), total, full, cpu)


def _unusable(shapes: list[tuple[Shape, float]], slots: list[int], total: int, full: int, cpu: int) -> float:
    """``expected_unusable_millis`` with each fractional shape's card slots already counted."""
    out = 0.0
    for ((millis, whole, s_cpu), p), n in zip(shapes, slots, strict=True):
        if whole:
            n, unit = full // whole, whole * MILLIS_PER_DEVICE
        else:
            unit = millis
        if s_cpu and n:
            n = min(n, max(0, cpu) // s_cpu)
        out += p * (total - n * unit)
    return out


class Fragmentation:
    def __init__(self, cluster: Cluster, snapshot: Snapshot) -> None:
        self.c = cluster
        self._snapshot = snapshot
        self._shapes: list[tuple[Shape, float]] | None = None
        #: ``pick``'s figures by what they depend on alone (the node's free millis per card, its free CPU; the
        #: card's free millis and the request), computed once a cycle: many nodes are in the same state.
        self._before: dict[tuple, tuple[list[int], float]] = {}
        self._after: dict[tuple, float] = {}

    @property
    def shapes(self) -> list[tuple[Shape, float]]:
        """The target workload, computed on first use (a cycle that places no fraction never pays for it)."""
        if self._shapes is None:
            self._shapes = target_workload(self._snapshot)
        return self._shapes

    def node_terms(self, n: int, flavor: str) -> tuple[list[int], int, int]:
        """(free millis of each usable card of the flavor, sum of them, fully free cards)."""
        c = self.c
        frees = [c.dev_free_millis[d] for d in c.node_devs[n].get(flavor, ()) if c.indexed(d)]
        return frees, sum(frees), sum(1 for f in frees if f >= MILLIS_PER_DEVICE)

    def frag(self, frees: list[int], total: int, full: int, cpu: int) -> float:
        """Expected free millis of the node that the target workload could not use."""
        return expected_unusable_millis(self.shapes, frees, total, full, cpu)

    def whole_delta(self, n: int, flavor: str, n_cards: int, host: tuple[int, int]) -> float:
        """How much taking ``n_cards`` fully free cards (and ``host``) on node ``n`` raises its fragmentation."""
        c = self.c
        frees, total, full = self.node_terms(n, flavor)
        cpu0 = c.node_free_cpu[n]
        before = self.frag(frees, total, full, cpu0)
        taken = n_cards * MILLIS_PER_DEVICE
        after = self.frag(take_whole(frees, n_cards), total - taken, full - n_cards, cpu0 - host[0])
        return round(after - before, 6)

    def pick(
        self,
        flavor: str,
        millis: int,
        cards: list[int],
        fresh_nodes: list[int],
        host: tuple[int, int],
        fits: Callable[[int], bool],
    ) -> int | None:
        """The card (device id) among ``cards`` (partly used) and a fresh card of ``fresh_nodes`` that raises
        the node's fragmentation the least for a fraction of ``millis`` with ``host`` CPU and memory."""
        c = self.c
        cpu = host[0]
        by_node: dict[int, list[int]] = {}
        for d in cards:
            by_node.setdefault(c.dev_node[d], []).append(d)
        for n in fresh_nodes:
            d = next(
                (d for d in c.node_devs[n].get(flavor, ()) if c.indexed(d) and c.is_free(d) and fits(d)),
                None,
            )
            if d is not None:
                by_node.setdefault(n, []).append(d)
        best: tuple[tuple, int] | None = None
        shapes = self.shapes
        for n, devs in by_node.items():
            frees, total, full = self.node_terms(n, flavor)
            cpu0 = c.node_free_cpu[n]
            state = (tuple(frees), cpu0)  # total and full follow from frees
            known = self._before.get(state)
            if known is None:
                slots = fraction_slots(shapes, frees)
                known = self._before[state] = (slots, _unusable(shapes, slots, total, full, cpu0))
            slots, before = known
            for d in devs:
                free = c.dev_free_millis[d]  # the card's entry in frees (a candidate is an indexed card)
                left = free - millis
                after = self._after.get((state, free, millis, cpu))
                if after is None:
                    # A candidate changes one card, so each shape's slots after it are the node's less that
                    # card's old slots plus its new ones (not a rescan of the node).
                    after_slots = [
                        x if whole else x - free // m + left // m
                        for ((m, whole, _), _), x in zip(shapes, slots, strict=True)
                    ]
                    after = self._after[(state, free, millis, cpu)] = _unusable(
                        shapes, after_slots, total - millis, full - (1 if free >= MILLIS_PER_DEVICE else 0), cpu0 - cpu
                    )
                key = (round(after - before, 6), left, d)
                if best is None or key < best[0]:
                    best = (key, d)
        return None if best is None else best[1]
