"""Telemetry ingest and fan-out over real sockets: N simulated agents (8 cards each, 1 Hz) → a real web process
(``manage.py serve``: uvicorn, as production runs it; ``--server daphne`` for daphne; Redis channel layer) → 20
browser subscribers. Loopback only; bounded duration.

    GPUPOOL_REDIS_URL=redis://127.0.0.1:6379/14 .venv/bin/python benchmarks/telemetry_ingest.py \\
        --sizes 100,500,1000 --seconds 20

Prints per size: telemetry frames/s ingested (sent by agents and accepted, with the server's catch-up lag
at the end), agent-to-browser latency p50/p99, frames delivered/coalesced/dropped for watched nodes, and the
CPU each process used over the measured window (servers, agents, Redis) and the servers' CPU per frame, so
you can see where the time goes.

``--servers N`` runs N web processes (web replicas, as production runs them behind a load balancer); the
agents and the browsers are spread over them round robin, and frames cross between them through Redis.

``--watch one`` (default): each subscriber watches one node (a node's detail page). ``--watch all``: the 20
subscribers together watch every node, N/20 each; their latency then includes the ≤1 message/s throttle.
The database is a fresh SQLite file unless ``--database-url`` (or GPUPOOL_DATABASE_URL) names another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._agents import CARDS, free_port, hello_frame, telemetry_frame  # noqa: E402

HEARTBEAT_S = 5.0
DRAIN_S = 30.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (and its reaped children) from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(value) for value in fields[11:15]) / ticks


def server_command(server: str, port: int) -> list[str]:
    """One web process on ``port``: ``manage.py serve`` as production starts it (uvicorn, one worker), or
    daphne with a connect timeout long enough for the benchmark's hello storm."""
    if server == "uvicorn":
        return [
            "manage.py",
            "serve",
            "--server",
            "uvicorn",
            "--workers",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
    return [
        "-m",
        "daphne",
        "-v",
        "0",
        "--websocket_connect_timeout",
        "60",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "portal.asgi:application",
    ]


# --- setup (in this process, with the server's environment) ---------------------------------------------------


def setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    import django

    django.setup()


def create_fleet(count: int) -> tuple[list[tuple[int, str, str]], str]:
    """``count`` nodes with credentials (bulk, no audit: this is fixture data) and an admin session cookie."""
    from django.test import Client

    from scheduler.fleet.models import Node, NodeCredential
    from scheduler.fleet.services.enrolment import CREDENTIAL_PREFIX, _hash
    from tenants.models import PlatformRole, User

    run = uuid.uuid4().hex[:6]
    nodes = Node.objects.bulk_create([Node(name=f"bench-{run}-{index:04d}") for index in range(count)])
    nodes = list(Node.objects.filter(name__startswith=f"bench-{run}-").order_by("name"))
    fleet, credentials = [], []
    for node in nodes:
        key_id, secret = uuid.uuid4().hex[:16], uuid.uuid4().hex
        credentials.append(NodeCredential(node=node, key_id=key_id, secret_hash=_hash(secret)))
        fleet.append((node.pk, node.name, f"{CREDENTIAL_PREFIX}{key_id}_{secret}"))
    NodeCredential.objects.bulk_create(credentials)
    admin = User.objects.create(username=f"bench-admin-{run}", platform_role=PlatformRole.SYSTEM_ADMIN)
    client = Client()
    client.force_login(admin)
    return fleet, client.cookies["sessionid"].value


# --- simulated agents (child processes) ---------------------------------------------------------------------


async def _agent(
    url: str, name: str, credential: str, clock, seconds: float, warmup_s: float, stats: dict, delay_s: float
) -> None:
    start, finished = clock
    import websockets

    rng = random.Random(name)
    await asyncio.sleep(delay_s)  # agents come up over time, as after a portal restart with jittered backoff
    async with websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {credential}"}, max_queue=None, open_timeout=120
    ) as ws:
        await ws.recv()  # config
        await ws.send(hello_frame(name, agent_version="bench"))

        async def drain() -> None:
            async for _frame in ws:
                pass

        drainer = asyncio.ensure_future(drain())
        while start.value == 0:  # the coordinator starts the clock once the whole fleet said hello
            await asyncio.sleep(0.1)
        start_at = start.value
        stop_at = start_at + seconds
        # A random phase, as real agents have: the server sees an even stream, not a burst per second.
        next_tick = start_at + rng.random()
        next_heartbeat = next_tick + rng.random() * HEARTBEAT_S
        seq = 0
        while next_tick < stop_at:
            await asyncio.sleep(max(0.0, next_tick - time.time()))
            await ws.send(telemetry_frame(name, rng))
            if next_tick >= start_at + warmup_s:
                stats["sent"] += 1
            if next_tick >= next_heartbeat:
                seq += 1
                await ws.send(json.dumps({"v": 1, "type": "heartbeat", "id": uuid.uuid4().hex, "seq": seq}))
                next_heartbeat += HEARTBEAT_S
            next_tick += 1.0
            if time.time() > next_tick + 1.0:
                stats["late"] += 1  # could not keep 1 Hz: the sender (or the server's backpressure) is behind
        # Stay connected until the browsers have drained: a thousand sockets closing at once is a storm of its
        # own (like the hello storm), not the steady state measured.
        while finished.value == 0:
            await asyncio.sleep(0.2)
        drainer.cancel()


