"""Fragmentation-aware placement of fractions, after FGD (Weng et al., "Beware of Fragmentation", ATC 2023).

A node's *fragmentation* for a task shape m is the free GPU (millis) on it that m could not use: all of it
when the node lacks the host CPU or memory m asks for (or, for m of k whole cards, has fewer than k free
cards); otherwise the free millis of the cards m cannot use (cards with less free than m's fraction; for
whole-card m, the partly used cards). The node's fragmentation is the mean over the *target workload* — the
shapes of the work the cluster runs and is asked for (the snapshot's allocations and pending jobs, the most
common ``MAX_SHAPES``), weighted by how often each occurs. A fraction goes where it raises that the least
(FGD's gradient step); ties go to the fuller card (best fit), then the lower device id.

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

# (per-card millis (< 1000: a fraction), whole cards, cpu millicores, host memory MiB)
Shape = tuple[int, int, int, int]


def target_workload(snapshot: Snapshot) -> list[tuple[Shape, float]]:
    """The most common replica shapes of the snapshot's allocations and pending jobs, with their weights."""
    count: Counter[Shape] = Counter()
    replicas: dict[tuple[str, int], list[int]] = {}
    for a in snapshot.allocations:
        if a.millis <= 0:
            continue  # host-only rows (work that asks no GPU) say nothing about GPU shapes
        row = replicas.setdefault((a.job_id, a.replica), [0, 0, 0, 0])
        if a.millis < MILLIS_PER_DEVICE:
            row[0] = a.millis
        else:
            row[1] += 1
        row[2] += a.cpu_millicores
        row[3] += a.host_memory_mib
    for millis, whole, cpu, mem in replicas.values():
        count[(millis if not whole else MILLIS_PER_DEVICE, whole, cpu, mem)] += 1
    for job in snapshot.pending:
        req = job.request
        whole = 0 if req.fractional else req.device_count
        shape = (req.millis if req.fractional else MILLIS_PER_DEVICE, whole, req.cpu_millicores, req.host_memory_mib)
        count[shape] += job.replicas
    top = sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_SHAPES]
    total = sum(c for _, c in top) or 1
    return [(shape, c / total) for shape, c in top]


Shape = tuple[int, int, int, int]  # (millis per card, whole cards, CPU millicores, host memory MiB)


def expected_unusable_millis(
    shapes: list[tuple[Shape, float]], frees: list[int], total: int, full: int, cpu: int, mem: int
) -> float:
    """FGD's fragmentation of one node: the free millis that the target workload (``shapes``, each with its
    probability) could not use, given each usable card's free millis ``frees`` (``total`` of them, ``full`` cards
    entirely free) and the node's free CPU and host memory. The simulator's fragmentation experiment scores with
    this same function."""
    out = 0.0
    for (millis, whole, s_cpu, s_mem), p in shapes:
        if cpu < s_cpu or mem < s_mem:
            out += p * total
        elif whole:
            out += p * (total if full < whole else total - full * MILLIS_PER_DEVICE)
        else:
            stranded = 0  # a plain loop: this is the hot path of a fractional placement
            for f in frees:
                if f < millis:
                    stranded += f
            out += p * stranded
    return out


class Fragmentation:
    def __init__(self, cluster: Cluster, snapshot: Snapshot) -> None:
        self.c = cluster
        self._snapshot = snapshot
        self._shapes: list[tuple[Shape, float]] | None = None

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

    def frag(self, frees: list[int], total: int, full: int, cpu: int, mem: int) -> float:
        """Expected free millis of the node that the target workload could not use."""
        return expected_unusable_millis(self.shapes, frees, total, full, cpu, mem)

    def whole_delta(self, n: int, flavor: str, n_cards: int, host: tuple[int, int]) -> float:
        """How much taking ``n_cards`` fully free cards (and ``host``) on node ``n`` raises its fragmentation."""
        c = self.c
        frees, total, full = self.node_terms(n, flavor)
        cpu0, mem0 = c.node_free_cpu[n], c.node_free_host_mem[n]
        before = self.frag(frees, total, full, cpu0, mem0)
        after_frees = list(frees)
        left = n_cards
        for i, f in enumerate(after_frees):
            if left and f >= MILLIS_PER_DEVICE:
                after_frees[i] = 0
                left -= 1
        taken = n_cards * MILLIS_PER_DEVICE
        after = self.frag(after_frees, total - taken, full - n_cards, cpu0 - host[0], mem0 - host[1])
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
        cpu, mem = host
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
            cpu0, mem0 = c.node_free_cpu[n], c.node_free_host_mem[n]
            # Per fractional shape, the free millis of cards too small for it; a candidate changes one card,
            # so its "after" is this less that card's old share plus its new one (not a rescan of the node).
            # Only partly used cards can strand a fraction (a full card fits any, a busy one has nothing).
            partial = [f for f in frees if 0 < f < MILLIS_PER_DEVICE]
            stranded = [
                0 if whole or not partial else sum(f for f in partial if f < m) for (m, whole, _, _), _ in shapes
            ]
            before = _fragmentation(shapes, stranded, total, full, cpu0, mem0)
            index = [d for d in c.node_devs[n].get(flavor, ()) if c.indexed(d)]
            for d in devs:
                free = frees[index.index(d)]
                left = free - millis
                after_stranded = [
                    0 if whole else x - (free if free < m else 0) + (left if left < m else 0)
                    for ((m, whole, _, _), _), x in zip(shapes, stranded, strict=True)
                ]
                after = _fragmentation(
                    shapes,
                    after_stranded,
                    total - millis,
                    full - (1 if free >= MILLIS_PER_DEVICE else 0),
                    cpu0 - cpu,
                    mem0 - mem,
                )
                key = (round(after - before, 6), left, d)
                if best is None or key < best[0]:
                    best = (key, d)
        return None if best is None else best[1]


def _fragmentation(
    shapes: list[tuple[Shape, float]], stranded: list[int], total: int, full: int, cpu: int, mem: int
) -> float:
    """``expected_unusable_millis`` with each fractional shape's stranded millis already summed."""
    out = 0.0
    for ((_, whole, s_cpu, s_mem), p), x in zip(shapes, stranded, strict=True):
        if cpu < s_cpu or mem < s_mem:
            out += p * total
        elif whole:
            out += p * (total if full < whole else total - full * MILLIS_PER_DEVICE)
        else:
            out += p * x
    return out
