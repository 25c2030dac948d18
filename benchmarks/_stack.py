"""gpupool's production stack for benchmarks: the process harness of ``tests/resilience`` (``Cluster``: Celery
worker and beat, real ``gpupool-agent --backend simulated`` processes) with the web tier as production runs it,
``gpupool serve --workers N`` (uvicorn processes sharing one socket), and production's timing settings instead
of the fault tests' short leases.

Also: CPU seconds per process group (where a run's CPU went) and the scheduling cycles the workers ran.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.resilience.cluster import PYTHON, Cluster, Proc


def production_timings() -> dict[str, str]:
    """The lease, grace, fencing and beat settings an operator gets (portal/settings.py, portal/celery.py: read
    from the settings once Django is set up, not copied), passed explicitly so the harness's short fault-test
    leases do not leak into a performance run."""
    from django.conf import settings

    from kernel.cadence import CYCLE_INTERVAL_S, LEASE_CHECK_INTERVAL_S

    return {
        "GPUPOOL_HEARTBEAT_INTERVAL_S": str(settings.GPUPOOL_HEARTBEAT_INTERVAL_S),
        "GPUPOOL_LEASE_MISSES": str(settings.GPUPOOL_LEASE_MISSES),
        "GPUPOOL_NODE_LOST_GRACE_S": str(settings.GPUPOOL_NODE_LOST_GRACE_S),
        "GPUPOOL_FENCING": "1" if settings.GPUPOOL_FENCING else "0",
        "GPUPOOL_FENCE_GRACE_S": str(settings.GPUPOOL_FENCE_GRACE_S),
        "GPUPOOL_LEASE_CHECK_INTERVAL_S": str(LEASE_CHECK_INTERVAL_S),
        "GPUPOOL_CYCLE_INTERVAL_S": str(CYCLE_INTERVAL_S),
    }


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ServedCluster(Cluster):
    """``Cluster`` whose web tier is ``gpupool serve --workers web_workers``."""

    web_workers: int = 2
    #: ``uvicorn`` or ``daphne`` (one process: what the portal ran on before ``gpupool serve``).
    web_server: str = "uvicorn"
    #: Environment for the web processes only (e.g. ``GPUPOOL_DB_CONN_MAX_AGE``).
    web_settings: dict[str, str] = field(default_factory=dict)
    #: The agents' ``--sandbox`` (empty: the agent's default, namespaces).
    agent_sandbox: str = ""

    def agent_env(self) -> dict[str, str]:
        env = super().agent_env()
        if self.agent_sandbox:
            env["GPUPOOL_AGENT_SANDBOX"] = self.agent_sandbox
        return env

    def start_web(self) -> Proc:
        env = self.portal_env()
        # The worker logs at INFO (its cycle lines are read back); the web tier logs what an operator sees.
        env["GPUPOOL_LOG_LEVEL"] = "WARNING"
        env.update(self.web_settings)
        argv = [PYTHON, "-m", "portal.cli", "serve", "--server", self.web_server, "--workers", str(self.web_workers)]
        self.web = self._spawn("web", [*argv, "--host", "127.0.0.1", "--port", str(self.port)], env)
        return self.web

    def process_groups(self) -> dict[str, list[int]]:
        """The pids of each kind of process of this stack (web: supervisor and workers; agents: with workloads)."""
        groups = {"web": descendants(self.web.pid) if self.web else []}
        groups["celery worker"] = [pid for proc in self.workers for pid in descendants(proc.pid)]
        groups["celery beat"] = descendants(self.beat.pid) if self.beat else []
        groups["agents"] = [pid for agent in self.agents.values() for pid in descendants(agent.proc.pid)]
        return groups


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and of its children it has reaped (0 for a process that is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    # Fields 14-17 of stat (utime, stime, cutime, cstime); index 11.. after the ")" split.
    return sum(int(value) for value in fields[11:15]) / CLOCK_TICKS


def pids_matching(predicate) -> list[int]:
    """Live pids whose command line (NUL-separated, as bytes) satisfies ``predicate``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if predicate(cmdline):
            found.append(int(entry))
    return found


