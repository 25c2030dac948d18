"""Benchmark: the cost of start-time estimates (``scheduler.core.eta``) for a big queue.

Builds the synthetic pool of ``benchmarks/scheduler_cycle.py`` (``--nodes`` x 8 cards, about 60 % busy with
mixed work, ``--jobs`` pending jobs, 24 teams with quotas), gives every running job a time left and every
pending job a runtime (seeded, log-uniform between 10 minutes and 8 hours; p10/p90 at half and twice the
median), then times what the Celery task does: the median forecast alone and the full band (three forecasts),
each the median of ``--runs`` runs (wall and CPU time of this process). With ``--db`` it also writes the
estimates of that many pending jobs to a database in one UPDATE (``scheduler.eta.estimates_write``; a fresh
SQLite file unless ``--database-url``) and prints the time. Figures, not assertions.

    .venv/bin/python benchmarks/eta.py                        # 1,000 nodes, 10,000 pending jobs
    .venv/bin/python benchmarks/eta.py --nodes 100 --jobs 1000 --runs 5
    .venv/bin/python benchmarks/eta.py --db --database-url postgres://postgres@127.0.0.1:5432/gpupool_bench
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler_cycle import build_snapshot  # benchmarks/ is on sys.path

from scheduler.core.eta import Limits, Runtimes, band_limits, bands_from, forecast
from scheduler.core.types import Policy, Snapshot


def runtimes(snapshot: Snapshot, seed: int = 7) -> tuple[Runtimes, Runtimes, Runtimes]:
    rng = random.Random(seed)
    median_left = {a.job_id: math.exp(rng.uniform(math.log(60), math.log(12 * 3600))) for a in snapshot.allocations}
    median_run = {j.job_id: math.exp(rng.uniform(math.log(600), math.log(8 * 3600))) for j in snapshot.pending}
    short, median, long = (
        Runtimes(
            remaining_s={k: v * factor for k, v in median_left.items()},
            runtime_s={k: v * factor for k, v in median_run.items()},
        )
        for factor in (0.5, 1.0, 2.0)
    )
    return short, median, long


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (the median is printed)")
    parser.add_argument("--max-cycles", type=int, default=Limits().max_cycles)
    parser.add_argument("--relative-step", type=float, default=Limits().relative_step)
    parser.add_argument("--db", action="store_true", help="also time writing the estimates to a database")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL"))
    args = parser.parse_args()

    snapshot = build_snapshot(args.nodes, args.jobs)
    short, median, long = runtimes(snapshot)
    policy = Policy()
    limits = Limits(max_cycles=args.max_cycles, relative_step=args.relative_step)
    running = len({a.job_id for a in snapshot.allocations})
    print(f"start-time estimate benchmark (python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f})")
    print(
        f"{args.nodes} nodes x 8 cards, {running} running jobs ({len(snapshot.allocations)} allocations), "
        f"{len(snapshot.pending)} pending; {limits}"
    )

    walls, cpus, result = [], [], None
    for _ in range(args.runs):
        wall, cpu, result = timed(lambda: forecast(snapshot, policy, median, limits))
        walls.append(wall)
        cpus.append(cpu)
    assert result is not None
    started = [j.job_id for j in snapshot.pending if j.job_id in result.starts]
    print(
        f"median forecast: {statistics.median(walls):6.2f} s wall, {statistics.median(cpus):6.2f} s cpu "
        f"(median of {args.runs}) | {result.cycles} engine cycles, stopped: {result.stopped}, looked "
        f"{(result.reached_at - snapshot.now) / 3600:.1f} h ahead | {len(started)} of {len(snapshot.pending)} "
        f"pending jobs have a start, {len(result.never)} never start"
    )

    def band():
        coarse = band_limits(limits)
        starts = [
            forecast(snapshot, policy, r, lim).starts for r, lim in ((short, coarse), (median, limits), (long, coarse))
        ]
        return bands_from(snapshot, *starts)

    walls, cpus, bands = [], [], None
    for _ in range(args.runs):
        wall, cpu, bands = timed(band)
        walls.append(wall)
        cpus.append(cpu)
    assert bands is not None
    print(
        f"band (3 forecasts): {statistics.median(walls):6.2f} s wall, {statistics.median(cpus):6.2f} s cpu "
        f"(median of {args.runs}) | {sum(1 for b in bands.values() if b.p50_at is not None)} with a median start, "
        f"{sum(1 for b in bands.values() if b.p90_at is not None)} with a p90"
    )
    if args.db:
        write_to_database(bands, args.database_url, args.runs)
    print("reproduce: .venv/bin/python benchmarks/eta.py " + " ".join(sys.argv[1:]))


def write_to_database(bands: dict, database_url: str | None, runs: int) -> None:
    """Time ``estimates_write`` for as many queued jobs as there are bands (rows made first, not timed)."""
    from _django import setup_django

    with tempfile.TemporaryDirectory() as data_dir:
        setup_django(database_url, data_dir)
        from django.db import transaction
        from django.utils import timezone

        from scheduler.eta import estimates_write
        from scheduler.models import Job, JobState
        from tenants.models import Tenant

        tenant, _ = Tenant.objects.get_or_create(slug="eta-bench", defaults={"name": "eta bench"})
        jobs = Job.objects.bulk_create(
            Job(tenant=tenant, name=f"eta-{i}", flavors=["x"], millis_per_replica=1000, state=JobState.QUEUED)
            for i in range(len(bands))
        )
        rows = dict(zip((str(j.pk) for j in jobs), bands.values(), strict=True))
        walls = []
        for _ in range(runs):
            with transaction.atomic():
                began = time.perf_counter()
                written = estimates_write(rows, now=timezone.now())
                walls.append(time.perf_counter() - began)
        Job.objects.filter(tenant=tenant).delete()
        print(f"database write ({database_url or 'sqlite'}): {written} rows in {statistics.median(walls):.3f} s")


if __name__ == "__main__":
    main()
