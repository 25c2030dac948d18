"""Benchmark: the scheduling cycle on the database — snapshot from rows, ``scheduler.core.plan``, persist, commit —
and how soon a cycle starts after a submit or a finish.

Prints figures, not assertions. A pool of ``--nodes`` x 8 cards with ``--jobs`` pending jobs (a mix of whole
cards and fractions), then three cycles, each the median of ``--repeat`` runs rolled back but the last:

- ``empty pool``: everything is pending; what fits is placed (allocations, events, audit records, start
  commands) and the rest is explained;
- ``busy pool``: the next cycle, on the now busy pool (the placed jobs are allocations in the snapshot; the
  queue positions of the waiting jobs changed, so their explanations are rewritten);
- ``unchanged``: a cycle with nothing changed since (no explanation is written).

``commit`` is the COMMIT of the cycle's transaction (the audit records are sealed into their chains there).
With ``--latency N`` it then submits N jobs one at a time and reports N finishes (``workload.status``
succeeded), each once the previous cycle is over, and prints how long each took to start a cycle (and for
the cycle to end): through a real ``celery worker`` process when Redis is configured (GPUPOOL_REDIS_URL), else
through the embedded worker thread (the SQLite mode of ``gpupool demo``).

The database is a fresh SQLite file in a temporary directory unless ``--database-url`` (or
GPUPOOL_DATABASE_URL) names another (use an empty PostgreSQL database: the benchmark migrates and fills it).

    .venv/bin/python benchmarks/scheduler_db_cycle.py                  # 200 nodes x 8 cards, 3,000 jobs
    .venv/bin/python benchmarks/scheduler_db_cycle.py --nodes 1000 --jobs 10000 \\
        --database-url postgres://postgres@127.0.0.1:5432/gpupool_bench --latency 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from _django import ROOT, setup_django  # benchmarks/ is on sys.path when a script runs


def populate(nodes: int, jobs: int) -> None:
    from catalog.models import ResourceFlavor, Vendor
    from scheduler.fleet.models import Device, Node, NodeStatus
    from scheduler.models import Job, JobState
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


class _Rollback(Exception):
    pass


def _cycle(*, keep: bool) -> dict[str, float]:
    """One cycle as ``scheduler.services.cycle.run_cycle`` runs it, step by step; rolled back unless ``keep``."""
    from django.db import transaction

    from scheduler import persist, snapshot
    from scheduler.scheduling_policy import policy_from_settings

    timings: dict[str, float] = {}
    try:
        with transaction.atomic():
            start = time.perf_counter()
            stored: dict[int, tuple] = {}
            snap = snapshot.build_snapshot(stored_explanations=stored)
            timings["snapshot_s"] = time.perf_counter() - start
            start = time.perf_counter()
            plan = snapshot.plan_for(snap, policy_from_settings().__class__(require_quota=False))
            timings["plan_s"] = time.perf_counter() - start
            start = time.perf_counter()
            outcome = persist.persist_plan(plan, stored_explanations=stored)
            timings["persist_s"] = time.perf_counter() - start
            if not keep:
                raise _Rollback
            start = time.perf_counter()
        timings["commit_s"] = time.perf_counter() - start
    except _Rollback:
        timings["commit_s"] = float("nan")
    timings["placed"] = len(outcome.placed)
    timings["explained"] = outcome.explained
    timings["allocations_in_snapshot"] = len(snap.allocations)
    return timings


def _median_cycle(repeat: int) -> dict[str, float]:
    runs = [_cycle(keep=False) for _ in range(repeat - 1)] + [_cycle(keep=True)]
    result = {key: statistics.median(run[key] for run in runs) for key in ("snapshot_s", "plan_s", "persist_s")}
    return {**runs[-1], **result}


def _start_worker(database_url: str) -> subprocess.Popen | None:
    """A ``celery worker`` process on a private queue when Redis is configured, else the embedded worker."""
    from django.conf import settings

    from scheduler.services import cycle

    if not settings.REDIS_URL:
        from portal import embedded

        embedded.start_worker(concurrency=1)
        return None
    queue = f"bench-cycle-{uuid.uuid4().hex[:8]}"
    cycle.CYCLE_QUEUE = queue
    env = {**os.environ, "GPUPOOL_DATABASE_URL": database_url, "GPUPOOL_LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool", "solo", "-Q", queue]
    command += ["--hostname", f"{queue}@%h", "--without-mingle", "--without-gossip", "--loglevel", "WARNING"]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(predicate, timeout_s: float = 120.0) -> float:
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError(f"no cycle within {timeout_s} s")
        time.sleep(0.002)
    return time.perf_counter() - start


def _latency(count: int, database_url: str) -> None:
    """Submit ``count`` jobs, then report ``count`` finishes, one at a time once the last cycle is over; print
    how long each took to start a cycle and for that cycle (and any it asked for) to end."""
    from django.core.cache import cache

    from catalog.models import ResourceFlavor
    from scheduler.fleet.models import Node
    from scheduler.fleet.services.workload_reports import workload_status_report
    from scheduler.models import Allocation
    from scheduler.services import cycle
    from scheduler.services.cycle import CYCLE_CLAIM_KEY, CYCLE_DIRTY_KEY, CYCLE_STARTED_KEY, request_cycle
    from scheduler.services.jobs import job_submit
    from tenants.models import Quota, Tenant

    # The worker runs with the real settings, where a tenant needs a quota: give every one a generous one.
    flavor = ResourceFlavor.objects.get(name="bench-80g")
    for tenant in Tenant.objects.filter(slug__startswith="bench"):
        millis = 10**9 if tenant.parent_id is None else 10**9 // 20
        Quota.objects.get_or_create(tenant=tenant, flavor=flavor, defaults={"guaranteed_millis": millis})
    worker = _start_worker(database_url)
    try:
        from scheduler.tasks import run_cycle

        # Wait for the worker: its first task connects and imports everything (and as it starts it releases
        # any cycle claim it finds); then one requested cycle brings the explanations up to date, unmeasured.
        run_cycle.apply_async(queue=cycle.CYCLE_QUEUE).get(timeout=600, disable_sync_subtasks=False)
        keys = (CYCLE_DIRTY_KEY, CYCLE_CLAIM_KEY, CYCLE_STARTED_KEY)
        cache.delete_many(keys)
        request_cycle()
        _wait(lambda: cache.get(CYCLE_STARTED_KEY) and not cache.get(CYCLE_CLAIM_KEY), 600)
        spec = {"name": "probe", "tenant": "bench-team-0", "resources": {"flavors": ["bench-80g"], "gpus": 1}}
        samples: dict[str, list[tuple[float, float]]] = {"submit": [], "finish": []}
        for kind in ("submit", "finish"):
            for n in range(count):
                time.sleep(0.1)  # quiet: the last cycle's task has let go of its claim
                if cache.get(CYCLE_CLAIM_KEY):
                    _wait(lambda: not cache.get(CYCLE_CLAIM_KEY))
                before = time.time()
                if kind == "submit":
                    job_submit(actor=None, spec={**spec, "command": ["true", str(n)]})
                else:
                    running = (
                        Allocation.objects.active()
                        .filter(replica=0, job__replicas=1)
                        .order_by("job_id")
                        .values_list("job_id", "node_id")
                        .first()
                    )
                    if running is None:
                        break
                    answer = workload_status_report(
                        node=Node.objects.get(pk=running[1]),
                        job_id=running[0],
                        replica=0,
                        state="succeeded",
                        exit_code=0,
                        last_checkpoint_at=None,
                    )
                    if answer != "applied":
                        raise RuntimeError(f"the finish of job {running[0]} was not applied: {answer}")
                started = _wait(lambda before=before: (cache.get(CYCLE_STARTED_KEY) or 0) > before)
                ended = started + _wait(lambda: not cache.get(CYCLE_CLAIM_KEY))
                samples[kind].append((started, ended))
        for kind, values in samples.items():
            starts = sorted(start for start, _end in values)
            ends = sorted(end for _start, end in values)
            print(
                f"{kind:>7} → cycle start: p50 {statistics.median(starts) * 1000:7.1f} ms | "
                f"max {starts[-1] * 1000:7.1f} ms | → cycles over: p50 {statistics.median(ends) * 1000:7.1f} ms "
                f"({len(values)} samples)"
            )
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        else:
            from portal import embedded

            embedded.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per cycle (median; all but the last rolled back)")
    parser.add_argument("--latency", type=int, default=0, metavar="N", help="submits and finishes to time")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    args = parser.parse_args()

    setup_django(args.database_url or None, tempfile.mkdtemp(prefix="gpupool-sched-bench-"))
    from django.db import connection

    print(
        f"database: {connection.vendor}, {args.nodes} nodes x 8 cards, {args.jobs} pending jobs, "
        f"median of {args.repeat}, CPU count: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}"
    )
    print("command: " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]))
    populate(args.nodes, args.jobs)
    for label in ("empty pool", "busy pool", "unchanged"):
        t = _median_cycle(args.repeat)
        total = t["snapshot_s"] + t["plan_s"] + t["persist_s"] + t["commit_s"]
        print(
            f"{label:>10}: snapshot {t['snapshot_s'] * 1000:7.1f} ms | plan {t['plan_s'] * 1000:7.1f} ms | "
            f"persist {t['persist_s'] * 1000:7.1f} ms | commit {t['commit_s'] * 1000:7.1f} ms | "
            f"total {total * 1000:7.1f} ms | placed {t['placed']:5d} | explained {t['explained']:5d} | "
            f"allocations seen {t['allocations_in_snapshot']}"
        )
    if args.latency:
        _latency(args.latency, _database_url())


def _database_url() -> str:
    """This process's database as a URL for the worker process (the SQLite mode needs none: in-process)."""
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor != "postgresql":
        return ""
    auth = db["USER"] or "postgres"
    if db.get("PASSWORD"):
        auth += ":" + db["PASSWORD"]
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


if __name__ == "__main__":
    main()
