"""Chaos: at least 200 jobs of mixed shapes (whole cards, two cards, fractions, gangs of two, arrays) on simulated
nodes while Celery workers are SIGKILLed, a private Redis is restarted, the web server is SIGKILLed and
restarted, agents are SIGKILLed and restarted, and agents' links are cut by proxies — briefly, and past the grace
period (the agent fences, the portal moves its jobs). Bounded: the jobs are submitted over ``--window`` seconds
and the run ends when every job has ended (or ``--drain-timeout`` later).

Runs the real processes (daphne, Celery worker and beat, ``gpupool-agent --backend simulated``; the harness of
``tests/resilience``, with its short lease: heartbeat 1 s, lease 5 s, grace 24 s, fence after 16 s) on a scratch
PostgreSQL database made for the run and dropped after it, and a private ``redis-server`` on ``--redis-port``.
Samples the safety rules every second (no job twice in ``/proc``, no card past 1000 millis or its memory,
allocations only for active jobs, unbroken histories) and at the end prints: every job ended exactly once, none
lost, no allocation open, deadlocks (``pg_stat_database`` and the logs), whether the audit trail verifies.
Exits 1 when any of those fails.

    GPUPOOL_DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpupool .venv/bin/python benchmarks/chaos.py
    ... benchmarks/chaos.py --jobs 400 --nodes 4 --window 240 --seed 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from _django import setup_django  # benchmarks/ is on sys.path when a script runs (and _django adds the root)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200, help="jobs to submit (an array counts its copies)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cards", type=int, default=4, help="simulated cards per node")
    parser.add_argument("--window", type=float, default=150.0, help="seconds over which jobs are submitted")
    parser.add_argument("--drain-timeout", type=float, default=240.0, help="seconds after the window to finish")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--redis-port", type=int, default=6391, help="port of the private redis-server")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    parser.add_argument("--keep", action="store_true", help="keep the logs, work dirs and database (printed)")
    args = parser.parse_args()
    if not args.database_url.startswith("postgres"):
        parser.error("give a PostgreSQL server (--database-url / GPUPOOL_DATABASE_URL)")
    if shutil.which("redis-server") is None:
        parser.error("redis-server is not installed (apt-get install redis-server)")
    from recovery import scratch_database

    base = urlsplit(args.database_url).path.lstrip("/") or "gpupool"
    name = f"{base}_chaos"
    database_url = scratch_database(args.database_url, name, create=True)
    root = Path(tempfile.mkdtemp(prefix="gpupool-chaos-"))
    from tests.resilience.cluster import RedisServer

    redis = RedisServer(root / "redis")
    redis.port = args.redis_port
    (root / "redis").mkdir()
    redis.start()
    os.environ["GPUPOOL_REDIS_URL"] = redis.url
    try:
        setup_django(database_url, str(root / "bench"))
        return run(args, database_url=database_url, root=root, redis=redis)
    finally:
        from django.db import connections

        connections.close_all()
        redis.stop()
        if args.keep:
            print(f"logs and work dirs kept in {root}, the database in {database_url}")
        else:
            scratch_database(args.database_url, name, create=False)
            shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace, *, database_url: str, root: Path, redis) -> int:
    from tests.resilience.chaos import ChaosPlan, run_chaos
    from tests.resilience.cluster import Cluster

    # Faults scale with the window: about one of each kind per 50 s, two long cuts, cuts twice as often.
    per = max(1, round(args.window / 50))
    plan = ChaosPlan(
        jobs=args.jobs,
        window_s=args.window,
        faults={
            "worker_kill": per,
            "redis_restart": per,
            "web_restart": per,
            "agent_kill": per,
            "short_cut": 2 * per,
            "long_cut": 2,
        },
        seed=args.seed,
        drain_timeout_s=args.drain_timeout,
    )
    load = os.getloadavg()
    print(
        f"chaos: {args.jobs} jobs over {args.window:.0f} s on {args.nodes} nodes x {args.cards} simulated cards, seed "
        f"{args.seed}; faults {plan.faults}; machine: {os.cpu_count()} CPUs, load {load[0]:.1f}",
        flush=True,
    )
    cluster = Cluster(database_url=database_url, redis_url=redis.url, root=root / "cluster")
    try:
        cluster.seed(cards=args.nodes * args.cards)
        cluster.start(agents=0)
        names = [f"chaos-{index}-{cluster.run_id[:6]}" for index in range(args.nodes)]
        for name in names:
            cluster.add_agent(name, cards=args.cards, via_proxy=True)
        cluster.wait_nodes_ready(names, timeout_s=120)
        result = run_chaos(cluster, redis, plan, log=lambda line: print(line, flush=True))
    finally:
        cluster.stop()
    for line in result.lines():
        print(line)
    for violation in result.violations[:20]:
        print(f"  violation: {violation}")
    for job_id, state, message in result.unsuccessful[:20]:
        print(f"  job {job_id} {state}: {message}")
    if result.lost:
        print(f"  not ended: jobs {result.lost[:20]}")
    print("all checks pass" if result.ok else "CHECKS FAILED")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
