"""State recovery time: a node is lost (its agent and workloads SIGKILLed, no goodbye) → its job runs again on
another node, resumed from its checkpoint.

Runs the real processes (daphne, a Celery worker and beat, simulated ``gpupool-agent``s; the harness of
``tests/resilience``) on a scratch PostgreSQL database made for the run and dropped after it, and a Redis it is
given (its own channel prefix; the Celery queue is shared, so give it a Redis database nobody else uses).
Each round adds two fresh nodes, runs a checkpointing job, kills the job's node once the portal knows of a
checkpoint, and times: not_ready (lease expired), requeued (after the grace period), placed, running again.
Prints every round and the medians. The recovery time is about lease + grace + one lease-check interval +
the platform's own reaction (cycle, start command, agent start); the last part is what the fast settings show.
``--profile defaults`` runs the settings an operator gets (read from portal/settings.py and portal/celery.py).

    GPUPOOL_DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpupool GPUPOOL_REDIS_URL=redis://127.0.0.1:6379/3 \\
        .venv/bin/python benchmarks/recovery.py --rounds 5                    # heartbeat 1 s, lease 5 s, grace 3 s
    ... benchmarks/recovery.py --rounds 3 --profile defaults                  # the shipped settings
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from _django import setup_django  # benchmarks/ is on sys.path when a script runs (and _django adds the root)

PROFILES = {
    # heartbeat s, lease misses, grace s, lease-check and cycle interval s
    "fast": {
        "GPUPOOL_HEARTBEAT_INTERVAL_S": "1",
        "GPUPOOL_LEASE_MISSES": "5",
        "GPUPOOL_NODE_LOST_GRACE_S": "3",
        "GPUPOOL_LEASE_CHECK_INTERVAL_S": "1",
        "GPUPOOL_CYCLE_INTERVAL_S": "2",
    },
    "defaults": None,  # the shipped settings: _stack.production_timings(), once Django is set up
}
PHASES = ("not_ready_s", "requeued_s", "placed_s", "running_s")


def scratch_database(url: str, name: str, *, create: bool) -> str:
    """Create (or drop) database ``name`` on the server of ``url``; returns its URL."""
    import psycopg

    parts = urlsplit(url)
    with psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password or None,
        dbname="postgres",
        autocommit=True,
    ) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            admin.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, "", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="fast")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    parser.add_argument("--redis-url", default=os.environ.get("GPUPOOL_REDIS_URL", ""))
    args = parser.parse_args()
    if not args.database_url.startswith("postgres") or not args.redis_url:
        parser.error("give a PostgreSQL server (--database-url / GPUPOOL_DATABASE_URL) and a Redis (--redis-url)")
    base = urlsplit(args.database_url).path.lstrip("/") or "gpupool"
    name = f"{base}_recovery"
    database_url = scratch_database(args.database_url, name, create=True)
    root = Path(tempfile.mkdtemp(prefix="gpupool-recovery-"))
    os.environ["GPUPOOL_REDIS_URL"] = args.redis_url  # this process asks for cycles through the same Redis
    try:
        setup_django(database_url, str(root / "bench"))
        from _stack import production_timings

        settings = PROFILES[args.profile] or production_timings()
        return run(
            database_url=database_url, redis_url=args.redis_url, root=root, settings=settings, rounds=args.rounds
        )
    finally:
        from django.db import connections

        connections.close_all()
        scratch_database(args.database_url, name, create=False)
        shutil.rmtree(root, ignore_errors=True)


def run(*, database_url: str, redis_url: str, root: Path, settings: dict[str, str], rounds: int) -> int:
    from django.test import override_settings

    from scheduler.fleet.fencing import lease_timing
    from scheduler.fleet.models import Node
    from scheduler.fleet.services.nodes import node_cordon
    from tests.resilience.cluster import Cluster
    from tests.resilience.invariants import check_invariants
    from tests.resilience.scenarios import lose_node_and_recover

    numbers = {"GPUPOOL_FENCING": settings.get("GPUPOOL_FENCING", "1") != "0"}
    for name in ("GPUPOOL_HEARTBEAT_INTERVAL_S", "GPUPOOL_LEASE_MISSES", "GPUPOOL_NODE_LOST_GRACE_S"):
        numbers[name] = int(settings[name])
    if "GPUPOOL_FENCE_GRACE_S" in settings:
        numbers["GPUPOOL_FENCE_GRACE_S"] = int(settings["GPUPOOL_FENCE_GRACE_S"])
    with override_settings(**numbers):
        timing = lease_timing()  # what the portal processes compute from the same settings
    lease_s, grace_s = timing.lease_s, timing.grace_s
    fence = f"agents fence after {timing.fence_after_s} s" if timing.fence_after_s else "no fencing"
    print(
        f"heartbeat {timing.heartbeat_interval_s} s, lease {lease_s} s, grace {grace_s} s, {fence}, "
        f"lease check every {settings['GPUPOOL_LEASE_CHECK_INTERVAL_S']} s, cycle every "
        f"{settings['GPUPOOL_CYCLE_INTERVAL_S']} s; {rounds} rounds",
        flush=True,
    )
    cluster = Cluster(database_url=database_url, redis_url=redis_url, root=root / "cluster", settings=settings)
    results = []
    try:
        cluster.seed()
        cluster.start(agents=0)
        for number in range(rounds):
            # Two fresh nodes per round; the last round's are cordoned so the job lands on a new one.
            for node in Node.objects.exclude(status="cordoned"):
                node_cordon(node=node, actor=None)
            names = [f"r{number}-{side}-{cluster.run_id[:6]}" for side in ("a", "b")]
            for name in names:
                cluster.add_agent(name)
            cluster.wait_nodes_ready(names, timeout_s=120)
            started = time.monotonic()
            outcome = lose_node_and_recover(cluster, name=f"round-{number}", lease_s=lease_s, grace_s=grace_s)
            results.append(outcome)
            print(
                f"round {number + 1}: not_ready {outcome['not_ready_s']:6.1f} s"
                f"  requeued {outcome['requeued_s']:6.1f} s"
                f"  placed {outcome['placed_s']:6.1f} s  running again {outcome['running_s']:6.1f} s"
                f"  (resumed at step {cluster.starts_of(outcome['job_id'])[-1]['resumed_from']}, "
                f"round took {time.monotonic() - started:.0f} s)",
                flush=True,
            )
        check_invariants(cluster, settle_timeout_s=60)
    finally:
        cluster.stop()
    medians = {phase: statistics.median(r[phase] for r in results) for phase in PHASES}
    print(
        f"median of {len(results)}: node lost → not_ready {medians['not_ready_s']:.1f} s, requeued "
        f"{medians['requeued_s']:.1f} s, placed {medians['placed_s']:.1f} s, running again elsewhere "
        f"{medians['running_s']:.1f} s (by configuration: lease {lease_s} s + grace {grace_s} s counted from the "
        f"node's last heartbeat, 0-{timing.heartbeat_interval_s} s before it died, each rounded up to a lease check; "
        f"the platform's own reaction, requeued → running: {medians['running_s'] - medians['requeued_s']:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
