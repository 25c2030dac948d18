"""Fragmentation of fractional packing, measured as in the FGD paper (Weng et al., USENIX ATC 2023).

Tasks drawn from a trace's GPU tasks (with replacement, seeded) arrive one after another and never leave,
until the requested GPUs reach ``max_load`` x the cluster's GPUs. A task that does not fit when it arrives is
dropped. After each arrival we record the share of GPU capacity left unallocated; the interesting part is past
100 % load, where a perfect packer leaves nothing unallocated and a fragmenting one strands partial cards.

The engine does the placing: each batch of arrivals is one ``plan()`` call in FIFO order, without quotas,
preemption or capacity held for blocked heads — so a batch places exactly what one-by-one arrivals would
(placements only take capacity, and a shape that failed keeps failing) — and the strategies compared are the
engine's ``FractionalStrategy`` values.

Host CPU and memory constrain placement when the nodes state them and the tasks ask for them (the loader's
default for openb, as in the FGD paper's experiment). CPU-only tasks (``millis == 0``), when given, take host
CPU and memory only; the engine schedules GPU jobs, so the experiment places them itself, by the rule that
matches the strategy (in FGD's simulator one policy places every pod): ``random`` a seeded random node,
``best_fit`` the fullest node (most CPU and memory allocated, by share), ``worst_fit`` the emptiest,
``fragmentation`` the node whose GPU fragmentation for the trace's task shapes grows the least (the core's
``fragment.py`` measure) — before the GPU tasks of the same batch. They add nothing to the arrived GPU load.
"""

from __future__ import annotations

import math
import random
import time as wallclock
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scheduler.core import plan
from scheduler.core.fragment import expected_unusable_millis, most_common_shapes, take_whole
from scheduler.core.types import (
    MILLIS_PER_DEVICE,
    Allocation,
    FractionalStrategy,
    Node,
    Ordering,
    PendingJob,
    Policy,
    ReplicaRequest,
    Snapshot,
)

from .loaders import flavors_by_capacity
from .workload import SimJob

DEFAULT_LEVELS = (0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3)


@dataclass(slots=True)
class FragmentationCurve:
    strategy: str
    capacity_gpus: int
    arrived: list[float] = field(default_factory=list)  # requested GPUs so far / capacity, after each batch
    unallocated: list[float] = field(default_factory=list)  # unallocated share of GPU capacity at that point
    # the same two, counting what the trace's tasks asked for (fractions before rounding up to 100 millis):
    # the paper's measure on both axes
    arrived_trace: list[float] = field(default_factory=list)
    unallocated_trace: list[float] = field(default_factory=list)
    tasks: int = 0
    placed: int = 0
    wall_s: float = 0.0

    def at(self, load: float, *, trace: bool = False) -> float:
        """Unallocated share when the arrived load first reaches ``load`` (linear between batches); with
        ``trace``, counting the trace's unrounded requests as allocated."""
        if trace:
            points = list(zip(self.arrived_trace, self.unallocated_trace, strict=True))
        else:
            points = list(zip(self.arrived, self.unallocated, strict=True))
        prev = (0.0, 1.0)
        for x, y in points:
            if x >= load:
                if x == prev[0]:
                    return y
                return prev[1] + (y - prev[1]) * (load - prev[0]) / (x - prev[0])
            prev = (x, y)
        return float("nan")


def packing_policy(strategy: FractionalStrategy | str, seed: int = 0) -> Policy:
    return Policy(
        preemption=False,
        borrowing=True,
        fair_share=False,
        backfill=True,
        ordering=Ordering.FIFO,
        fractional_strategy=FractionalStrategy(strategy),
        seed=seed,
        require_quota=False,
        max_head_reservations=0,
    )


