"""Benchmark: what live logs cost the portal — storing agents' pieces and reading them back.

Prints figures, not assertions:
  1. pieces stored per second, one piece per transaction (``scheduler.logs.job_log_append``);
  2. pieces stored per second when the agent sockets of a process store theirs together (``job_logs_append``
     with ``--batch`` pieces of different jobs per call: what ``FleetProcess.store_log_piece`` does), and the
     statements per call;
  3. reads per second of a 256 KiB slice (``job_log_slice``: the API, the console, the follow socket).
Each is the median of ``--runs`` runs; every piece is a 100-byte line that follows on from the last (a job that
prints a line a second), so rows are merged as in production.

The database is a fresh SQLite file in a temporary directory unless ``--database-url`` (or GPUPOOL_DATABASE_URL)
names another (use an empty PostgreSQL database: the benchmark migrates it and adds its own jobs).

    .venv/bin/python benchmarks/job_logs.py
    .venv/bin/python benchmarks/job_logs.py --database-url postgres://postgres@127.0.0.1:5432/scratch --jobs 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

from _django import setup_django  # benchmarks/ is on sys.path when a script runs

LINE = "x" * 99 + "\n"


def _world(jobs: int):
    from django.conf import settings

    from catalog.models import ResourceFlavor, Vendor
    from scheduler.fleet.models import Device, Node, NodeStatus
    from scheduler.models import Job
    from scheduler.services import jobs as job_services
    from scheduler.services.cycle import run_cycle
    from scheduler.services.jobs import job_submit
    from tenants.models import MembershipRole, TenantKind
    from tenants.services.identity import user_create
    from tenants.services.memberships import membership_create
    from tenants.services.tenancy import tenant_create

    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    job_services.request_cycle = lambda: None  # the benchmark places its jobs itself
    tag = uuid.uuid4().hex[:6]
    flavor, _ = ResourceFlavor.objects.get_or_create(
        name=f"bench-logs-{tag}", defaults={"vendor": Vendor.SIMULATED, "model": f"Bench {tag}", "memory_mib": 81920}
    )
    for n in range(jobs // 8 + 1):
        node = Node.objects.create(name=f"bench-logs-{tag}-{n}", status=NodeStatus.READY, cpu_cores=64, memory_mib=1)
        for index in range(8):
            Device.objects.create(
                node=node,
                index=index,
                uuid=f"GPU-{tag}-{n}-{index}",
                vendor=Vendor.SIMULATED,
                model=flavor.model,
                flavor=flavor,
                memory_mib=81920,
            )
    tenant = tenant_create(actor=None, name=f"Bench {tag}", slug=f"bench-{tag}", kind=TenantKind.COMPANY)
    user = user_create(actor=None, username=f"bench-{tag}", password="bench-logs-password-1")
    membership_create(actor=None, user=user, tenant=tenant, role=MembershipRole.MEMBER)
    spec = {"name": "p", "tenant": tenant.slug, "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]}
    ids = [job_submit(actor=user, spec=spec).pk for _ in range(jobs)]
    placed = set(run_cycle().placed)
    assert placed >= set(ids), "not every job was placed"
    placed_jobs = list(Job.objects.filter(pk__in=ids).prefetch_related("allocations"))
    return [(job, job.allocations.all()[0].node_id) for job in placed_jobs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL"))
    parser.add_argument("--jobs", type=int, default=100, help="running jobs whose pieces are stored (default 100)")
    parser.add_argument("--batch", type=int, default=50, help="pieces per call in the batched figure (default 50)")
    parser.add_argument("--pieces", type=int, default=500, help="pieces per run (default 500)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    setup_django(args.database_url, tempfile.mkdtemp(prefix="gpupool-bench-logs-"))
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduler import logs

    world = _world(args.jobs)
    offsets = {job.pk: 0 for job, _node in world}

    def one_by_one() -> float:
        job, node_id = world[0]
        started = time.perf_counter()
        for _ in range(args.pieces):
            piece = logs.job_log_append(node_id=node_id, job_id=job.pk, replica=0, offset=offsets[job.pk], text=LINE)
            offsets[job.pk] = piece.next_offset
        return args.pieces / (time.perf_counter() - started)

    statements: list[int] = []

    def batched() -> float:
        calls = max(1, args.pieces // args.batch)
        started = time.perf_counter()
        with CaptureQueriesContext(connection) as queries:
            for call in range(calls):
                chosen = [world[(call * args.batch + n) % len(world)] for n in range(args.batch)]
                pieces = [
                    logs.LogPiece(node_id=node_id, job_id=job.pk, replica=0, offset=offsets[job.pk], text=LINE)
                    for job, node_id in dict((job.pk, (job, node_id)) for job, node_id in chosen).values()
                ]
                for outcome, piece in zip(logs.job_logs_append(pieces=pieces), pieces, strict=True):
                    offsets[piece.job_id] = outcome.next_offset
        elapsed = time.perf_counter() - started
        statements.append(len(queries.captured_queries) // calls)
        return calls * min(args.batch, len(world)) / elapsed

    def reads() -> float:
        job, _node = world[0]
        started = time.perf_counter()
        for _ in range(100):
            logs.job_log_slice(job=job, replica=0, offset=0, limit_bytes=logs.DEFAULT_SLICE_BYTES)
        return 100 / (time.perf_counter() - started)

    print(f"gpupool job logs benchmark: {connection.vendor}, {args.jobs} running jobs, 100-byte lines")
    print(f"  load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"  command: {' '.join([sys.executable, *sys.argv])}")
    single = statistics.median(one_by_one() for _ in range(args.runs))
    grouped = statistics.median(batched() for _ in range(args.runs))
    read = statistics.median(reads() for _ in range(args.runs))
    print(f"  one piece per transaction:        {single:8.0f} pieces/s")
    print(
        f"  {min(args.batch, len(world))} pieces of different jobs per call: {grouped:8.0f} pieces/s "
        f"({statistics.median(statements)} statements a call)"
    )
    print(f"  256 KiB slice reads:              {read:8.0f} reads/s (a log of {offsets[world[0][0].pk]} bytes)")
    print(f"  load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  (medians of {args.runs} runs)")


if __name__ == "__main__":
    main()
