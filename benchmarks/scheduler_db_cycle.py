"""Benchmark: one scheduling cycle on the database — snapshot from rows, ``scheduler.core.plan``, persist.

Prints figures, not assertions: the time of each step of ``scheduler.services.run_cycle`` for a pool of
``--nodes`` x 8 cards with ``--jobs`` pending jobs (a mix of whole cards and fractions), then for a second
cycle on the now busy pool (everything placed is an allocation in the snapshot, the rest is explained).

The database is a fresh SQLite file in a temporary directory unless ``--database-url`` (or
GPUPOOL_DATABASE_URL) names another (use an empty PostgreSQL database: the benchmark migrates it).

    .venv/bin/python benchmarks/scheduler_db_cycle.py                  # 200 nodes x 8 cards, 3,000 jobs
    .venv/bin/python benchmarks/scheduler_db_cycle.py --nodes 1000 --jobs 10000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from _django import setup_django  # benchmarks/ is on sys.path when a script runs


def _populate(nodes: int, jobs: int) -> None:
    from scheduler.models import Device, Job, JobState, Node, NodeStatus, ResourceFlavor, Vendor
    from tenants.models import Tenant

    flavor = ResourceFlavor.objects.create(name="bench-80g", vendor=Vendor.SIMULATED, model="B80", memory_mib=81920)
    root = Tenant.objects.create(name="bench", slug="bench")
    tenants = [Tenant.objects.create(name=f"team {i}", slug=f"bench-team-{i}", parent=root, depth=2) for i in range(20)]
    node_rows = Node.objects.bulk_create(
        Node(name=f"bench-node-{n:04d}", status=NodeStatus.READY, cpu_cores=64) for n in range(nodes)
    )
    Device.objects.bulk_create(
        Device(
            node=node,
            index=i,
            uuid=f"GPU-bench-{node.pk}-{i}",
            vendor=Vendor.SIMULATED,
            model="B80",
            flavor=flavor,
            memory_mib=81920,
            nvlink_domain=f"{node.name}-nv{i // 4}",
        )
        for node in node_rows
        for i in range(8)
    )
    shapes = [(1000, 0), (2000, 0), (4000, 0), (8000, 0), (500, 40000), (300, 20000), (100, 8000)]
    Job.objects.bulk_create(
        Job(
            tenant=tenants[j % len(tenants)],
            name=f"bench-{j}",
            flavors=["bench-80g"],
            millis_per_replica=shapes[j % len(shapes)][0],
            memory_mib_per_replica=shapes[j % len(shapes)][1],
            replicas=2 if j % 11 == 0 else 1,
            priority_class=[500, 200, 800, 0][j % 4],
            command=["true"],
            state=JobState.QUEUED,
        )
        for j in range(jobs)
    )


def _cycle() -> dict[str, float]:
    from django.db import transaction

    from scheduler import persist, snapshot

    timings = {}
    with transaction.atomic():
        start = time.perf_counter()
        snap = snapshot.build_snapshot()
        timings["snapshot_s"] = time.perf_counter() - start
        start = time.perf_counter()
        plan = snapshot.plan_for(snap, snapshot.policy_from_settings().__class__(require_quota=False))
        timings["plan_s"] = time.perf_counter() - start
        start = time.perf_counter()
        outcome = persist.persist_plan(plan)
        timings["persist_s"] = time.perf_counter() - start
    timings["placed"] = len(outcome.placed)
    timings["explained"] = outcome.explained
    timings["allocations_in_snapshot"] = len(snap.allocations)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    args = parser.parse_args()

    setup_django(args.database_url or None, tempfile.mkdtemp(prefix="gpupool-sched-bench-"))
    from django.db import connection

    print(
        f"database: {connection.vendor}, {args.nodes} nodes x 8 cards, {args.jobs} pending jobs, "
        f"CPU count: {os.cpu_count()}"
    )
    _populate(args.nodes, args.jobs)
    for label in ("empty pool", "busy pool"):
        t = _cycle()
        total = t["snapshot_s"] + t["plan_s"] + t["persist_s"]
        print(
            f"{label:>10}: snapshot {t['snapshot_s'] * 1000:8.1f} ms | plan {t['plan_s'] * 1000:8.1f} ms | "
            f"persist {t['persist_s'] * 1000:8.1f} ms | total {total * 1000:8.1f} ms | placed {t['placed']:5d} | "
            f"explained {t['explained']:5d} | allocations seen {t['allocations_in_snapshot']}"
        )


if __name__ == "__main__":
    main()