def fill_cluster(
    nodes: Sequence[Node],
    tasks: Sequence[SimJob],
    strategy: FractionalStrategy | str,
    *,
    max_load: float = 1.3,
    batch: int = 25,
    seed: int = 0,
    sample: bool = True,
) -> FragmentationCurve:
    """Submit tasks sampled from ``tasks`` (``sample=False``: in their order, round and round) until
    ``max_load`` x capacity GPUs were asked for."""
    if not tasks:
        raise ValueError("no GPU tasks to sample from")
    started = wallclock.perf_counter()
    capacity = sum(len(n.devices) for n in nodes) * MILLIS_PER_DEVICE
    curve = FragmentationCurve(strategy=str(FractionalStrategy(strategy)), capacity_gpus=capacity // MILLIS_PER_DEVICE)
    policy = packing_policy(strategy, seed)
    rng = random.Random(seed)  # the same task sequence for every strategy when the seed is the same
    nodes = tuple(nodes)
    allocations: list[Allocation] = []
    allocated = 0
    allocated_trace = 0
    arrived = 0
    arrived_trace = 0
    asked: dict[str, int] = {}
    n = 0
    host = _HostBook(nodes, str(FractionalStrategy(strategy)), random.Random(seed + 1), tasks)
    while arrived_trace < max_load * capacity:
        pending = []
        while len(pending) < batch and arrived_trace < max_load * capacity:
            task = tasks[rng.randrange(len(tasks))] if sample else tasks[n % len(tasks)]
            n += 1
            if task.millis <= 0:  # CPU-only: placed now by the fixed rule, before the batch's GPU tasks
                row = host.place(f"t{n}", task.cpu_millicores, task.host_memory_mib)
                if row is not None:
                    allocations.append(row)
                continue
            arrived += task.charged_millis
            asked[f"t{n}"] = task.replicas * (task.trace_millis or task.millis)
            arrived_trace += asked[f"t{n}"]
            pending.append(
                PendingJob(
                    job_id=f"t{n}",
                    tenant="pool",
                    request=ReplicaRequest(
                        flavors=task.flavors,
                        millis=task.millis,
                        memory_mib=task.memory_mib,
                        cpu_millicores=task.cpu_millicores,
                        host_memory_mib=task.host_memory_mib,
                        any_flavor=task.any_flavor,
                    ),
                    submitted_at=float(n),
                    replicas=task.replicas,
                )
            )
        snapshot = Snapshot(now=float(n), nodes=nodes, allocations=tuple(allocations), pending=tuple(pending))
        result = plan(snapshot, policy)
        for place in result.places:
            curve.placed += 1
            allocated_trace += asked[place.job_id]
            for a in place.assignments:
                allocations.append(
                    Allocation(
                        job_id=place.job_id,
                        replica=a.replica,
                        device_uuid=a.device_uuid,
                        node=a.node,
                        tenant=place.tenant,
                        flavor=place.flavor,
                        millis=a.millis,
                        memory_mib=a.memory_mib,
                        priority=0,
                        preemptible=False,
                        cpu_millicores=a.cpu_millicores,
                        host_memory_mib=a.host_memory_mib,
                    )
                )
                host.take(a.node, a.cpu_millicores, a.host_memory_mib, a.device_uuid, min(a.millis, MILLIS_PER_DEVICE))
                allocated += min(a.millis, MILLIS_PER_DEVICE)
        curve.tasks = n
        curve.arrived.append(arrived / capacity)
        curve.unallocated.append(1.0 - allocated / capacity)
        curve.arrived_trace.append(arrived_trace / capacity)
        curve.unallocated_trace.append(1.0 - allocated_trace / capacity)
        asked.clear()
    curve.wall_s = wallclock.perf_counter() - started
    return curve


class _HostBook:
    """Free host CPU and memory (and card millis) per node, to place CPU-only tasks by the strategy's rule."""

    def __init__(self, nodes: Sequence[Node], strategy: str, rng: random.Random, tasks: Sequence[SimJob]) -> None:
        self.nodes = [n for n in nodes if n.devices]
        self.strategy = strategy
        self.rng = rng
        self.cpu = {n.name: n.cpu_millicores for n in self.nodes}
        self.mem = {n.name: n.host_memory_mib for n in self.nodes}
        self.free_cpu = {n.name: n.cpu_millicores for n in self.nodes}
        self.free_mem = {n.name: n.host_memory_mib for n in self.nodes}
        self.card = {d.uuid: (n.name, i) for n in self.nodes for i, d in enumerate(n.devices)}
        self.card_free = {n.name: [MILLIS_PER_DEVICE] * len(n.devices) for n in self.nodes}
        self.shapes = _trace_shapes(tasks)

    def take(self, node: str, cpu: int, mem: int, device_uuid: str | None = None, millis: int = 0) -> None:
        if self.free_cpu.get(node) is not None:
            self.free_cpu[node] -= cpu
        if self.free_mem.get(node) is not None:
            self.free_mem[node] -= mem
        if device_uuid is not None and millis:
            name, i = self.card[device_uuid]
            self.card_free[name][i] -= millis

    def _frag(self, frees: list[int], cpu: int) -> float:
        full = sum(1 for f in frees if f >= MILLIS_PER_DEVICE)
        return expected_unusable_millis(self.shapes, frees, sum(frees), full, cpu)

    def _key(self, n: Node, cpu: int, mem: int) -> tuple:
        fc, fm = self.free_cpu[n.name], self.free_mem[n.name]
        share = fc / max(1, self.cpu[n.name]) + fm / max(1, self.mem[n.name])
        if self.strategy == "best_fit":
            return (share,)
        if self.strategy == "worst_fit":
            return (-share,)
        frees = self.card_free[n.name]
        return (self._frag(frees, fc - cpu) - self._frag(frees, fc), share)

    def place(self, job_id: str, cpu: int, mem: int) -> Allocation | None:
        fitting = [
            n
            for n in self.nodes
            if self.free_cpu[n.name] is not None
            and self.free_mem[n.name] is not None
            and self.free_cpu[n.name] >= cpu
            and self.free_mem[n.name] >= mem
        ]
        if not fitting:
            return None
        if self.strategy == "random":
            node = fitting[self.rng.randrange(len(fitting))]
        else:
            node = min(fitting, key=lambda n: self._key(n, cpu, mem))
        self.take(node.name, cpu, mem)
        dev = node.devices[0]
        return Allocation(
            job_id=job_id,
            replica=0,
            device_uuid=dev.uuid,
            node=node.name,
            tenant="pool",
            flavor=dev.flavor,
            millis=0,
            memory_mib=0,
            priority=0,
            preemptible=False,
            cpu_millicores=cpu,
            host_memory_mib=mem,
        )


def compare(
    nodes: Sequence[Node],
    tasks: Sequence[SimJob],
    strategies: Sequence[str] = tuple(s.value for s in FractionalStrategy),
    **kwargs,
) -> list[FragmentationCurve]:
    return [fill_cluster(nodes, tasks, s, **kwargs) for s in strategies]


def gpu_tasks(jobs: Sequence[SimJob]) -> list[SimJob]:
    """The tasks worth sampling: those asking for a GPU (fractional or whole)."""
    return [replace(j) for j in jobs if j.millis > 0]


def all_tasks(jobs: Sequence[SimJob]) -> list[SimJob]:
    """Every task, CPU-only ones (``millis == 0``) included."""
    return list(jobs)


# -- the FGD artifact's node scorers, reimplemented as baselines ---------------------------------------------

# The artifact's normalisation constants (pkg/type/open-gpu-share/utils: MaxSpecCpu, MaxSpecGpu).
_ARTIFACT_MAX_CPU = 128_000
_ARTIFACT_MAX_GPU = 8_000
ARTIFACT_RULES = ("artifact_random", "artifact_best_fit", "artifact_fgd")
# gpupool's measure (``scheduler/core/fragment.py``) in the same harness: every node scored, fractions as asked;
# ``_flavor_order`` as the engine tries a job's flavors, one after the other (the first that fits wins).
MEASURE_RULES = ("gpupool_measure", "gpupool_measure_flavor_order")


def _artifact_typical(tasks: Sequence[SimJob], share: float = 0.95) -> list[tuple[tuple[int, int, int], float]]:
    """FGD's typical pods: the most common (millis per card, whole cards, CPU) shapes of the pod list, CPU-only
    ones included, until they cover ``share`` of the pods; weights renormalised over them."""
    count = _shape_counts(tasks, trace=True, cpu_only=True)
    ranked = sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(count.values())
    out, covered = [], 0
    for key, c in ranked:
        if covered >= share * total:
            break
        out.append((key, c))
        covered += c
    return [(k, c / covered) for k, c in out]


def _artifact_frag(typical, cards: tuple[int, ...], cpu: int) -> float:
    """FGD's node fragmentation (``NodeGpuShareFragAmountScore``): per typical pod, all free GPU when it cannot
    run on the node (CPU, or too few cards), else the free millis of the cards smaller than its fraction."""
    total = sum(cards)
    out = 0.0
    for (millis, whole, s_cpu), p in typical:
        if millis == 0 or cpu < s_cpu:
            out += p * total  # a CPU-only pod uses no GPU; a pod that cannot run strands all of it
        elif whole:
            if sum(1 for f in cards if f == MILLIS_PER_DEVICE) < whole:
                out += p * total
            else:
                out += p * sum(f for f in cards if f < MILLIS_PER_DEVICE)
        else:
            if not any(f >= millis for f in cards):
                out += p * total
            else:
                out += p * sum(f for f in cards if f < millis)
    return out


def fill_cluster_node_rule(
    nodes: Sequence[Node],
    tasks: Sequence[SimJob],
    rule: str,
    *,
    max_load: float = 1.3,
    seed: int = 0,
) -> FragmentationCurve:
    """The same experiment as ``fill_cluster`` (the same task sequence for the same seed), but every task — GPU
    and CPU-only — is placed by one of the FGD artifact's Kubernetes score plugins, reimplemented here without
    the engine, so that the harness itself can be compared with the artifact's published baselines:

    - ``artifact_random``: a random node among those that fit, then a random card that fits;
    - ``artifact_best_fit``: the node with the highest ``int(100 x (1 - score))`` where ``score`` is
      0.5 x (free CPU - asked) / 128 cores + 0.5 x (free GPU millis - asked) / 8,000 (the artifact's
      ``BestFitScore``), ties broken at random as the Kubernetes scheduler does; within the node the card that
      fits with the least free millis (``gpuSelMethod: best``);
    - ``artifact_fgd``: our reading of the artifact's ``FGDScore``: ``int(100 x sigmoid((before - after) /
      1000))`` of the node's fragmentation over the typical pods (the shapes covering 95 % of the pod list,
      CPU-only ones included), the card of the node that leaves the least, ties at random.

    Fractions are placed as the trace asks (no rounding to the engine's steps), so both curves are "asked"."""
    if rule not in ARTIFACT_RULES + MEASURE_RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {', '.join(ARTIFACT_RULES + MEASURE_RULES)}")
    started = wallclock.perf_counter()
    gpu_nodes = [n for n in nodes if n.devices]
    capacity = sum(len(n.devices) for n in gpu_nodes) * MILLIS_PER_DEVICE
    curve = FragmentationCurve(strategy=rule, capacity_gpus=capacity // MILLIS_PER_DEVICE)
    rng = random.Random(seed)  # the task sequence: as in fill_cluster
    pick_rng = random.Random(seed + 2)
    free_cpu = [n.cpu_millicores for n in gpu_nodes]
    free_mem = [n.host_memory_mib for n in gpu_nodes]
    cards = [[MILLIS_PER_DEVICE] * len(n.devices) for n in gpu_nodes]
    node_flavor = [n.devices[0].flavor for n in gpu_nodes]
    measure = rule in MEASURE_RULES
    scored_by_frag = measure or rule == "artifact_fgd"
    typical = _artifact_typical(tasks) if rule == "artifact_fgd" else []
    shapes = _trace_shapes(tasks, trace=True) if measure else []
    flavor_order = flavors_by_capacity(gpu_nodes) if rule == "gpupool_measure_flavor_order" else ()
    frag_cache: dict[tuple[tuple[int, ...], int], float] = {}

    def frag(card_state: tuple[int, ...], cpu_left: int) -> float:
        key = (card_state, cpu_left)
        value = frag_cache.get(key)
        if value is None:
            if measure:
                full = sum(1 for f in card_state if f >= MILLIS_PER_DEVICE)
                value = expected_unusable_millis(shapes, list(card_state), sum(card_state), full, cpu_left)
            else:
                value = _artifact_frag(typical, card_state, cpu_left)
            frag_cache[key] = value
        return value

    arrived = allocated = 0
    while arrived < max_load * capacity:
        task = tasks[rng.randrange(len(tasks))]
        curve.tasks += 1
        cpu, mem = task.cpu_millicores, task.host_memory_mib
        whole = task.millis // MILLIS_PER_DEVICE if task.millis >= MILLIS_PER_DEVICE else 0
        fraction = 0 if whole or task.millis <= 0 else (task.trace_millis or task.millis)
        asked = whole * MILLIS_PER_DEVICE + fraction
        feasible = [
            i
            for i in range(len(gpu_nodes))
            if free_cpu[i] >= cpu
            and free_mem[i] >= mem
            and not (whole and sum(1 for f in cards[i] if f == MILLIS_PER_DEVICE) < whole)
            and not (fraction and not any(f >= fraction for f in cards[i]))
        ]
        if flavor_order and asked:  # the first flavor, in the engine's order, with a node that fits
            present = {node_flavor[i] for i in feasible}
            first = next((fl for fl in flavor_order if fl in present), None)
            feasible = [i for i in feasible if node_flavor[i] == first]
        best: list[int] = []
        best_score: object = None
        card_of: dict[int, int] = {}  # the card a fraction takes on each node scored by fragmentation
        for i in feasible:
            if rule == "artifact_random":
                best.append(i)
                continue
            # the artifact's best fit: 0.5 x CPU + 0.5 x GPU left free, of its normalisation constants
            left_free = (
                0.5 * (free_cpu[i] - cpu) / _ARTIFACT_MAX_CPU + 0.5 * (sum(cards[i]) - asked) / _ARTIFACT_MAX_GPU
            )
            if scored_by_frag:
                state = tuple(cards[i])
                before = frag(state, free_cpu[i])
                if fraction:
                    after, card_of[i] = min(
                        (frag((*state[:d], f - fraction, *state[d + 1 :]), free_cpu[i] - cpu), d)
                        for d, f in enumerate(state)
                        if f >= fraction
                    )
                else:
                    after = frag(tuple(take_whole(list(state), whole)), free_cpu[i] - cpu)
                # the engine's order: the least rise, then (here) best fit; FGD: sigmoid((before - after) / 1000)
                score: object = (
                    (-round(after - before, 6), -left_free)
                    if measure
                    else int(100 / (1 + math.exp(-(before - after) / 1000)))
                )
            else:
                score = int(100 * (1.0 - left_free))
            if best_score is None or score > best_score:
                best, best_score = [i], score
            elif score == best_score:
                best.append(i)
        if best:
            i = best[pick_rng.randrange(len(best))]
            if whole:
                cards[i] = take_whole(cards[i], whole)
            elif fraction:
                fits = [d for d, f in enumerate(cards[i]) if f >= fraction]
                if rule == "artifact_random":
                    d = fits[pick_rng.randrange(len(fits))]
                elif scored_by_frag:
                    d = card_of[i]
                else:
                    d = min(fits, key=lambda d: (cards[i][d], d))
                cards[i][d] -= fraction
            free_cpu[i] -= cpu
            free_mem[i] -= mem
            allocated += asked
            if asked:
                curve.placed += 1
        if asked:
            arrived += asked
            curve.arrived.append(arrived / capacity)
            curve.arrived_trace.append(arrived / capacity)
            curve.unallocated.append(1.0 - allocated / capacity)
            curve.unallocated_trace.append(1.0 - allocated / capacity)
    curve.wall_s = wallclock.perf_counter() - started
    return curve


def _trace_shapes(tasks: Sequence[SimJob], *, trace: bool = False) -> list[tuple[tuple[int, int, int], float]]:
    """The most common (millis per card, whole cards, CPU) shapes of the GPU tasks, as the core weighs them
    (``most_common_shapes``); ``trace``: fractions as the trace asked them, not rounded."""
    return most_common_shapes(_shape_counts(tasks, trace=trace, cpu_only=False))


def _shape_counts(tasks: Sequence[SimJob], *, trace: bool, cpu_only: bool) -> Counter[tuple[int, int, int]]:
    """How many tasks have each (millis per card, whole cards, CPU) shape; CPU-only tasks (millis 0) only with
    ``cpu_only``."""
    count: Counter[tuple[int, int, int]] = Counter()
    for t in tasks:
        if t.millis <= 0:
            if cpu_only:
                count[(0, 0, t.cpu_millicores)] += 1
            continue
        whole = 0 if t.millis < MILLIS_PER_DEVICE else t.millis // MILLIS_PER_DEVICE
        millis = MILLIS_PER_DEVICE if whole else ((t.trace_millis or t.millis) if trace else t.millis)
        count[(millis, whole, t.cpu_millicores)] += 1
    return count
