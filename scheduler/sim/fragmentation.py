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

import random
import time as wallclock
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scheduler.core import plan
from scheduler.core.fragment import MAX_SHAPES, expected_unusable_millis
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
        shapes: dict[tuple[int, int, int], int] = {}
        for t in tasks:
            if t.millis > 0:
                whole = 0 if t.millis < MILLIS_PER_DEVICE else t.millis // MILLIS_PER_DEVICE
                key = (min(t.millis, MILLIS_PER_DEVICE), whole, t.cpu_millicores)
                shapes[key] = shapes.get(key, 0) + 1
        top = sorted(shapes.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_SHAPES]
        total = sum(c for _, c in top) or 1
        self.shapes = [(k, c / total) for k, c in top]

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