def agent_process(
    url: str, agents: list[tuple[int, str, str]], clock, seconds: float, warmup_s: float, ramp_per_s: float, out
):
    async def main() -> None:
        stats = {"sent": 0, "late": 0, "errors": 0}

        async def guarded(agent, delay_s):
            try:
                await _agent(url, agent[1], agent[2], clock, seconds, warmup_s, stats, delay_s)
            except Exception as exc:  # counted, shown in the summary
                stats["errors"] += 1
                stats.setdefault("error", repr(exc))

        await asyncio.gather(*(guarded(agent, index / ramp_per_s) for index, agent in enumerate(agents)))
        out.put(stats)

    asyncio.run(main())


# --- browser subscribers -----------------------------------------------------------------------------------------


async def subscriber(
    url: str, origin: str, cookie: str, node_ids: list[int], start, seconds: float, warmup_s: float, stats: dict
):
    import websockets

    async with websockets.connect(
        url, additional_headers={"Cookie": f"sessionid={cookie}"}, origin=origin, max_queue=None, open_timeout=120
    ) as ws:
        for node_id in node_ids:
            await ws.send(json.dumps({"subscribe": {"node": node_id}}))
        while start.value == 0:
            await asyncio.sleep(0.1)
        measure_from, stop_at = start.value + warmup_s, start.value + seconds
        # After the agents stop, keep reading what is still on its way (late is not dropped), until 3 s of
        # silence or DRAIN_S.
        while time.time() < stop_at + DRAIN_S:
            quiet = 3.0 if time.time() > stop_at else stop_at + 3.0 - time.time()
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=quiet)
            except TimeoutError:
                break
            received = datetime.now(UTC)
            frame = json.loads(raw)
            if frame.get("type") != "telemetry":
                continue
            stats["messages"] += 1
            for entry in frame["nodes"]:
                if not entry.get("sent_at"):
                    continue  # a snapshot
                sent = datetime.fromisoformat(entry["sent_at"])
                if sent.timestamp() < measure_from:
                    continue
                stats["latencies"].append((received - sent).total_seconds())
                stats["sent_at"].append(sent.timestamp())
                stats["coalesced"] += entry.get("coalesced", 0)


# --- one size ----------------------------------------------------------------------------------------------------


