"""Fragmentation of fractional packing, measured as in the FGD paper (Weng et al., USENIX ATC 2023).

Tasks drawn from a trace's GPU tasks (with replacement, seeded) arrive one after another and never leave,
until the requested GPUs reach ``max_load`` x the cluster's GPUs. A task that does not fit when it arrives is
dropped. After each arrival we record the share of GPU capacity left unallocated; the interesting part is past
100 % load, where a perfect packer leaves nothing unallocated and a fragmenting one strands partial cards.

The engine does the placing: each batch of arrivals is one ``plan()`` call in FIFO order, without quotas,
preemption or capacity held for blocked heads — so a batch places exactly what one-by-one arrivals would
(placements only take capacity, and a shape that failed keeps failing) — and the strategies compared are the
engine's ``FractionalStrategy`` values.
"""

from __future__ import annotations

import random
import time as wallclock
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scheduler.core import plan
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
    # the same, counting only what the trace's tasks asked for (fractions before rounding up to 100 millis)
    unallocated_trace: list[float] = field(default_factory=list)
    tasks: int = 0
    placed: int = 0
    wall_s: float = 0.0

    def at(self, load: float, *, trace: bool = False) -> float:
        """Unallocated share when the arrived load first reaches ``load`` (linear between batches); with
        ``trace``, counting the trace's unrounded requests as allocated."""
        points = list(zip(self.arrived, self.unallocated_trace if trace else self.unallocated, strict=True))
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
    asked: dict[str, int] = {}
    n = 0
    while arrived < max_load * capacity:
        pending = []
        while len(pending) < batch and arrived < max_load * capacity:
            task = tasks[rng.randrange(len(tasks))] if sample else tasks[n % len(tasks)]
            n += 1
            arrived += task.charged_millis
            asked[f"t{n}"] = task.replicas * (task.trace_millis or task.millis)
            pending.append(
                PendingJob(
                    job_id=f"t{n}",
                    tenant="pool",
                    request=ReplicaRequest(flavors=task.flavors, millis=task.millis, memory_mib=task.memory_mib),
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
                    )
                )
                allocated += min(a.millis, MILLIS_PER_DEVICE)
        curve.tasks = n
        curve.arrived.append(arrived / capacity)
        curve.unallocated.append(1.0 - allocated / capacity)
        curve.unallocated_trace.append(1.0 - allocated_trace / capacity)
        asked.clear()
    curve.wall_s = wallclock.perf_counter() - started
    return curve


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
