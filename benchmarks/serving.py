"""The serving path's added latency: requests to a job's endpoint through Caddy (forward_auth to the portal, then
the replica) against the same replica called directly.

Runs the real processes (daphne, a Celery worker and beat, one simulated ``gpupool-agent`` with the real sandbox
where it runs as root; the harness of ``tests/distributed``) and Debian's Caddy with only its admin API, which the
portal configures, on a scratch PostgreSQL database made for the run and dropped after it. The job serves
``docs/examples/serving/echo_server.py`` on one replica. Each round sends ``--requests`` GETs with 1 client and
with ``--clients`` clients at once, to the replica directly and through the proxy (with a bearer token: every
request is checked by the portal). Prints p50/p99 latency and requests/s of each, medians over ``--rounds``.

    GPUPOOL_DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpupool GPUPOOL_REDIS_URL=redis://127.0.0.1:6379/3 \\
        .venv/bin/python benchmarks/serving.py --requests 500 --clients 8 --rounds 3
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from _django import setup_django  # benchmarks/ is on sys.path when a script runs (and _django adds the root)
from recovery import scratch_database


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def load(url: str, *, token: str | None, requests: int, clients: int) -> tuple[list[float], float, int]:
    """``requests`` GETs of ``url`` spread over ``clients`` keep-alive connections: latencies (s), wall time (s),
    failures."""
    parts = urlsplit(url)
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    per_client = [requests // clients + (1 if i < requests % clients else 0) for i in range(clients)]
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def client(count: int) -> None:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        mine = []
        for _ in range(count):
            started = time.perf_counter()
            try:
                connection.request("GET", parts.path, headers=headers)
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except OSError:
                ok = False
                connection.close()
                connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
            mine.append(time.perf_counter() - started)
            if not ok:
                with lock:
                    failures[0] += 1
        connection.close()
        with lock:
            latencies.extend(mine)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(count,)) for count in per_client]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, time.perf_counter() - started, failures[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    parser.add_argument("--redis-url", default=os.environ.get("GPUPOOL_REDIS_URL", ""))
    args = parser.parse_args()
    if not args.database_url.startswith("postgres") or not args.redis_url:
        parser.error("give a PostgreSQL server (--database-url / GPUPOOL_DATABASE_URL) and a Redis (--redis-url)")
    if shutil.which("caddy") is None:
        parser.error("caddy is not installed (apt-get install caddy)")
    name = f"{args.database_url.rsplit('/', 1)[-1] or 'gpupool'}_serving"
    database_url = scratch_database(args.database_url, name, create=True)
    root = Path(tempfile.mkdtemp(prefix="gpupool-serving-"))
    os.environ["GPUPOOL_REDIS_URL"] = args.redis_url
    try:
        setup_django(database_url, str(root / "bench"))
        return run(database_url=database_url, redis_url=args.redis_url, root=root, args=args)
    finally:
        from django.db import connections

        connections.close_all()
        scratch_database(args.database_url, name, create=False)
        shutil.rmtree(root, ignore_errors=True)


def run(*, database_url: str, redis_url: str, root: Path, args: argparse.Namespace) -> int:
    from scheduler.models import ReplicaPort
    from tests.distributed.helpers import CaddyServer, shared_examples
    from tests.nodeagent.sandboxing import SANDBOX_MODE, WORKLOAD_PYTHON
    from tests.resilience.cluster import FLAVOR, Cluster, wait_until

    examples = shared_examples()
    (root / "caddy").mkdir()
    caddy = CaddyServer(root / "caddy").start()
    cluster = Cluster(database_url=database_url, redis_url=redis_url, root=root / "cluster")
    cluster.settings.update(caddy.portal_settings(portal=f"127.0.0.1:{cluster.port}"))
    try:
        cluster.seed(cards=8)
        cluster.start(agents=0)
        cluster.add_agent(f"node-0-{cluster.run_id[:6]}", cards=2, address="127.0.0.1")
        cluster.wait_nodes_ready(list(cluster.agents), timeout_s=120)
        spec = {
            "name": "echo",
            "tenant": cluster.tenant_slug,
            "kind": "inference",
            "resources": {"flavors": [FLAVOR], "gpus": 1},
            "ports": [{"name": "http"}],
            "command": [WORKLOAD_PYTHON, str(examples / "echo_server.py")],
        }
        status, job = cluster.api("/api/v1/jobs/", spec)
        assert status == 201, job
        proxied = f"{caddy.serving_url}/serve/jobs/{job['id']}/http/"
        wait_until(
            lambda: load(proxied, token=cluster.token, requests=1, clients=1)[2] == 0,
            timeout_s=120,
            what="the endpoint to answer",
        )
        port = ReplicaPort.objects.get(job_id=job["id"], purpose=ReplicaPort.Purpose.NAMED)
        direct = f"http://127.0.0.1:{port.port}/"
        print(
            f"{args.requests} requests a round, {args.rounds} rounds, 1 and {args.clients} clients; one replica "
            f"(sandbox {SANDBOX_MODE}); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        figures: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for _round in range(args.rounds):
            for clients in (1, args.clients):
                for label, url, token in (("direct", direct, None), ("proxy", proxied, cluster.token)):
                    latencies, wall, failures = load(url, token=token, requests=args.requests, clients=clients)
                    if failures:
                        print(f"  {label}, {clients} clients: {failures} failed requests", flush=True)
                    figures.setdefault((label, clients), []).append(
                        (percentile(latencies, 0.5), percentile(latencies, 0.99), len(latencies) / wall)
                    )
    finally:
        cluster.stop()
        caddy.stop()
        shutil.rmtree(examples, ignore_errors=True)
    print(f"{'path':<8} {'clients':>7} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}   (medians of {args.rounds} rounds)")
    for (label, clients), rows in sorted(figures.items(), key=lambda item: (item[0][1], item[0][0])):
        p50 = statistics.median(r[0] for r in rows) * 1000
        p99 = statistics.median(r[1] for r in rows) * 1000
        rate = statistics.median(r[2] for r in rows)
        print(f"{label:<8} {clients:>7} {p50:>8.1f} {p99:>8.1f} {rate:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
