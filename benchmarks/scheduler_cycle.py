"""Benchmark: one scheduling cycle (``scheduler.core.plan``) on synthetic clusters.

Prints, per size, the median cycle time over several runs (wall clock and CPU time of this process; on a
shared machine the CPU time is the fairer figure), decisions per second (places + preemptions +
explanations, per CPU second) and the peak memory of one cycle (tracemalloc). Figures, not assertions.

    python benchmarks/scheduler_cycle.py            # 100, 1,000, 5,000 nodes x 8 cards; 1,000 and 10,000 jobs
    python benchmarks/scheduler_cycle.py --quick    # a small run (seconds)
    python benchmarks/scheduler_cycle.py --nodes 1000 --jobs 10000 --runs 5 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import pstats
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.core import plan
from scheduler.core.types import (
    Allocation,
    Device,
    JobKind,
    Node,
    PendingJob,
    Policy,
    Quota,
    ReplicaRequest,
    Snapshot,
    Tenant,
    Topology,
)

NOW = 1_000_000.0
FLAVORS = {"nvidia-h100-80g": 81920, "nvidia-a100-40g": 40960}
PRIORITIES = (0, 200, 500, 500, 500, 800, 1000)


def build_snapshot(n_nodes: int, n_jobs: int, *, seed: int = 1, busy: float = 0.6) -> Snapshot:
    """A cluster about ``busy`` full of mixed work, 24 teams in 6 departments, ``n_jobs`` pending jobs."""
    rng = random.Random(seed)
    nodes = []
    for n in range(n_nodes):
        name = f"node{n:05d}"
        flavor = "nvidia-h100-80g" if n % 10 < 7 else "nvidia-a100-40g"
        devices = tuple(
            Device(
                uuid=f"{name}-gpu{i}",
                node=name,
                index=i,
                flavor=flavor,
                memory_mib=FLAVORS[flavor],
                healthy=rng.random() > 0.002,
                nvlink_domain=f"{name}-nv{i // 4}",
                pcie_switch=f"{name}-sw{i // 2}",
                numa_node=i // 4,
            )
            for i in range(8)
        )
        nodes.append(Node(name, devices, schedulable=rng.random() > 0.01, labels={"zone": f"z{n % 4}"}))

    departments = [f"dept{d}" for d in range(6)]
    teams = [f"team{t:02d}" for t in range(24)]
    tenants = [Tenant(d) for d in departments] + [Tenant(t, departments[i % 6]) for i, t in enumerate(teams)]
    quotas = []
    for flavor in FLAVORS:
        share = 0.7 if flavor == "nvidia-h100-80g" else 0.3
        total = int(n_nodes * 8 * share * 1000)
        per_dept = total // 6 // 1000 * 1000
        per_team = per_dept // 4 // 1000 * 1000
        for d in departments:
            quotas.append(Quota(d, flavor, per_dept, int(per_dept * 1.5)))
        for t in teams:
            quotas.append(Quota(t, flavor, per_team, per_team * 2, lending_limit_millis=per_team // 2))

    allocations = []
    serial = 0
    for node in nodes:
        free = list(node.devices)
        rng.shuffle(free)
        target = int(len(free) * busy * rng.uniform(0.5, 1.5))
        used = 0
        while used < min(target, len(free)):
            serial += 1
            team = rng.choice(teams)
            kind = rng.random()
            common = dict(
                tenant=team,
                flavor=free[0].flavor,
                priority=rng.choice(PRIORITIES),
                preemptible=rng.random() < 0.7,
                started_at=NOW - rng.uniform(0, 86_400),
                last_checkpoint_at=NOW - rng.uniform(0, 3_600) if rng.random() < 0.5 else None,
                expected_end_at=NOW + rng.uniform(60, 86_400) if rng.random() < 0.6 else None,
            )
            if kind < 0.3:  # fractions sharing one card
                dev = free[used]
                left, mem = 1000, dev.memory_mib
                for _ in range(rng.randint(1, 4)):
                    millis = rng.randint(1, 4) * 100
                    memory = rng.randint(1, 6) * 2048
                    if millis > left or memory > mem:
                        break
                    left -= millis
                    mem -= memory
                    allocations.append(
                        Allocation(f"run{serial}", 0, dev.uuid, node.name, millis=millis, memory_mib=memory, **common)
                    )
                    serial += 1
                used += 1
            else:
                size = min(rng.choice((1, 1, 2, 4, 8)), len(free) - used)
                for dev in free[used : used + size]:
                    allocations.append(
                        Allocation(
                            f"run{serial}", 0, dev.uuid, node.name, millis=1000, memory_mib=dev.memory_mib, **common
                        )
                    )
                used += size

    pending = []
    for j in range(n_jobs):
        r = rng.random()
        flavors = ("nvidia-h100-80g",) if rng.random() < 0.6 else ("nvidia-a100-40g", "nvidia-h100-80g")
        replicas = 1
        topology = Topology.NONE
        if r < 0.3:
            request = ReplicaRequest(flavors, rng.randint(1, 9) * 100, rng.randint(1, 8) * 2048)
        elif r < 0.6:
            request = ReplicaRequest.cards(1, flavors)
        elif r < 0.75:
            request = ReplicaRequest.cards(2, flavors)
        elif r < 0.85:
            request = ReplicaRequest.cards(4, flavors)
            topology = Topology.NVLINK if rng.random() < 0.5 else Topology.NONE
        elif r < 0.95:
            request = ReplicaRequest.cards(8, flavors)
        else:  # gangs
            request = ReplicaRequest.cards(rng.choice((4, 8)), flavors)
            replicas = rng.randint(2, 4)
        pending.append(
            PendingJob(
                job_id=f"job{j:06d}",
                tenant=rng.choice(teams),
                request=request,
                priority=rng.choice(PRIORITIES),
                preemptible=rng.random() < 0.7,
                submitted_at=NOW - rng.uniform(0, 7_200),
                kind=JobKind.TRAINING if rng.random() < 0.7 else JobKind.BATCH,
                replicas=replicas,
                topology=topology,
                node_selector={"zone": "z1"} if rng.random() < 0.05 else {},
            )
        )
    usage = {t: {"nvidia-h100-80g": rng.uniform(0, 20_000)} for t in teams}
    return Snapshot(
        now=NOW,
        nodes=tuple(nodes),
        allocations=tuple(allocations),
        tenants=tuple(tenants),
        quotas=tuple(quotas),
        usage=usage,
        pending=tuple(pending),
    )


def plan_digest(result) -> str:
    """A short hash of everything a plan decides (places, preemptions, each pending job's reason and message, holds),
    so two engines can be compared on the same seeded snapshot: the same digest is the same plan."""
    decided = (result.places, result.preemptions, result.explanations, result.holds)
    return hashlib.sha256(repr(decided).encode()).hexdigest()[:12]


def measure(n_nodes: int, n_jobs: int, runs: int, *, profile: bool = False) -> None:
    snapshot = build_snapshot(n_nodes, n_jobs)
    policy = Policy()
    times = []
    cpu_times = []
    result = None
    for _ in range(runs):
        gc.collect()
        started = time.perf_counter()
        cpu_started = time.process_time()
        result = plan(snapshot, policy)
        cpu_times.append(time.process_time() - cpu_started)
        times.append(time.perf_counter() - started)
    assert result is not None
    gc.collect()
    tracemalloc.start()
    plan(snapshot, policy)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    median = statistics.median(times)
    cpu = statistics.median(cpu_times)
    decisions = len(result.places) + len(result.preemptions) + len(result.explanations)
    print(
        f"{n_nodes:>6} nodes x 8 | {n_jobs:>6} pending | {len(snapshot.allocations):>6} running allocs | "
        f"cycle {median * 1000:7.1f} ms wall, {cpu * 1000:7.1f} ms cpu (median of {runs}) | "
        f"{decisions / cpu:>9.0f} decisions/s (cpu) | peak {peak / 2**20:6.1f} MiB | "
        f"placed {len(result.places)}, preempt {len(result.preemptions)}, pending {len(result.explanations)} | "
        f"plan {plan_digest(result)}",
        flush=True,
    )
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        plan(snapshot, policy)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small run: 100 nodes, 1,000 jobs")
    parser.add_argument("--nodes", type=int, help="only this many nodes")
    parser.add_argument("--jobs", type=int, help="only this many pending jobs")
    parser.add_argument("--runs", type=int, default=None, help="cycles per size (median is printed)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one cycle per size")
    args = parser.parse_args()
    if args.nodes or args.jobs:
        sizes = [(args.nodes or 1000, args.jobs or 10_000)]
    elif args.quick:
        sizes = [(100, 1_000)]
    else:
        sizes = [(n, j) for n in (100, 1_000, 5_000) for j in (1_000, 10_000)]
    print(f"scheduler cycle benchmark (python {sys.version.split()[0]}, one core)")
    for n_nodes, n_jobs in sizes:
        runs = args.runs or (5 if n_nodes * n_jobs <= 10_000_000 else 3)
        measure(n_nodes, n_jobs, runs, profile=args.profile)


if __name__ == "__main__":
    main()
