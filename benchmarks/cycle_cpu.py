"""Benchmark: the Celery worker's CPU per job for trivial 1-card jobs, in one process, without Celery.

The worker's share of a job's life is the scheduling cycles it runs: one after the submit (it places the job),
one after the finish (nothing left to place, or the next job in the queue). This runs exactly that, one job at
a time, as ``scheduler.cycle_requested`` runs it (``run_requested_cycles``: the cycle claim and dirty flag,
snapshot → plan → persist, the commit with its audit records and on-commit work: the usage record, the
announce of the start commands to the agents' sockets), with the agent's reports applied in between through
``workload_status_report`` (running, then succeeded). Only the worker's part is timed (``time.process_time``:
CPU, not wall clock, so a busy machine inflates it less), and printed per job and per cycle, placing and empty.

Prints figures, not assertions. The database is a fresh SQLite file in a temporary directory unless
``--database-url`` (or GPUPOOL_DATABASE_URL) names another (use an empty PostgreSQL database: the benchmark
migrates and fills it); the cache is Redis when GPUPOOL_REDIS_URL is set (as in production), else local memory.

    .venv/bin/python benchmarks/cycle_cpu.py --jobs 200
    GPUPOOL_REDIS_URL=redis://127.0.0.1:6379/5 .venv/bin/python benchmarks/cycle_cpu.py --jobs 200 \\
        --database-url postgres://postgres@127.0.0.1:5432/gpupool_bench
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from _django import ROOT, setup_django  # benchmarks/ is on sys.path when a script runs


def _populate(nodes: int) -> None:
    from catalog.models import ResourceFlavor, Vendor
    from scheduler.fleet.models import Device, Node, NodeStatus
    from tenants.models import Quota, Tenant

    flavor = ResourceFlavor.objects.create(name="cpu-80g", vendor=Vendor.SIMULATED, model="C80", memory_mib=81920)
    tenant = Tenant.objects.create(name="cpu", slug="cpu")
    Quota.objects.create(tenant=tenant, flavor=flavor, guaranteed_millis=nodes * 8000, limit_millis=nodes * 8000)
    for n in range(nodes):
        node = Node.objects.create(name=f"cpu-node-{n}", status=NodeStatus.READY, cpu_cores=64)
        Device.objects.bulk_create(
            Device(
                node=node,
                index=i,
                uuid=f"GPU-cpu-{n}-{i}",
                vendor=Vendor.SIMULATED,
                model="C80",
                flavor=flavor,
                memory_mib=81920,
            )
            for i in range(8)
        )


def _worker(cpu: dict[str, list[float]]) -> None:
    """What one ``scheduler.cycle_requested`` task runs, its CPU added to ``cpu`` by kind of cycle."""
    from scheduler.services import cycle

    placed: list[int] = []
    real = cycle.run_cycle

    def counted(**kwargs):
        result = real(**kwargs)
        placed.append(len(result.placed))
        return result

    cycle.run_cycle = counted
    try:
        started = time.process_time()
        cycle.run_requested_cycles()
        took = time.process_time() - started
    finally:
        cycle.run_cycle = real
    cpu["placing" if any(placed) else "empty"].append(took / max(1, len(placed)))
    cpu["cycles"].append(len(placed))
    cpu["total"].append(took)


def _report(job_id: int, state: str) -> None:
    from scheduler.fleet.models import Node
    from scheduler.fleet.services.workload_reports import workload_status_report
    from scheduler.models import Allocation

    node_id = Allocation.objects.filter(job_id=job_id).values_list("node_id", flat=True).first()
    answer = workload_status_report(
        node=Node.objects.get(pk=node_id),
        job_id=job_id,
        replica=0,
        state=state,
        exit_code=0 if state == "succeeded" else None,
        last_checkpoint_at=None,
    )
    if answer != "applied":
        raise RuntimeError(f"the {state} report of job {job_id} was not applied: {answer}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=4, help="nodes of 8 cards")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    args = parser.parse_args()

    setup_django(args.database_url or None, tempfile.mkdtemp(prefix="gpupool-cycle-cpu-"))
    from django.conf import settings
    from django.core.cache import cache
    from django.db import connection

    from scheduler.services import cycle
    from scheduler.services.jobs import job_submit

    print(
        f"database: {connection.vendor}, cache: {'redis' if settings.REDIS_URL else 'local memory'}, "
        f"{args.nodes} nodes x 8 cards, {args.jobs} jobs one at a time, CPU count: {os.cpu_count()}, "
        f"load: {os.getloadavg()[0]:.2f}"
    )
    print("command: " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]))
    _populate(args.nodes)
    cycle.cycle_task_send = lambda **kwargs: None  # the requests are served here, not by a worker process
    cache.delete_many([cycle.CYCLE_DIRTY_KEY, cycle.CYCLE_CLAIM_KEY])
    spec = {"name": "cpu", "tenant": "cpu", "resources": {"flavors": ["cpu-80g"], "gpus": 1}, "command": ["true"]}
    cpu: dict[str, list[float]] = {"placing": [], "empty": [], "cycles": [], "total": []}
    warm_up = 5
    for n in range(warm_up + args.jobs):
        if n == warm_up:
            cpu = {key: [] for key in cpu}
        job = job_submit(actor=None, spec={**spec, "command": ["true", str(n)]})
        _worker(cpu)  # places it
        _report(job.pk, "running")
        _report(job.pk, "succeeded")
        _worker(cpu)  # the finish: nothing left to place
    per_job = 1000 * sum(cpu["total"]) / args.jobs
    print(
        f"worker CPU per job: {per_job:.1f} ms ({sum(cpu['cycles'])} cycles for {args.jobs} jobs) | "
        f"placing cycle p50 {1000 * statistics.median(cpu['placing']):.1f} ms | "
        f"empty cycle p50 {1000 * statistics.median(cpu['empty']):.1f} ms"
    )


if __name__ == "__main__":
    main()
