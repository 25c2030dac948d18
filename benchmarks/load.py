"""Bounded load on loopback: the job-submission API and the telemetry WebSocket at the same time, against a real
daphne server (Redis channel layer, PostgreSQL unless told otherwise).

    GPUPOOL_DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpupool_bench GPUPOOL_REDIS_URL=redis://127.0.0.1:6379/13 \\
        .venv/bin/python benchmarks/load.py --clients 20 --subscribers 50 --agents 10 --seconds 30

- ``--clients`` API clients, each a tenant member with a write-scoped API token on its own keep-alive
  connection, submit jobs (``POST /api/v1/jobs/``) back to back; every ``--list-every``-th request is a
  ``GET /api/v1/jobs/?limit=20`` instead.
- ``--agents`` simulated node agents (8 cards, telemetry at 1 Hz, heartbeats) on ``/ws/agent/``, so there is
  something to stream.
- ``--subscribers`` browsers (system-admin sessions) on ``/ws/telemetry/``, each watching one node.

Bounded by ``--seconds`` and ``--max-requests`` (whichever comes first). Prints requests/s, p50/p99 latency per
kind, the error rate and the 5xx count, the telemetry messages delivered and their agent-to-browser latency, and
checks that every job the API accepted exists exactly once. Exit status 1 on any 5xx or a missing/duplicated job.

``run_load`` (the measuring core) takes a base URL and a ``Plan`` of credentials; ``prepare`` makes the plan
in the database. tests/security/test_load_smoke.py runs both briefly against the test database.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._agents import CARDS, free_port, hello_frame, telemetry_frame  # noqa: E402

FLAVOR = "load-sim-80g"
REQUEST_TIMEOUT_S = 30.0


@dataclass
class Plan:
    """What the load runs with: one tenant, a token per API client, a session per subscriber, node credentials."""

    run: str
    tenant: str
    tokens: list[str]
    sessions: list[str]
    agents: list[tuple[int, str, str]]  # node id, node name, credential


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter = field(default_factory=Counter)
    transport_errors: int = 0
    accepted: dict[str, int] = field(default_factory=dict)  # job name -> id, from 201 answers
    ws_messages: int = 0
    ws_latencies: list[float] = field(default_factory=list)
    ws_errors: list[str] = field(default_factory=list)
    http_errors: list[str] = field(default_factory=list)
    agent_frames: int = 0
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + self.transport_errors

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if status >= 500)

    @property
    def failed(self) -> int:
        return self.transport_errors + sum(count for status, count in self.statuses.items() if status >= 400)


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * (len(ordered) - 1) + 0.5))]


# --- set-up in the database (Django configured by the caller) -----------------------------------------------------


def prepare(*, clients: int, subscribers: int, agents: int) -> Plan:
    """A tenant with ``clients`` members (write tokens), ``subscribers`` system-admin sessions and ``agents``
    registered nodes, all through the services (audited), as in production."""
    from django.test import Client

    from catalog.models import ResourceFlavor, Vendor
    from scheduler.fleet.services.enrolment import agent_register, bootstrap_token_create
    from tenants.models import MembershipRole, PlatformRole, TokenScope
    from tenants.services.identity import user_create
    from tenants.services.memberships import membership_create
    from tenants.services.tenancy import tenant_create
    from tenants.services.tokens import api_token_create

    run = uuid.uuid4().hex[:6]
    ResourceFlavor.objects.get_or_create(
        name=FLAVOR, defaults={"vendor": Vendor.SIMULATED, "model": "Simulated 80G", "memory_mib": 81920}
    )
    tenant = tenant_create(actor=None, name=f"Load {run}", slug=f"load-{run}")
    tokens = []
    for index in range(clients):
        user = user_create(actor=None, username=f"load-{run}-c{index}", password=None)
        membership_create(actor=None, user=user, tenant=tenant, role=MembershipRole.MEMBER)
        _token, secret = api_token_create(actor=user, name="load", scope=TokenScope.WRITE)
        tokens.append(secret)
    admin = user_create(
        actor=None, username=f"load-{run}-admin", password=None, platform_role=PlatformRole.SYSTEM_ADMIN
    )
    sessions = []
    for _index in range(subscribers):
        client = Client()
        client.force_login(admin)
        sessions.append(client.cookies["sessionid"].value)
    fleet_plan = []
    for index in range(agents):
        _row, bootstrap = bootstrap_token_create(actor=None, ttl_s=600)
        node, credential = agent_register(token=bootstrap, node_name=f"load-{run}-n{index:03d}")
        fleet_plan.append((node.pk, node.name, credential))
    return Plan(run=run, tenant=tenant.slug, tokens=tokens, sessions=sessions, agents=fleet_plan)


def job_counts(plan: Plan) -> Counter:
    """How many jobs of each load job name exist (every accepted job must be there exactly once)."""
    from scheduler.models import Job

    names = Job.objects.filter(tenant__slug=plan.tenant, name__startswith=f"load-{plan.run}-").values_list(
        "name", flat=True
    )
    return Counter(names)


# --- a small keep-alive HTTP/1.1 client (stdlib only) -------------------------------------------------------------


class HttpConnection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def request(self, method: str, path: str, *, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
        return await asyncio.wait_for(self._request(method, path, headers, body), REQUEST_TIMEOUT_S)

    async def _request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin1") + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        response_headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin1").partition(":")
            response_headers[name.strip().lower()] = value.strip()
        if "content-length" in response_headers:
            content = await self.reader.readexactly(int(response_headers["content-length"]))
        elif response_headers.get("transfer-encoding", "").lower() == "chunked":
            content = b""
            while True:
                size = int((await self.reader.readline()).strip() or b"0", 16)
                if size == 0:
                    await self.reader.readline()
                    break
                content += await self.reader.readexactly(size)
                await self.reader.readline()
        else:
            content = await self.reader.read()
            await self.close()
        if response_headers.get("connection", "").lower() == "close":
            await self.close()
        return status, content


# --- the load ----------------------------------------------------------------------------------------------------


class Budget:
    """At most ``total`` requests over all clients."""

    def __init__(self, total: int) -> None:
        self.left = total

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


def job_spec(name: str, tenant: str, rng: random.Random) -> dict:
    fraction = rng.random() < 0.5
    resources = (
        {"flavors": [FLAVOR], "millis": 100 * rng.randint(1, 9), "memory_mib": 1024 * rng.randint(1, 16)}
        if fraction
        else {"flavors": [FLAVOR], "gpus": rng.choice([1, 2, 4])}
    )
    return {
        "name": name,
        "tenant": tenant,
        "kind": rng.choice(["training", "batch", "inference"]),
        "priority_class": rng.choice(["low", "normal", "high"]),
        "resources": resources,
        "command": ["python", "train.py", "--seed", str(rng.randint(0, 10**6))],
        "env": {"RUN": name},
        "max_runtime_s": 3600,
    }


async def api_client(
    base: str, plan: Plan, index: int, stop_at: float, budget: Budget, stats: Stats, list_every: int
) -> None:
    parts = urlsplit(base)
    connection = HttpConnection(parts.hostname or "127.0.0.1", parts.port or 80)
    headers = {"Authorization": f"Bearer {plan.tokens[index]}", "Content-Type": "application/json"}
    rng = random.Random(f"{plan.run}-{index}")
    sequence = 0
    try:
        while time.monotonic() < stop_at and budget.take():
            sequence += 1
            if list_every and sequence % list_every == 0:
                kind, method, path, body = "list", "GET", "/api/v1/jobs/?limit=20", b""
            else:
                name = f"load-{plan.run}-{index}-{sequence}"
                kind, method, path = "submit", "POST", "/api/v1/jobs/"
                body = json.dumps(job_spec(name, plan.tenant, rng)).encode()
            started = time.perf_counter()
            try:
                status, content = await connection.request(method, path, headers=headers, body=body)
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                stats.transport_errors += 1
                stats.http_errors.append(repr(exc))
                await connection.close()
                continue
            stats.latencies.setdefault(kind, []).append(time.perf_counter() - started)
            stats.statuses[status] += 1
            if kind == "submit" and status == 201:
                stats.accepted[name] = json.loads(content)["id"]
    finally:
        await connection.close()


async def agent(
    ws_base: str, name: str, credential: str, ready: asyncio.Event, done: asyncio.Event, stats: Stats
) -> None:
    import websockets

    rng = random.Random(name)
    try:
        async with websockets.connect(
            f"{ws_base}/ws/agent/", additional_headers={"Authorization": f"Bearer {credential}"}, open_timeout=60
        ) as ws:
            await ws.recv()  # config
            await ws.send(hello_frame(name, agent_version="load"))
            ready.set()

            async def drain() -> None:
                with contextlib.suppress(websockets.ConnectionClosed):
                    async for _frame in ws:
                        pass

            drainer = asyncio.ensure_future(drain())
            next_tick = time.monotonic() + rng.random()
            beat = 0
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), timeout=max(0.0, next_tick - time.monotonic()))
                    break
                await ws.send(telemetry_frame(name, rng))
                stats.agent_frames += 1
                if stats.agent_frames % 5 == 0:
                    beat += 1
                    await ws.send(json.dumps({"v": 1, "type": "heartbeat", "id": uuid.uuid4().hex, "seq": beat}))
                next_tick += 1.0
            drainer.cancel()
    except Exception as exc:  # counted and shown
        stats.ws_errors.append(f"agent {name}: {exc!r}")


async def subscriber(ws_base: str, origin: str, session: str, node_id: int, stop_at: float, stats: Stats) -> None:
    import websockets

    try:
        async with websockets.connect(
            f"{ws_base}/ws/telemetry/", additional_headers={"Cookie": f"sessionid={session}"}, origin=origin
        ) as ws:
            await ws.send(json.dumps({"subscribe": {"node": node_id}}))
            while time.monotonic() < stop_at:
                try:
                    raw = await asyncio.wait_for(ws.recv(), timeout=max(0.1, stop_at - time.monotonic()))
                except TimeoutError:
                    break
                received = datetime.now(UTC)
                frame = json.loads(raw)
                if frame.get("type") == "error":
                    stats.ws_errors.append(f"subscriber: {frame}")
                if frame.get("type") != "telemetry":
                    continue
                stats.ws_messages += 1
                for entry in frame["nodes"]:
                    if entry.get("sent_at"):
                        stats.ws_latencies.append((received - datetime.fromisoformat(entry["sent_at"])).total_seconds())
    except Exception as exc:
        stats.ws_errors.append(f"subscriber: {exc!r}")


async def run_load(
    base: str, plan: Plan, *, seconds: float, max_requests: int, list_every: int = 5, warmup_s: float = 1.0
) -> Stats:
    """Agents connect and say hello, subscribers watch their nodes, then the API clients run for ``seconds`` (at
    most ``max_requests`` requests in all) while telemetry streams."""
    stats = Stats()
    ws_base = base.replace("http://", "ws://", 1)
    done = asyncio.Event()
    readies = [asyncio.Event() for _agent in plan.agents]
    agent_tasks = [
        asyncio.ensure_future(agent(ws_base, name, credential, ready, done, stats))
        for (_node, name, credential), ready in zip(plan.agents, readies, strict=True)
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in readies)), timeout=60)
    except TimeoutError:
        stats.ws_errors.append("not every agent said hello within 60 s")
    await asyncio.sleep(warmup_s)
    started = time.monotonic()
    stop_at = started + seconds
    node_ids = [node_id for node_id, _name, _credential in plan.agents] or [0]
    subscriber_tasks = [
        asyncio.ensure_future(subscriber(ws_base, base, session, node_ids[index % len(node_ids)], stop_at, stats))
        for index, session in enumerate(plan.sessions)
    ]
    budget = Budget(max_requests)
    await asyncio.gather(
        *(api_client(base, plan, index, stop_at, budget, stats, list_every) for index in range(len(plan.tokens)))
    )
    stats.seconds = time.monotonic() - started
    await asyncio.gather(*subscriber_tasks)
    done.set()
    await asyncio.wait_for(asyncio.gather(*agent_tasks, return_exceptions=True), timeout=30)
    return stats


def summary(stats: Stats) -> list[str]:
    lines = []
    for kind, values in sorted(stats.latencies.items()):
        lines.append(
            f"  {kind:<7} {len(values):>6} requests {len(values) / stats.seconds:>8.1f}/s   p50 "
            f"{1000 * statistics.median(values):>7.1f} ms   p99 {1000 * percentile(values, 0.99):>7.1f} ms"
        )
    total = stats.requests
    rate = 100 * stats.failed / total if total else 0.0
    lines.append(
        f"  all     {total:>6} requests {total / stats.seconds:>8.1f}/s   errors {stats.failed} ({rate:.2f} %), "
        f"5xx {stats.server_errors}, transport errors {stats.transport_errors}, statuses {dict(stats.statuses)}"
    )
    lines.append(
        f"  telemetry: {stats.agent_frames} agent frames, {stats.ws_messages} browser messages "
        f"({stats.ws_messages / stats.seconds:.1f}/s), agent-to-browser p50 "
        f"{1000 * percentile(stats.ws_latencies, 0.5):.1f} ms p99 "
        f"{1000 * percentile(stats.ws_latencies, 0.99):.1f} ms, websocket errors {len(stats.ws_errors)}"
    )
    lines.extend(f"    {error}" for error in (stats.http_errors[:3] + stats.ws_errors[:3]))
    return lines


# --- the server ----------------------------------------------------------------------------------------------------


def start_daphne(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """A daphne process on a free loopback port with ``env``; returns it and its base URL once it listens."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-v", "0", "-b", "127.0.0.1", "-p", str(port), "portal.asgi:application"],
        cwd=ROOT,
        env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"daphne exited with {server.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("daphne did not listen within 60 s")


