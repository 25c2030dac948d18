"""CPU the node agent spends per trivial sandboxed job: its own, and its children's (the sandbox and the command).

    sudo .venv/bin/python benchmarks/agent_job_cpu.py agent --jobs 100           # the whole agent
    sudo .venv/bin/python benchmarks/agent_job_cpu.py runner --jobs 100          # WorkloadRunner + Sandbox only
    sudo .venv/bin/python benchmarks/agent_job_cpu.py agent --no-init-server     # one unshare + interpreter per job
    sudo .venv/bin/python benchmarks/agent_job_cpu.py idle --seconds 10          # the agent with nothing to run
    ... --finished 2000                     # the agent already keeps 2,000 workloads that ended earlier today
    ... --profile                                                               # cProfile of the agent's own time
    ... --network nftables [--network-linger 0]      # with the agent's network isolation (0: rules go at each end)

``agent`` runs the real :class:`nodeagent.agent.Agent` (simulated backend, 8 cards, 1 s telemetry) against an
in-process fake portal that keeps ``--concurrency`` jobs ``command: ["true"]`` running, acknowledges every report
and log piece and answers heartbeats; ``runner`` starts the jobs one after the other on a bare
:class:`~nodeagent.workloads.WorkloadRunner`. Both sandbox each job as ``gpupool-agent run`` does (namespaces,
cgroups, the tenant's uid), so they need root. The figures are ``getrusage`` of this process (RUSAGE_SELF) and of
its reaped descendants (RUSAGE_CHILDREN: ``unshare``, the sandbox's init, the command, the init server) divided
by the jobs; no wall-clock figure is meant to be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import pstats
import random
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._agents import finished_workload  # noqa: E402
from nodeagent import protocol  # noqa: E402
from nodeagent.agent import Agent, AgentSettings  # noqa: E402
from nodeagent.backends.simulated import SimulatedBackend  # noqa: E402
from nodeagent.journal import FINISHED_FILE  # noqa: E402
from nodeagent.netpolicy import IsolationMode, NetworkIsolation  # noqa: E402
from nodeagent.sandbox import Sandbox, SandboxConfig, SandboxMode  # noqa: E402
from nodeagent.workloads import WorkloadRunner  # noqa: E402


def cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def write_finished(work_dir: Path, count: int) -> None:
    """``count`` workloads that ended within the last hour, as an agent that ran them today keeps them
    (``finished.jsonl``; ids far above the benchmark's own jobs)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    records = (finished_workload(work_dir, 10_000_000 + n, finished_at=now - 3600 + n) for n in range(count))
    (work_dir / FINISHED_FILE).write_text("".join(json.dumps(vars(record)) + "\n" for record in records))


def make_runner(work: Path, args: argparse.Namespace, backend: SimulatedBackend | None = None) -> WorkloadRunner:
    server = {"init_server": False} if args.no_init_server else {}  # (older agents have no init server)
    config = SandboxConfig(mode=SandboxMode(args.sandbox), hidden_files=(str(work / "agent.json"),), **server)
    sandbox = Sandbox(config, work_dir=work / "work")
    if sandbox.mode == SandboxMode.NAMESPACES and sandbox.problem:
        raise SystemExit(f"the sandbox cannot work here: {sandbox.problem}")
    indices = {device.uuid: device.index for device in backend.inventory()} if backend else {}
    network = None
    if args.network == "nftables":
        linger = {} if args.network_linger is None else {"linger_s": args.network_linger}
        network = NetworkIsolation(mode=IsolationMode.NFTABLES, table="gpupool_job_cpu", **linger)
        if network.problem:
            raise SystemExit(f"network isolation cannot work here: {network.problem}")
    return WorkloadRunner(work_dir=work / "work", sandbox=sandbox, device_indices=indices, network=network)


def start_frame(job_id: int, uuid: str | None) -> protocol.WorkloadStart:
    return protocol.WorkloadStart(
        command_id=job_id,
        job_id=job_id,
        replica=0,
        command=["true"],
        tenant_id=1 + job_id % 5,
        devices=[protocol.DeviceAssignment(uuid=uuid, millis=1000)] if uuid else [],
    )


def outcomes(runner: WorkloadRunner) -> Counter:
    return Counter(f"{record.state} ({record.exit_code})" for record in runner.records.values())


def run_runner(work: Path, args: argparse.Namespace) -> tuple[int, Counter]:
    runner = make_runner(work, args)
    for job_id in range(1, args.jobs + 1):
        runner.start(start_frame(job_id, None))
        while runner.records[(job_id, 0)].active:
            time.sleep(0.005)
            runner.poll()
        for status in list(runner.outbox):
            runner.outbox.ack(status.report_id)
    ended = outcomes(runner)
    runner.close()  # ends the init server, so that its children's CPU is counted
    return args.jobs, ended


class PortalConnection:
    """The agent's side of a connection to :class:`FakePortal` (``nodeagent.agent.Connection``)."""

    def __init__(self, portal: FakePortal) -> None:
        self.portal = portal
        self.inbox: list[str] = []
        self.arrived = asyncio.Event()
        self.closed = False
        self.close_code = None

    async def send(self, text: str) -> None:
        self.portal.receive(json.loads(text))

    async def ping(self, on_pong) -> None:
        on_pong()

    def push(self, message: protocol.Message) -> None:
        self.inbox.append(protocol.encode(message))
        self.arrived.set()

    def received(self) -> list[str]:
        frames, self.inbox = self.inbox, []
        self.arrived.clear()
        return frames

    async def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.arrived.wait(), timeout=max(0.0, timeout_s))

    async def close(self) -> None:
        self.closed = True