def run_size(args, env, size: int, server_pids: list[int], ports: list[int]) -> dict:
    fleet, cookie = create_fleet(size)
    processes = max(len(ports), min(args.agent_processes, size // 50 or 1))
    chunks = [fleet[index::processes] for index in range(processes)]
    queue: multiprocessing.Queue = multiprocessing.Queue()
    start = multiprocessing.Value("d", 0.0)
    finished = multiprocessing.Value("d", 0.0)
    children = [
        multiprocessing.Process(
            target=agent_process,
            args=(
                f"ws://127.0.0.1:{ports[index % len(ports)]}/ws/agent/",
                chunk,
                (start, finished),
                args.seconds,
                args.warmup,
                args.ramp / processes,
                queue,
            ),
        )
        for index, chunk in enumerate(chunks)
    ]
    node_ids = [node_id for node_id, _name, _credential in fleet]
    if args.watch == "one":
        step = max(1, size // args.subscribers)
        watch = [[node_ids[(index * step) % size]] for index in range(args.subscribers)]
    else:
        watch = [node_ids[index :: args.subscribers] for index in range(args.subscribers)]

    from scheduler.fleet.models import Node

    hello_started = time.monotonic()
    for child in children:
        child.start()
    # The hello storm (inventory upserts, one audit record per node) is set-up, not the steady state measured.
    ready, progress_at = 0, time.monotonic()
    while ready < size and time.monotonic() - progress_at < 30:
        time.sleep(0.5)
        now_ready = Node.objects.filter(pk__in=node_ids, status="ready").count()
        if now_ready > ready:
            ready, progress_at = now_ready, time.monotonic()
    hello_s = time.monotonic() - hello_started
    # Each socket still finishes its hello (tenant map, pending commands, audit) after its node turned ready:
    # let that pass before the steady state is measured (agents send telemetry only once the clock starts).
    time.sleep(args.settle)

    def cpu_now() -> dict[str, float]:
        return {
            "server": sum(cpu_seconds(pid) for pid in server_pids),
            "agents": sum(cpu_seconds(child.pid) for child in children),
            "redis": cpu_seconds(args.redis_pid) if args.redis_pid else 0.0,
        }

    window: dict[str, dict[str, float]] = {}

    async def browsers() -> list[dict]:
        all_stats = []
        tasks = []
        for index, nodes in enumerate(watch):
            stats = {"messages": 0, "coalesced": 0, "latencies": [], "sent_at": []}
            all_stats.append(stats)
            port = ports[index % len(ports)]
            url, origin = f"ws://127.0.0.1:{port}/ws/telemetry/", f"http://127.0.0.1:{port}"
            tasks.append(subscriber(url, origin, cookie, nodes, start, args.seconds, args.warmup, stats))

        async def go() -> None:
            await asyncio.sleep(2.0)  # subscribers connected and subscribed
            start.value = time.time() + 0.5
            # CPU over the measured window only (after the warm-up, before the drain).
            await asyncio.sleep(start.value + args.warmup - time.time())
            window["from"] = cpu_now()
            await asyncio.sleep(start.value + args.seconds - time.time())
            window["to"] = cpu_now()

        await asyncio.gather(go(), *tasks)
        return all_stats

    subscriber_stats = asyncio.run(browsers())
    finished.value = 1.0
    agent_stats = [queue.get(timeout=120) for _child in children]
    for child in children:
        child.join(timeout=30)

    measured_s = args.seconds - args.warmup
    sent = sum(stats["sent"] for stats in agent_stats)
    latencies = sorted(latency for stats in subscriber_stats for latency in stats["latencies"])
    # When the slow deliveries were sent (seconds into the run): one burst or a steady tail.
    worst_by_second: dict[int, float] = {}
    for stats in subscriber_stats:
        for latency, sent_at in zip(stats["latencies"], stats["sent_at"], strict=True):
            second = int(sent_at)
            worst_by_second[second] = max(worst_by_second.get(second, 0.0), latency)
    worst = sorted(worst_by_second.items(), key=lambda item: -item[1])[:3]
    watched = sum(len(nodes) for nodes in watch)
    delivered = len(latencies)
    coalesced = sum(stats["coalesced"] for stats in subscriber_stats)
    expected = watched * measured_s  # each watched node sends 1/s
    lag = server_lag(fleet, start.value + args.seconds)
    ready = Node.objects.filter(pk__in=node_ids, status="ready").count()
    cpu = {name: window["to"][name] - window["from"][name] for name in window["to"]}
    return {
        "nodes": size,
        "ingested_per_s": sent / measured_s,
        "target_per_s": size,
        "late_ticks": sum(stats["late"] for stats in agent_stats),
        "agent_errors": sum(stats["errors"] for stats in agent_stats),
        "agent_error": next((stats["error"] for stats in agent_stats if "error" in stats), ""),
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "max_ms": 1000 * latencies[-1] if latencies else float("nan"),
        "delivered": delivered,
        "coalesced": coalesced,
        "dropped": max(0, round(expected) - delivered - coalesced),
        "browser_msgs_per_s_max": max(stats["messages"] for stats in subscriber_stats) / args.seconds,
        "hello_s": hello_s,
        "lag_s": lag,
        "ready": ready,
        "cpu_pct": {name: 100 * value / measured_s for name, value in cpu.items()},
        "server_ms_per_frame": 1000 * cpu["server"] / sent if sent else float("nan"),
        "worst_seconds": worst,
    }


def server_lag(fleet: list[tuple[int, str, str]], stopped_at: float) -> float:
    """Seconds between the agents' last tick and the oldest node's latest sample in Redis (how far behind the
    server was when the agents stopped; ~1 s is keeping up, as every node ticks once a second)."""
    from scheduler.fleet.telemetry import latest_store

    latest = latest_store().get_nodes([node_id for node_id, _name, _credential in fleet])
    names = {node_id: name for node_id, name, _credential in fleet}
    now = datetime.fromtimestamp(stopped_at, UTC)
    oldest = None
    for node_id, devices in latest.items():
        for uuid_, values in devices.items():
            if not uuid_.startswith(f"GPU-{names[node_id]}-"):
                continue  # left in Redis by an earlier run that reused this node id
            moment = datetime.fromisoformat(values["at"])
            oldest = moment if oldest is None or moment < oldest else oldest
    return (now - oldest).total_seconds() if oldest else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,500,1000", help="comma-separated node counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of telemetry per size, warm-up included")
    parser.add_argument("--warmup", type=float, default=2.0, help="first seconds of telemetry not measured")
    parser.add_argument("--subscribers", type=int, default=20)
    parser.add_argument("--watch", choices=["one", "all"], default="one")
    parser.add_argument("--agent-processes", type=int, default=2)
    parser.add_argument("--servers", type=int, default=1, help="web processes (replicas), each on its own port")
    parser.add_argument(
        "--server",
        choices=["uvicorn", "daphne"],
        default="uvicorn",
        help="the ASGI server: uvicorn through manage.py serve (what production runs), or daphne",
    )
    parser.add_argument("--settle", type=float, default=10.0, help="seconds between the hello storm and measuring")
    parser.add_argument("--ramp", type=float, default=100.0, help="agents connecting per second at the start")
    parser.add_argument("--redis-url", default=os.environ.get("GPUPOOL_REDIS_URL", "redis://127.0.0.1:6379/14"))
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    parser.add_argument("--profile", default="", help="run the server under cProfile, write its stats here")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    data_dir = Path(tempfile.mkdtemp(prefix="gpupool-bench-"))
    env = {
        "GPUPOOL_DATA_DIR": str(data_dir),
        "GPUPOOL_REDIS_URL": args.redis_url,
        "GPUPOOL_CHANNELS_PREFIX": f"bench-{uuid.uuid4().hex[:6]}",
        "GPUPOOL_LOG_LEVEL": "WARNING",
        "GPUPOOL_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    if args.database_url:
        env["GPUPOOL_DATABASE_URL"] = args.database_url
    full_env = {**os.environ, **env}
    if not args.database_url:
        full_env.pop("GPUPOOL_DATABASE_URL", None)
    print(f"setting up ({'database ' + args.database_url if args.database_url else 'SQLite in ' + str(data_dir)})")
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=full_env, check=True)
    setup_django({key: value for key, value in full_env.items() if key.startswith("GPUPOOL_")})
    if not args.database_url:
        os.environ.pop("GPUPOOL_DATABASE_URL", None)
    import redis

    try:
        args.redis_pid = int(redis.Redis.from_url(args.redis_url).info("server")["process_id"])
    except Exception:
        args.redis_pid = 0
    ports = [free_port() for _server in range(args.servers)]
    servers = [
        subprocess.Popen(
            [
                sys.executable,
                *(["-m", "cProfile", "-o", f"{args.profile}.{index}"] if args.profile else []),
                *server_command(args.server, port),
            ],
            cwd=ROOT,
            env=full_env,
        )
        for index, port in enumerate(ports)
    ]
    try:
        deadline = time.monotonic() + 60
        for port in ports:
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.2)
        print(
            f"{args.server} on 127.0.0.1:{','.join(map(str, ports))}, {args.subscribers} subscribers watching "
            f"{args.watch}, {CARDS} cards/node at 1 Hz, {args.seconds:.0f} s per size, {os.cpu_count()} CPUs"
        )
        header = (
            f"{'nodes':>6} {'ingest/s':>9} {'target':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
            f"{'deliv':>6} {'coal':>5} {'drop':>5} {'lag s':>6} {'late':>5} {'cpu server/agents/redis %':>26} "
            f"{'server ms/frame':>15}"
        )
        print(header)
        for size in sizes:
            result = run_size(args, env, size, [server.pid for server in servers], ports)
            cpu = result["cpu_pct"]
            print(
                f"{result['nodes']:>6} {result['ingested_per_s']:>9.0f} {result['target_per_s']:>7} "
                f"{result['p50_ms']:>8.1f} {result['p99_ms']:>8.1f} {result['max_ms']:>8.1f} {result['delivered']:>6} "
                f"{result['coalesced']:>5} {result['dropped']:>5} {result['lag_s']:>6.2f} {result['late_ticks']:>5} "
                f"{cpu['server']:>10.0f}/{cpu['agents']:>3.0f}/{cpu['redis']:>3.0f} "
                f"{result['server_ms_per_frame']:>15.2f}",
                flush=True,
            )
            print(f"       hello storm: {result['hello_s']:.1f} s until all {size} nodes were ready")
            worst = ", ".join(
                f"{datetime.fromtimestamp(second, UTC):%H:%M:%S}: {1000 * latency:.0f} ms"
                for second, latency in result["worst_seconds"]
            )
            print(f"       slowest seconds (sent at UTC: max latency; minute rollups are written at :00): {worst}")
            if result["ready"] < size:
                print(f"       only {result['ready']} of {size} nodes were ready (hello) at the end")
            if result["agent_errors"]:
                print(f"       {result['agent_errors']} agents failed: {result['agent_error']}")
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    main()