def stop_daphne(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=20, help="API clients submitting jobs")
    parser.add_argument("--subscribers", type=int, default=50, help="browser telemetry subscribers")
    parser.add_argument("--agents", type=int, default=10, help="simulated agents (8 cards, 1 Hz)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the API clients run")
    parser.add_argument("--max-requests", type=int, default=20000, help="upper bound on API requests in all")
    parser.add_argument("--list-every", type=int, default=5, help="every n-th request lists jobs (0: never)")
    parser.add_argument("--redis-url", default=os.environ.get("GPUPOOL_REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    args = parser.parse_args()
    data_dir = tempfile.mkdtemp(prefix="gpupool-load-")
    try:
        return measure(args, data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def measure(args: argparse.Namespace, data_dir: str) -> int:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "GPUPOOL_DATA_DIR": data_dir,
        "GPUPOOL_AUDIT_WITNESS_PATH": str(Path(data_dir) / "witness.jsonl"),
        "GPUPOOL_REDIS_URL": args.redis_url,
        "GPUPOOL_CHANNELS_PREFIX": f"load-{uuid.uuid4().hex[:6]}",
        "GPUPOOL_LOG_LEVEL": "ERROR",
        "GPUPOOL_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    if args.database_url:
        env["GPUPOOL_DATABASE_URL"] = args.database_url
    else:
        env.pop("GPUPOOL_DATABASE_URL", None)
    os.environ.update({key: value for key, value in env.items() if key.startswith(("GPUPOOL_", "DJANGO_"))})
    if not args.database_url:
        os.environ.pop("GPUPOOL_DATABASE_URL", None)
    from benchmarks._django import setup_django

    setup_django(args.database_url or None, data_dir)
    print(f"database {args.database_url or 'SQLite in ' + data_dir}, redis {args.redis_url}")
    plan = prepare(clients=args.clients, subscribers=args.subscribers, agents=args.agents)
    server, base = start_daphne(env)
    try:
        print(
            f"daphne at {base}: {args.clients} API clients, {args.subscribers} telemetry subscribers, "
            f"{args.agents} agents x {CARDS} cards at 1 Hz, {args.seconds:.0f} s, at most {args.max_requests} requests"
        )
        stats = asyncio.run(
            run_load(base, plan, seconds=args.seconds, max_requests=args.max_requests, list_every=args.list_every)
        )
    finally:
        stop_daphne(server)
    for line in summary(stats):
        print(line)
    counts = job_counts(plan)
    missing = [name for name in stats.accepted if counts.get(name, 0) == 0]
    duplicated = [name for name, count in counts.items() if count > 1]
    unexpected = [name for name in counts if name not in stats.accepted]
    print(
        f"  jobs: {len(stats.accepted)} accepted (201), {sum(counts.values())} in the database, "
        f"{len(missing)} missing, {len(duplicated)} duplicated, {len(unexpected)} not acknowledged"
    )
    return 1 if stats.server_errors or missing or duplicated else 0


if __name__ == "__main__":
    sys.exit(main())