class FakePortal:
    """Keeps ``concurrency`` jobs on the node's cards until ``jobs`` have ended; acks whatever needs an ack."""

    def __init__(self, *, jobs: int, concurrency: int, uuids: list[str], done: asyncio.Event) -> None:
        self.jobs = jobs
        self.free = list(uuids[:concurrency])
        self.done = done
        self.next_job = 1
        self.finished = 0
        self.holding: dict[int, str] = {}
        self.frames: Counter = Counter()
        self.connection: PortalConnection | None = None

    async def connect(self) -> PortalConnection:
        self.connection = PortalConnection(self)
        return self.connection

    def feed(self) -> None:
        while self.free and self.next_job <= self.jobs:
            uuid = self.free.pop()
            self.holding[self.next_job] = uuid
            self.connection.push(start_frame(self.next_job, uuid))
            self.next_job += 1

    def receive(self, frame: dict) -> None:
        kind = frame["type"]
        self.frames[kind] += 1
        push = self.connection.push
        if kind == "hello":
            push(protocol.Config(telemetry_interval_s=1.0, heartbeat_interval_s=5.0, heartbeat_acks=True))
            self.feed()
        elif kind == "heartbeat":
            push(protocol.HeartbeatAck(seq=frame["seq"]))
        elif kind == "workload.log":
            end = frame["offset"] + len(frame["text"].encode())
            push(protocol.WorkloadLogAck(job_id=frame["job_id"], replica=0, offset=frame["offset"], next_offset=end))
        elif kind == "workload.status":
            push(protocol.ReportAck(report_id=frame["report_id"]))
            if frame["state"] in protocol.WORKLOAD_FINAL_STATES and frame["job_id"] in self.holding:
                self.free.append(self.holding.pop(frame["job_id"]))
                self.finished += 1
                if self.finished >= self.jobs:
                    self.done.set()
                self.feed()


def run_agent(work: Path, args: argparse.Namespace, *, jobs: int, seconds: float | None) -> tuple[int, Counter]:
    backend = SimulatedBackend(node_name="bench-00", cards=8)
    runner = make_runner(work, args, backend)

    async def main() -> FakePortal:
        done = asyncio.Event()
        uuids = [device.uuid for device in backend.inventory()]
        portal = FakePortal(jobs=jobs, concurrency=args.concurrency, uuids=uuids, done=done)
        agent = Agent(
            settings=AgentSettings(node_name="bench-00"),
            backend=backend,
            runner=runner,
            connector=portal.connect,
            rng=random.Random(1),
        )
        if seconds is not None:
            asyncio.get_running_loop().call_later(seconds, done.set)
        await agent.run(done)  # closes the runner (and its init server) at the end
        return portal

    portal = asyncio.run(main())
    print(f"frames from the agent: {dict(portal.frames)}")
    return portal.finished, outcomes(runner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["agent", "runner", "idle"])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8, help="jobs running at once (agent; 8 cards)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long idle runs")
    parser.add_argument("--sandbox", choices=[mode.value for mode in SandboxMode], default="namespaces")
    parser.add_argument("--no-init-server", action="store_true", help="start each job with unshare + interpreter")
    parser.add_argument("--profile", action="store_true", help="print where the agent's own time goes")
    parser.add_argument(
        "--network", choices=["none", "nftables"], default="none", help="the agent's network isolation (as root)"
    )
    parser.add_argument(
        "--network-linger", type=float, default=None, help="seconds a tenant's rules stay (default: the agent's)"
    )
    parser.add_argument(
        "--finished", type=int, default=0, help="workloads that ended earlier today, kept by the agent at the start"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpupool-agent-job-cpu-"))
    (work / "agent.json").write_text("{}")
    write_finished(work / "work", args.finished)  # before the meter: the history is not the agent's work
    profiler = cProfile.Profile() if args.profile else None
    own_before, children_before = cpu_seconds()
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    try:
        if args.what == "runner":
            jobs, ended = run_runner(work, args)
        elif args.what == "agent":
            jobs, ended = run_agent(work, args, jobs=args.jobs, seconds=None)
        else:
            jobs, ended = run_agent(work, args, jobs=0, seconds=args.seconds)
    finally:
        if profiler:
            profiler.disable()
        own_after, children_after = cpu_seconds()
        wall_s = time.perf_counter() - started
        shutil.rmtree(work, ignore_errors=True)
    own_ms, children_ms = 1000 * (own_after - own_before), 1000 * (children_after - children_before)
    served = getattr(SandboxConfig(), "init_server", False) and not args.no_init_server
    server = "init server" if served else "one unshare + interpreter per job"
    if jobs:
        print(f"jobs: {dict(ended)}")
        print(
            f"{args.what}: {jobs} jobs `true`, sandbox {args.sandbox} ({server}), network {args.network}"
            f"{'' if args.network_linger is None else f' (rules linger {args.network_linger:g} s)'}, "
            f"{args.finished} finished before, "
            f"{wall_s:.1f} s wall. CPU ms per job: "
            f"agent {own_ms / jobs:.1f} + children {children_ms / jobs:.1f} = {(own_ms + children_ms) / jobs:.1f}"
        )
    else:
        per_second = f"agent {own_ms / wall_s:.2f} + children {children_ms / wall_s:.2f}"
        print(f"idle {wall_s:.1f} s: CPU ms per second: {per_second}")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