class CpuMeter:
    """CPU seconds per named group between ``start()`` and ``stop()``; a process that ended in between is
    counted up to its last reading (pass ``groups`` as a callable, so new processes are picked up)."""

    def __init__(self, groups) -> None:
        self.groups = groups
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.owner: dict[int, str] = {}

    def sample(self) -> None:
        for name, pids in self.groups().items():
            for pid in pids:
                seconds = cpu_seconds(pid)
                if seconds:
                    self.owner[pid] = name
                    self.first.setdefault(pid, seconds)
                    self.last[pid] = seconds

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, name in self.owner.items():
            out[name] = out.get(name, 0.0) + self.last[pid] - self.first[pid]
        return out


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (every core, every user), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / CLOCK_TICKS, sum(values) / CLOCK_TICKS


PLACED = re.compile(r"'placed': \[([^\]]*)\]")
RAN = re.compile(r"'ran': (True|False)")


@dataclass(frozen=True)
class Cycle:
    at: float  # when the worker reported it (time.time())
    seconds: float  # the task's runtime, as the worker measured it
    ran: bool  # False: another cycle held the lock
    placed: int | None  # None when the result was cut short in the event


@dataclass(frozen=True)
class RequestedCycles:
    """One ``scheduler.cycle_requested`` task: the cycles changes asked for, run back to back."""

    at: float
    seconds: float
    cycles: int


class CycleEvents:
    """The scheduling cycles the Celery workers run, as they report them: task events (runtime and result of each
    ``scheduler.run_cycle``, beat's safety net, and of each ``scheduler.cycle_requested``, which runs the cycles
    that submits and finishes ask for, several per task), switched on with the ``enable_events`` remote-control
    command and received in a thread of this process. The workers' logs cannot tell: the project's logging keeps
    ``celery`` at WARNING."""

    def __init__(self) -> None:
        self.cycles: list[Cycle] = []
        self.requested: list[RequestedCycles] = []
        self.failed = 0
        self._names: dict[str, str] = {}
        self._receiver = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> None:
        from portal.celery import app

        self._thread = threading.Thread(target=self._capture, args=(app,), name="cycle-events", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        app.control.enable_events()

    def _capture(self, app) -> None:
        handlers = {
            "task-received": self._received,
            "task-succeeded": self._succeeded,
            "task-failed": self._failed,
        }
        with app.connection_for_read() as connection:
            self._receiver = app.events.Receiver(connection, handlers=handlers)
            self._ready.set()
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def _received(self, event: dict) -> None:
        self._names[event["uuid"]] = event.get("name", "")

    def _succeeded(self, event: dict) -> None:
        name = self._names.pop(event["uuid"], "")
        if name == "scheduler.cycle_requested":
            count = str(event.get("result", "")).strip("'\"")
            self.requested.append(
                RequestedCycles(
                    at=float(event.get("timestamp", time.time())),
                    seconds=float(event.get("runtime", 0.0)),
                    cycles=int(count) if count.isdigit() else 0,
                )
            )
            return
        if name != "scheduler.run_cycle":
            return
        result = str(event.get("result", ""))
        ran = RAN.search(result)
        placed = PLACED.search(result)
        count = len([item for item in placed.group(1).split(",") if item.strip()]) if placed else None
        self.cycles.append(
            Cycle(
                at=float(event.get("timestamp", time.time())),
                seconds=float(event.get("runtime", 0.0)),
                ran=bool(ran and ran.group(1) == "True"),
                placed=count,
            )
        )

    def _failed(self, event: dict) -> None:
        if self._names.pop(event["uuid"], "") == "scheduler.run_cycle":
            self.failed += 1

    def between(self, start: float, end: float) -> list[Cycle]:
        return [cycle for cycle in list(self.cycles) if start <= cycle.at <= end]

    def requested_between(self, start: float, end: float) -> list[RequestedCycles]:
        return [task for task in list(self.requested) if start <= task.at <= end]

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        if self._thread is not None:
            self._thread.join(timeout=5)
