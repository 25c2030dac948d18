"""Benchmark: the incremental snapshot (``scheduler.live_snapshot``) against a full read, on PostgreSQL.

Prints figures, not assertions. A pool of ``--nodes`` x 8 cards with ``--jobs`` jobs (filled by one kept cycle
of ``scheduler_db_cycle.py``'s pool unless the database has it already: a busy pool with the rest pending),
then, each the median of ``--repeat`` runs:

- ``full read``: ``snapshot.build_snapshot`` (what every cycle did before);
- ``live: first build``: the live snapshot's own full read (once per worker, and at each check);
- ``live: nothing changed``: a build with no row changed since the last;
- ``live: N finishes`` / ``N submits`` / ``N node events``: N jobs finish (allocations end), N jobs are
  submitted, N nodes change state, committed, then one build; and what one changed row costs;
- ``cycle``: whole cycles (``run_cycle``: snapshot, plan, persist, commit) on the pool as it is then, first with
  the snapshot read in full (``GPUPOOL_SNAPSHOT_INCREMENTAL=0``), then with the live snapshot.

After each build it compares the live snapshot with a full read and prints whether they are the same. The
benchmark changes the database it is given: use one of its own.

    .venv/bin/python benchmarks/snapshot_incremental.py --nodes 1000 --jobs 10000 \\
        --database-url postgres://postgres@127.0.0.1:5432/gpupool_bench_live
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from _django import ROOT, setup_django  # benchmarks/ is on sys.path when a script runs


def _fill(nodes: int, jobs: int) -> None:
    from django.db import transaction
    from scheduler_db_cycle import populate

    from catalog.models import ResourceFlavor
    from scheduler import persist, snapshot
    from scheduler.scheduling_policy import policy_from_settings

    if ResourceFlavor.objects.filter(name="bench-80g").exists():
        return
    started = time.perf_counter()
    populate(nodes, jobs)
    with transaction.atomic():
        stored: dict[int, tuple] = {}
        snap = snapshot.build_snapshot(stored_explanations=stored)
        plan = snapshot.plan_for(snap, policy_from_settings().__class__(require_quota=False))
        persist.persist_plan(plan, stored_explanations=stored)
    print(f"filled the pool in {time.perf_counter() - started:.1f} s (one kept cycle)")


def _timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def _build(live) -> tuple[float, object]:
    from django.db import transaction

    with transaction.atomic():
        started = time.perf_counter()
        built = live.build(stored_explanations={})
        elapsed = time.perf_counter() - started
    return elapsed, built


def _same(live, built) -> str:
    from scheduler import snapshot

    full = snapshot.build_snapshot(now=None)
    # ``now`` differs between the two reads: compare what was read, not the clock (nor the usage made with it).
    fields = ("nodes", "allocations", "tenants", "quotas", "pending", "reservations", "holds")
    return "yes" if all(getattr(full, f) == getattr(built, f) for f in fields) else "NO"


def _finishes(count: int) -> int:
    from django.db import transaction
    from django.utils import timezone

    from scheduler.models import Allocation, Job, JobState

    with transaction.atomic():
        jobs = list(Allocation.objects.active().order_by("job_id").values_list("job_id", flat=True).distinct()[:count])
        Allocation.objects.filter(job_id__in=jobs, ended_at__isnull=True).update(ended_at=timezone.now())
        Job.objects.filter(pk__in=jobs).update(state=JobState.SUCCEEDED)
    return len(jobs)


def _submits(count: int) -> int:
    from scheduler.models import Job, JobState
    from tenants.models import Tenant

    tenant = Tenant.objects.get(slug="bench-team-0")
    Job.objects.bulk_create(
        Job(
            tenant=tenant,
            name=f"live-bench-{i}",
            flavors=["bench-80g"],
            millis_per_replica=1000,
            command=["true"],
            state=JobState.QUEUED,
        )
        for i in range(count)
    )
    return count


def _node_events(count: int) -> int:
    from django.db.models import Case, Value, When

    from scheduler.fleet.models import Node, NodeStatus

    nodes = list(Node.objects.order_by("name").values_list("pk", flat=True)[:count])
    Node.objects.filter(pk__in=nodes).update(
        status=Case(When(status=NodeStatus.READY, then=Value(NodeStatus.NOT_READY)), default=Value(NodeStatus.READY))
    )
    return len(nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--changes", default="10,100,1000", help="how many rows each change step changes")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    args = parser.parse_args()
    if not args.database_url.startswith("postgres"):
        sys.exit("the incremental snapshot needs PostgreSQL: pass --database-url postgres://...")
    setup_django(args.database_url, tempfile.mkdtemp(prefix="gpupool-live-bench-"))
    from scheduler import live_snapshot, snapshot

    print(
        f"{args.nodes} nodes x 8 cards, {args.jobs} jobs, median of {args.repeat}, "
        f"CPU count: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}"
    )
    print("command: " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]))
    _fill(args.nodes, args.jobs)
    snap = snapshot.build_snapshot()
    print(f"pool: {len(snap.nodes)} nodes, {len(snap.allocations)} allocations, {len(snap.pending)} pending jobs")

    full_s = statistics.median(_timed(snapshot.build_snapshot) for _ in range(args.repeat))
    print(f"{'full read':>24}: {full_s * 1000:8.1f} ms")
    loads = []
    for _ in range(args.repeat):
        live = live_snapshot.LiveSnapshot()
        elapsed, built = _build(live)
        loads.append(elapsed)
    first_s = statistics.median(loads)
    print(f"{'live: first build':>24}: {first_s * 1000:8.1f} ms | same as a full read: {_same(live, built)}")
    idle = []
    for _ in range(args.repeat):
        elapsed, built = _build(live)
        idle.append(elapsed)
    print(
        f"{'live: nothing changed':>24}: {statistics.median(idle) * 1000:8.1f} ms | "
        f"same as a full read: {_same(live, built)} | {full_s / statistics.median(idle):.0f}x less than a full read"
    )
    for count in (int(c) for c in args.changes.split(",")):
        for label, change in (("finishes", _finishes), ("submits", _submits), ("node events", _node_events)):
            times, rows = [], []
            for _ in range(args.repeat):
                made = change(count)
                elapsed, built = _build(live)
                times.append(elapsed)
                rows.append(live.last.changed_rows)
            median = statistics.median(times)
            per_row = (median - statistics.median(idle)) / max(1, statistics.median(rows)) * 1e6
            print(
                f"{'live: ' + str(made) + ' ' + label:>24}: {median * 1000:8.1f} ms | "
                f"{statistics.median(rows):6.0f} rows changed, {per_row:6.1f} µs each beyond an idle build | "
                f"same as a full read: {_same(live, built)}"
            )
    _cycles(args.repeat)


def _cycles(repeat: int) -> None:
    from django.conf import settings

    from scheduler.services import cycle

    # As scheduler_db_cycle.py plans: the bench tenants have no quota rows.
    settings.GPUPOOL_SCHEDULER_POLICY = {**getattr(settings, "GPUPOOL_SCHEDULER_POLICY", {}), "require_quota": False}
    for label, incremental in (("full read", False), ("live snapshot", True)):
        settings.GPUPOOL_SNAPSHOT_INCREMENTAL = incremental
        cycle.run_cycle()  # the live snapshot's first build (a full read) is not measured
        runs = []
        for _ in range(repeat):
            started = time.perf_counter()
            stats = cycle.run_cycle().stats
            runs.append((time.perf_counter() - started, stats))
        total = statistics.median(run[0] for run in runs)
        steps = {key: statistics.median(run[1][key] for run in runs) for key in ("snapshot_s", "plan_s", "persist_s")}
        print(
            f"{'cycle, ' + label:>24}: {total * 1000:8.1f} ms | snapshot {steps['snapshot_s'] * 1000:7.1f} ms | "
            f"plan {steps['plan_s'] * 1000:7.1f} ms | persist {steps['persist_s'] * 1000:7.1f} ms | "
            f"read: {runs[-1][1]['snapshot_read']}"
        )


if __name__ == "__main__":
    main()
