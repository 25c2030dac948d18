"""Gang start skew and rendezvous success: N two-replica gangs through the whole platform.

Runs the real processes (daphne, a Celery worker and beat, two simulated ``gpupool-agent``s announcing 127.0.0.1
and 127.0.0.2, each with the real sandbox and network isolation where it runs as root; the harness of
``tests/distributed``) on a scratch PostgreSQL database made for the run and dropped after it. Submits ``--gangs``
gangs at once (2 replicas x ``--gpus`` cards; 4 cards a node, so ``--gpus 2`` runs two gangs at a time), each
running ``docs/examples/distributed/allreduce.py`` with Debian's CPU PyTorch (gloo, ``env://``, no rank
arguments). Each replica notes when its process began, before importing torch.

Prints, over the gangs: start skew (first → last replica's process running), submit → last replica running (what
a user waits for, queueing included), placed → last replica running (the platform's own start latency), p50 and
p95 of each, and rendezvous success (gangs whose every replica finished the all-reduce with the right sum).

    GPUPOOL_DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpupool GPUPOOL_REDIS_URL=redis://127.0.0.1:6379/3 \\
        .venv/bin/python benchmarks/gang_start.py --gangs 50
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _django import setup_django  # benchmarks/ is on sys.path when a script runs (and _django adds the root)
from recovery import scratch_database

SCRIPT_PREFIX = "import time; print('process-start', time.time(), flush=True); "


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gangs", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=2, help="cards per replica (nodes have 4)")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    parser.add_argument("--redis-url", default=os.environ.get("GPUPOOL_REDIS_URL", ""))
    args = parser.parse_args()
    if not args.database_url.startswith("postgres") or not args.redis_url:
        parser.error("give a PostgreSQL server (--database-url / GPUPOOL_DATABASE_URL) and a Redis (--redis-url)")
    name = f"{args.database_url.rsplit('/', 1)[-1] or 'gpupool'}_gangs"
    database_url = scratch_database(args.database_url, name, create=True)
    root = Path(tempfile.mkdtemp(prefix="gpupool-gangs-"))
    os.environ["GPUPOOL_REDIS_URL"] = args.redis_url
    try:
        setup_django(database_url, str(root / "bench"))
        return run(database_url=database_url, redis_url=args.redis_url, root=root, gangs=args.gangs, gpus=args.gpus)
    finally:
        from django.db import connections

        connections.close_all()
        scratch_database(args.database_url, name, create=False)
        shutil.rmtree(root, ignore_errors=True)


def run(*, database_url: str, redis_url: str, root: Path, gangs: int, gpus: int) -> int:
    from scheduler.models import Job, JobState
    from tests.distributed.helpers import gang_spec, replica_logs, shared_examples, submit
    from tests.nodeagent.sandboxing import SANDBOX_MODE, WORKLOAD_PYTHON
    from tests.resilience.cluster import Cluster, wait_until

    examples = shared_examples()
    script = (examples / "allreduce.py").read_text()
    cluster = Cluster(
        database_url=database_url,
        redis_url=redis_url,
        root=root / "cluster",
        settings={"GPUPOOL_CYCLE_INTERVAL_S": "2"},
    )
    try:
        cluster.seed(cards=64)
        cluster.start(agents=0)
        for index in range(2):
            cluster.add_agent(f"node-{index}-{cluster.run_id[:6]}", cards=4, address=f"127.0.0.{index + 1}")
        cluster.wait_nodes_ready(list(cluster.agents), timeout_s=120)
        print(
            f"{gangs} gangs of 2 replicas x {gpus} cards on 2 nodes of 4 cards (sandbox {SANDBOX_MODE}); "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        submitted = {}
        for number in range(gangs):
            command = [WORKLOAD_PYTHON, "-c", SCRIPT_PREFIX + script]
            job_id = submit(cluster, gang_spec(cluster, f"gang-{number}", command, gpus=gpus))
            submitted[job_id] = time.time()
        final = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
        wait_until(
            lambda: Job.objects.filter(pk__in=submitted, state__in=final).count() == len(submitted),
            timeout_s=60 + 30 * gangs,
            what="every gang to end",
            interval_s=1,
            describe=cluster.describe,
        )
        skews, waits, starts, ok = [], [], [], 0
        for job in Job.objects.filter(pk__in=submitted).order_by("pk"):
            logs = replica_logs(cluster, job.pk)
            begun = [float(m) for log in logs.values() for m in re.findall(r"process-start (\S+)", log)[-1:]]
            good = sum(1 for log in logs.values() if re.search(r"rank \d+/2 .*: sum 3 \(ok\)", log))
            if len(begun) == 2:
                skews.append(max(begun) - min(begun))
                waits.append(max(begun) - submitted[job.pk])
                starts.append(max(begun) - job.admitted_at.timestamp())
            if job.state == JobState.SUCCEEDED and good == 2:
                ok += 1
            else:
                print(f"  gang {job.pk}: {job.state} {job.state_message!r}", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(examples, ignore_errors=True)

    def line(label: str, values: list[float]) -> str:
        if not values:
            return f"{label}: no data"
        return (
            f"{label}: p50 {statistics.median(values) * 1000:.0f} ms, p95 {percentile(values, 0.95) * 1000:.0f} ms, "
            f"max {max(values) * 1000:.0f} ms"
        )

    print(line("start skew (first -> last replica's process)", skews))
    print(line("placed -> last replica running", starts))
    print(line("submitted -> last replica running (queueing included)", waits))
    print(f"rendezvous success: {ok}/{gangs} gangs ({100 * ok / gangs:.0f} %)")
    return 0 if ok == gangs else 1


if __name__ == "__main__":
    sys.exit(main())
