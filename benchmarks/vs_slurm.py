"""gpupool against Slurm on the same machine and the same workload: trivial 1-GPU jobs (``true``) on 32 GPUs.

    GPUPOOL_DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpupool_bench GPUPOOL_REDIS_URL=redis://127.0.0.1:6379/5 \\
        .venv/bin/python benchmarks/vs_slurm.py                      # 1,000 jobs, 8 clients, arrays 10k+100k, 3 rounds
    ... benchmarks/vs_slurm.py --quick                               # 200 jobs, arrays 1,000 + 10,000, 1 round
    ... benchmarks/vs_slurm.py --systems gpupool --web-workers 1,2   # gpupool alone, 1 and 2 web processes

gpupool runs as production does (benchmarks/_stack.py): PostgreSQL (a scratch database made for the run and
dropped after it), Redis, ``gpupool serve --workers N`` (uvicorn), a Celery worker and beat, and 4 simulated
``gpupool-agent`` processes with 8 cards each, which really start each job's command. Slurm (Debian's
slurm-wlm, when installed: ``apt-get install slurm-wlm munge``) runs from a config this script writes under a
temp dir: one node with 32 GPUs declared in gres.conf (``File=`` 32 fake character devices made with mknod,
since Slurm drops GPUs without one), select/cons_tres, default scheduler settings, its own munged; munged,
slurmctld and slurmd are started in the foreground and stopped by PID.

Each round, per system (and per web process count, alternated on the same gpupool stack): a warm-up batch,
then ``--jobs`` jobs submitted by one client (gpupool: one keep-alive HTTP connection; Slurm: one ``sbatch``
after another), waited for to finish; then ``--jobs`` jobs from ``--clients`` clients at once, waited for.
Then arrays of ``--array`` and ``--array-large`` tasks, ``--rounds`` times each, each cancelled once timed (gpupool:
``"array": {"count": N}``; Slurm: ``sbatch --array``). Prints
each round, the medians, gpupool ÷ Slurm, the targets of issue 14, the deadlocks PostgreSQL counted
(``pg_stat_database.deadlocks`` before/after) and HTTP 5xx (with the exceptions behind them); where a target
is missed, where the time went: SQL statements and in-process time of one submit, CPU per job of each process
group, PostgreSQL transactions per job, the steps of the jobs' lives, and the scheduling cycles the worker ran
(Celery task events).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._django import setup_django  # noqa: E402
from benchmarks._stack import (  # noqa: E402
    CpuMeter,
    Cycle,
    CycleEvents,
    RequestedCycles,
    ServedCluster,
    descendants,
    machine_cpu,
    pids_matching,
    production_timings,
)
from benchmarks.load import HttpConnection, percentile  # noqa: E402

GPUS = 32
AGENTS, CARDS_PER_AGENT = 4, 8
POLL_S = 0.25
#: Issue 14's targets: gpupool at least Slurm's speed on every row, and these floors.
SERIAL_TARGET_PER_S, CLIENTS_TARGET_PER_S = 150.0, 200.0


@dataclass
class Phase:
    """One batch of submits and how long until every job of it finished."""

    jobs: int = 0
    seconds: float = 0.0  # first submit sent → last answer received
    latencies: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    ids: list = field(default_factory=list)
    finished_s: float | None = None  # first submit → all finished (None: not within the timeout)
    not_finished: str = ""
    load: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    machine_busy_pct: float = 0.0
    cycles: list[Cycle] = field(default_factory=list)
    requested: list[RequestedCycles] = field(default_factory=list)
    xacts: int = 0
    steps: str = ""

    @property
    def rate(self) -> float:
        return len(self.ids) / self.seconds if self.seconds else 0.0

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if isinstance(status, int) and status >= 500)


@dataclass
class ArrayResult:
    available: bool
    count: int = 0
    seconds: float = 0.0
    note: str = ""


# --- gpupool ----------------------------------------------------------------------------------------------------


class Gpupool:
    name = "gpupool"

    def __init__(
        self,
        *,
        database_url: str,
        redis_url: str,
        root: Path,
        web_workers: list[int],
        web_server: str,
        conn_max_age: int,
        pool_max_size: int,
        agent_sandbox: str,
        group_commit: bool = True,
        agent_db_threads: int = 4,
    ) -> None:
        self.admin_url = database_url
        self.redis_url = redis_url
        self.root = root
        self.configs = web_workers
        self.web_workers = web_workers[0]
        self.web_server = web_server
        self.conn_max_age = conn_max_age
        self.pool_max_size = pool_max_size
        self.agent_sandbox = agent_sandbox
        self.group_commit = group_commit
        self.agent_db_threads = agent_db_threads
        base = urlsplit(database_url).path.lstrip("/") or "gpupool"
        self.db_name = f"{base}_vs_slurm"
        self.cluster: ServedCluster | None = None
        self.deadlocks_before = 0

    def describe(self) -> str:
        workers = " and ".join(str(count) for count in self.configs)
        return (
            f"gpupool: PostgreSQL (scratch db {self.db_name}), Redis {self.redis_url}, gpupool serve --server "
            f"{self.web_server} --workers {workers} (GPUPOOL_DB_POOL_MAX_SIZE={self.pool_max_size}, "
            f"GPUPOOL_DB_CONN_MAX_AGE={self.conn_max_age}, GPUPOOL_GROUP_COMMIT={int(self.group_commit)}, "
            f"GPUPOOL_AGENT_DB_THREADS={self.agent_db_threads}), "
            f"celery worker (solo) + beat, {AGENTS} gpupool-agent --backend simulated x {CARDS_PER_AGENT} cards "
            f"--sandbox {self.agent_sandbox}"
        )

    def label(self, workers: int) -> str:
        return f"gpupool {workers} web"

    def configure(self, workers: int) -> None:
        """Run the web tier with ``workers`` processes (restarted if it runs with another count); the agents
        reconnect on their own (the warm-up batch after this waits for them)."""
        assert self.cluster is not None
        if workers == self.web_workers and self.cluster.web is not None and self.cluster.web.alive():
            return
        self.cluster.web.kill(signal.SIGTERM, wait_s=30)
        self.web_workers = self.cluster.web_workers = workers
        self.cluster.start_web()
        self.cluster.wait_web()

    def start(self) -> None:
        from recovery import scratch_database  # benchmarks/ is on sys.path when a script runs

        self.database_url = scratch_database(self.admin_url, self.db_name, create=True)
        run_id = uuid.uuid4().hex[:12]
        # This process reads and writes the same database and asks for cycles through the same Redis.
        os.environ["GPUPOOL_REDIS_URL"] = self.redis_url
        os.environ["GPUPOOL_CHANNELS_PREFIX"] = f"gpupool-{run_id}"
        setup_django(self.database_url, str(self.root / "bench"))
        self.cluster = ServedCluster(
            database_url=self.database_url,
            redis_url=self.redis_url,
            root=self.root / "cluster",
            settings=production_timings(),
            run_id=run_id,
            web_workers=self.web_workers,
            web_server=self.web_server,
            agent_sandbox=self.agent_sandbox,
            web_settings={
                "GPUPOOL_DB_CONN_MAX_AGE": str(self.conn_max_age),
                "GPUPOOL_DB_POOL_MAX_SIZE": str(self.pool_max_size),
                "GPUPOOL_GROUP_COMMIT": "1" if self.group_commit else "0",
                "GPUPOOL_AGENT_DB_THREADS": str(self.agent_db_threads),
            },
        )
        self.cluster.seed(slug="vs-slurm", cards=GPUS)
        self.cluster.start(agents=0)
        for index in range(AGENTS):
            self.cluster.add_agent(f"bench-{index}-{run_id[:6]}", cards=CARDS_PER_AGENT, seed=index)
        self.cluster.wait_nodes_ready(list(self.cluster.agents), timeout_s=120)
        self.cycle_events = CycleEvents()
        self.cycle_events.start()
        self.deadlocks_before = self.pg_stat()["deadlocks"]

    def stop(self) -> None:
        from django.db import connections
        from recovery import scratch_database

        if getattr(self, "cycle_events", None) is not None:
            self.cycle_events.stop()
        if self.cluster is not None:
            self.cluster.stop()
        connections.close_all()
        with contextlib.suppress(Exception):
            scratch_database(self.admin_url, self.db_name, create=False)

    def spec(self, name: str) -> dict:
        from tests.resilience.cluster import FLAVOR, RUN_ENV

        assert self.cluster is not None
        return {
            "name": name,
            "tenant": self.cluster.tenant_slug,
            "kind": "batch",
            "priority_class": "normal",
            "resources": {"flavors": [FLAVOR], "gpus": 1},
            "command": ["true"],
            # Marks the workloads as this run's, so the harness's stop finds any left behind.
            "env": {RUN_ENV: self.cluster.run_id},
        }

    def submit(self, phase: Phase, *, jobs: int, clients: int, tag: str) -> None:
        asyncio.run(self._submit(phase, jobs=jobs, clients=clients, tag=tag))

    async def _submit(self, phase: Phase, *, jobs: int, clients: int, tag: str) -> None:
        assert self.cluster is not None
        headers = {"Authorization": f"Bearer {self.cluster.token}", "Content-Type": "application/json"}
        numbers = iter(range(jobs))

        async def client() -> None:
            connection = HttpConnection("127.0.0.1", self.cluster.port)
            try:
                for number in numbers:
                    body = json.dumps(self.spec(f"{tag}-{number}")).encode()
                    sent = time.perf_counter()
                    try:
                        status, content = await connection.request("POST", "/api/v1/jobs/", headers=headers, body=body)
                    except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                        phase.errors.append(repr(exc))
                        phase.statuses[0] += 1
                        await connection.close()
                        continue
                    phase.latencies.append(time.perf_counter() - sent)
                    phase.statuses[status] += 1
                    if status == 201:
                        phase.ids.append(json.loads(content)["id"])
                    elif len(phase.errors) < 5:
                        phase.errors.append(f"{status}: {content[:300]!r}")
            finally:
                await connection.close()

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        phase.seconds = time.perf_counter() - started

    def unfinished(self, ids: list) -> tuple[int, str]:
        from scheduler.models import FINAL_JOB_STATES, Job

        left = Job.objects.filter(pk__in=ids).exclude(state__in=FINAL_JOB_STATES)
        count = left.count()
        if not count:
            failed = Job.objects.filter(pk__in=ids).exclude(state="succeeded").count()
            return 0, f"{failed} did not succeed" if failed else ""
        states = Counter(left.values_list("state", flat=True))
        return count, ", ".join(f"{state} {n}" for state, n in states.most_common())

    def job_timings(self, ids: list) -> str:
        """Medians of each step of the phase's jobs' lives (the database's timestamps)."""
        from scheduler.models import Job

        rows = list(
            Job.objects.filter(pk__in=ids, finished_at__isnull=False).values_list(
                "submitted_at", "admitted_at", "started_at", "finished_at"
            )
        )
        steps = {"submitted→admitted": (0, 1), "admitted→running": (1, 2), "running→finished": (2, 3)}
        parts = []
        for label, (a, b) in steps.items():
            values = [(row[b] - row[a]).total_seconds() for row in rows if row[a] and row[b]]
            if values:
                parts.append(f"{label} p50 {ms(statistics.median(values))} p99 {ms(percentile(values, 0.99))}")
        reaction = self.scheduler_reaction(ids)
        if reaction:
            parts.append(
                f"card free and job waiting→admitted p50 {ms(statistics.median(reaction))} "
                f"p99 {ms(percentile(reaction, 0.99))}"
            )
        return "; ".join(parts) or "no finished job with timestamps"

    def scheduler_reaction(self, ids: list) -> list[float]:
        """For each allocation of the phase's jobs: from the moment both its card was free (the card's previous
        allocation ended) and its job was there (submitted) until the allocation was made — the scheduler's own
        delay, apart from the time a job queued behind the others for a card (submitted→admitted counts both).
        A cycle stamps its allocations with the moment it began, so a card freed while the cycle read the pool
        counts 0, and the cycle's own length (the cycles line) comes on top of these figures."""
        from django.db import connection

        from scheduler.models import Allocation, Job

        sql = f"""
            SELECT EXTRACT(EPOCH FROM a.started_at - GREATEST(j.submitted_at, a.previous_end))
            FROM (SELECT job_id, started_at,
                         LAG(ended_at) OVER (PARTITION BY device_id ORDER BY started_at) AS previous_end
                  FROM {Allocation._meta.db_table}) a
            JOIN {Job._meta.db_table} j ON j.id = a.job_id
            WHERE a.job_id = ANY(%s)
        """
        with connection.cursor() as cursor:
            cursor.execute(sql, [list(ids)])
            return [max(0.0, float(value)) for (value,) in cursor.fetchall() if value is not None]

    def server_errors(self, limit: int = 5) -> list[str]:
        """The exceptions behind the web tier's 5xx answers (last line of each traceback in its log), counted."""
        assert self.cluster is not None
        try:
            lines = (self.cluster.root / "logs" / "web.log").read_text(errors="replace").splitlines()
        except OSError:
            return []
        # The exception lines of the tracebacks (chained ones too: a cause and what it became).
        exception = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Timeout|Deadlock\w*)\b(:|$)")
        found = Counter(line[:300] for line in lines if exception.match(line))
        return [f"{count}x {text}" for text, count in found.most_common(limit)]

    def array(self, count: int) -> ArrayResult:
        assert self.cluster is not None
        spec = {**self.spec("array"), "array": {"count": count}}
        started = time.perf_counter()
        status, body = self.cluster.api("/api/v1/jobs/", spec, timeout_s=600)
        seconds = time.perf_counter() - started
        if status == 201 and body.get("count") == count:
            # Not run: cancelled (as Slurm's is) so the next array and the daemons' stop do not wait on it.
            self.cluster.api(f"/api/v1/jobs/arrays/{body['array_id']}/cancel/", {"reason": "benchmark"}, timeout_s=600)
            return ArrayResult(available=True, count=count, seconds=seconds)
        note = f"HTTP {status}: {json.dumps(body)[:200]}"
        if status == 201:
            note = "the server ignored 'array' (it made one job)"
        return ArrayResult(available=False, count=count, seconds=seconds, note=note)

    def process_groups(self) -> dict[str, list[int]]:
        assert self.cluster is not None
        groups = self.cluster.process_groups()
        needle = f" {self.db_name} ".encode()
        backends = pids_matching(lambda cmdline: cmdline.startswith(b"postgres:") and needle in cmdline)
        groups["postgres (this db's backends that a 1 s sampler saw)"] = backends
        groups["redis-server (shared)"] = pids_matching(lambda c: c.startswith(b"redis-server"))
        groups["benchmark client"] = [os.getpid()]
        return groups

    def pg_stat(self) -> dict[str, int]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT deadlocks, xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s",
                [self.db_name],
            )
            deadlocks, commits, rollbacks = cursor.fetchone()
        return {"deadlocks": deadlocks, "xacts": commits + rollbacks}

    def submit_profile(self, samples: int = 10) -> list[str]:
        """One submit served in this process (Django's test client, no HTTP server): SQL statements and time."""
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        assert self.cluster is not None
        client = Client(HTTP_HOST="127.0.0.1")
        headers = {"HTTP_AUTHORIZATION": f"Bearer {self.cluster.token}"}
        counts, times, verbs = [], [], Counter()
        for number in range(samples + 1):
            body = json.dumps(self.spec(f"profile-{number}"))
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.post("/api/v1/jobs/", body, content_type="application/json", **headers)
                elapsed = time.perf_counter() - started
            if response.status_code != 201:
                return [f"in-process submit answered {response.status_code}: {response.content[:200]!r}"]
            if number == 0:
                continue  # the first pays for imports and connections
            counts.append(len(queries))
            times.append(elapsed)
            verbs.update(query["sql"].split(None, 1)[0].upper() for query in queries.captured_queries)
        per_submit = ", ".join(f"{verb} {n / samples:.1f}" for verb, n in verbs.most_common())
        return [
            f"one submit in-process (no HTTP, no ASGI): median {1000 * statistics.median(times):.1f} ms, "
            f"{statistics.median(counts):.0f} SQL statements in the request's thread ({per_submit}; its writes run "
            "in the group committer's thread, not counted here)"
        ]


# --- Slurm ------------------------------------------------------------------------------------------------------

SLURM_DAEMON_TIMEOUT_S = 60


def slurm_installed() -> str | None:
    """Why Slurm cannot run here, or None when it can."""
    missing = [
        tool for tool in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel") if not shutil.which(tool)
    ]
    if missing:
        return f"not installed ({', '.join(missing)} missing; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "needs root (mknod of the fake GPU devices, slurmd)"
    return None


class Slurm:
    name = "Slurm"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = "bench0"
        self.procs: dict[str, subprocess.Popen] = {}
        self.jobcomp = root / "jobcomp.txt"
        self._jobcomp_offset = 0
        self._ended: dict[str, str] = {}

    def describe(self) -> str:
        version = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, timeout=30).stdout.strip()
        return (
            f"Slurm: {version}, one node with {GPUS} GPUs (gres, fake devices), select/cons_tres, default "
            f"scheduler settings, jobs unconfined (proctrack/pgid, task/none), MaxArraySize/MaxJobCount raised "
            f"for the array, config in {self.root}"
        )

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}

    configs = [0]

    def label(self, _config: int) -> str:
        return "Slurm"

    def configure(self, _config: int) -> None:
        pass

    def start(self) -> None:
        from benchmarks._agents import free_port

        root = self.root
        for folder in ("state", "spool", "dev", "log", "work"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = root / "munge.socket"
        self._spawn(
            "munged",
            [
                *("munged", "--foreground", "--force", f"--key-file={key}", f"--socket={socket_path}"),
                *(f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'log' / 'munged.log'}"),
                f"--seed-file={root / 'munged.seed'}",
            ],
        )
        self._wait(lambda: socket_path.exists(), "munged's socket")
        for index in range(GPUS):
            device = root / "dev" / f"nvidia{index}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, like /dev/null
        hostname = os.uname().nodename.split(".")[0]
        (root / "gres.conf").write_text(f"NodeName={self.node} Name=gpu File={root / 'dev'}/nvidia[0-{GPUS - 1}]\n")
        (root / "slurm.conf").write_text(
            "\n".join(
                [
                    "ClusterName=bench",
                    f"SlurmctldHost={hostname}(127.0.0.1)",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={socket_path}",
                    f"StateSaveLocation={root / 'state'}",
                    f"SlurmdSpoolDir={root / 'spool'}",
                    f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={root / 'slurmd.pid'}",
                    f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/pgid",
                    "TaskPlugin=task/none",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    "ReturnToService=2",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "GresTypes=gpu",
                    "SlurmdParameters=config_overrides",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/filetxt",
                    f"JobCompLoc={self.jobcomp}",
                    # Defaults are 1,001 and 10,000: too few for the array of 10,000.
                    "MaxArraySize=100001",
                    "MaxJobCount=200000",
                    f"NodeName={self.node} NodeHostname={hostname} NodeAddr=127.0.0.1 CPUs=64 RealMemory=512000 "
                    f"Gres=gpu:{GPUS} State=UNKNOWN",
                    f"PartitionName=bench Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(root / "slurm.conf")])
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.node, "-f", str(root / "slurm.conf")])

        def idle() -> bool:
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%T %G"], env=self.env, capture_output=True, text=True, timeout=10
            )
            return out.returncode == 0 and out.stdout.startswith("idle") and f"gpu:{GPUS}" in out.stdout

        self._wait(idle, f"the Slurm node idle with gpu:{GPUS}")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(
            argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.root
        )
        log.close()

    def _wait(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + SLURM_DAEMON_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {self.log_tail(name)}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                if predicate():
                    return
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {SLURM_DAEMON_TIMEOUT_S} s waiting for {what}: {self.log_tail()}")

    def log_tail(self, name: str | None = None) -> str:
        names = [name] if name else list(self.procs)
        lines = []
        for each in names:
            for path in (self.root / "log" / f"{each}.out", self.root / "log" / f"{each}.log"):
                with contextlib.suppress(OSError):
                    lines.append(f"--- {path.name}: " + " | ".join(path.read_text(errors="replace").splitlines()[-8:]))
        return "\n".join(lines)

    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                subprocess.run(["scancel", "--user", "root"], env=self.env, capture_output=True, timeout=30)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    out = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, timeout=10)
                    if not out.stdout.strip():
                        break
                    time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def sbatch(self, extra: list[str]) -> tuple[int, str]:
        out = subprocess.run(
            ["sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "-D", str(self.root / "work"), *extra],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            return out.returncode, out.stderr.strip()[:300]
        return 0, out.stdout.strip().split(";")[0]

    def submit(self, phase: Phase, *, jobs: int, clients: int, tag: str) -> None:
        lock = threading.Lock()
        numbers = iter(range(jobs))

        def client() -> None:
            while True:
                with lock:
                    number = next(numbers, None)
                if number is None:
                    return
                sent = time.perf_counter()
                code, answer = self.sbatch(["-J", f"{tag}-{number}", "--wrap", "true"])
                elapsed = time.perf_counter() - sent
                with lock:
                    phase.latencies.append(elapsed)
                    phase.statuses["ok" if code == 0 else f"exit {code}"] += 1
                    if code == 0:
                        phase.ids.append(answer)
                    elif len(phase.errors) < 5:
                        phase.errors.append(answer)

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=clients) as pool:
            for future in [pool.submit(client) for _ in range(clients)]:
                future.result()
        phase.seconds = time.perf_counter() - started

    def _read_jobcomp(self) -> None:
        try:
            with open(self.jobcomp, "rb") as log:
                log.seek(self._jobcomp_offset)
                chunk = log.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1
        self._jobcomp_offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
            if "JobId" in fields:
                self._ended[fields["JobId"]] = fields.get("JobState", "?")

    def unfinished(self, ids: list) -> tuple[int, str]:
        self._read_jobcomp()
        left = [job for job in ids if job not in self._ended]
        if not left:
            failed = sum(1 for job in ids if self._ended[job] != "COMPLETED")
            return 0, f"{failed} did not complete" if failed else ""
        return len(left), f"{len(left)} not in the jobcomp log yet"

    def array(self, count: int) -> ArrayResult:
        started = time.perf_counter()
        try:
            code, answer = self.sbatch(["-J", "array", f"--array=0-{count - 1}", "--wrap", "true"])
        except subprocess.TimeoutExpired:
            seconds = time.perf_counter() - started
            return ArrayResult(
                available=False, count=count, seconds=seconds, note=f"sbatch: no answer in {seconds:.0f} s"
            )
        seconds = time.perf_counter() - started
        if code != 0:
            return ArrayResult(available=False, count=count, seconds=seconds, note=answer)
        # Not waited for: cancelled so it does not hold the node while the daemons stop; the next array waits until
        # slurmctld has taken the cancel in (a large one took minutes to answer behind an unfinished cancel).
        subprocess.run(["scancel", "--full", answer], env=self.env, capture_output=True, timeout=60)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            left = subprocess.run(
                ["squeue", "-h", "-r", "-j", answer, "-o", "%i"], env=self.env, capture_output=True, text=True
            )
            if left.returncode != 0 or not left.stdout.strip():
                break
            time.sleep(0.5)
        return ArrayResult(available=True, count=count, seconds=seconds)

    def process_groups(self) -> dict[str, list[int]]:
        groups = {name: descendants(proc.pid) for name, proc in self.procs.items() if proc.poll() is None}
        groups["benchmark client (incl. sbatch processes)"] = [os.getpid()]
        return groups


# --- one round ---------------------------------------------------------------------------------------------------


def run_phase(system, *, jobs: int, clients: int, tag: str, finish_timeout_s: float) -> Phase:
    phase = Phase(jobs=jobs, load=os.getloadavg()[0])
    meter = CpuMeter(system.process_groups)
    meter.sample()
    busy_before, total_before = machine_cpu()
    gpupool = isinstance(system, Gpupool)
    if gpupool:
        xacts_before = system.pg_stat()["xacts"]
    stop_sampling = threading.Event()

    def sampler() -> None:  # short-lived processes (postgres backends, agents' children) are caught as they go
        while not stop_sampling.wait(1.0):
            meter.sample()

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    first_submit, wall_start = time.perf_counter(), time.time()
    try:
        system.submit(phase, jobs=jobs, clients=clients, tag=tag)
        deadline = time.perf_counter() + finish_timeout_s
        while True:
            left, note = system.unfinished(phase.ids)
            if not left:
                phase.finished_s = time.perf_counter() - first_submit
                phase.not_finished = note
                break
            if time.perf_counter() > deadline:
                phase.not_finished = f"{left} of {len(phase.ids)} not finished after {finish_timeout_s:.0f} s: {note}"
                break
            time.sleep(POLL_S)
    finally:
        stop_sampling.set()
        thread.join()
    meter.sample()
    phase.cpu = meter.totals()
    busy_after, total_after = machine_cpu()
    phase.machine_busy_pct = 100 * (busy_after - busy_before) / max(1e-9, total_after - total_before)
    if gpupool:
        time.sleep(1.0)  # PostgreSQL publishes its counters about once a second
        phase.xacts = system.pg_stat()["xacts"] - xacts_before
        phase.cycles = system.cycle_events.between(wall_start, time.time())
        phase.requested = system.cycle_events.requested_between(wall_start, time.time())
        phase.steps = system.job_timings(phase.ids)
    return phase


def wait_drained(system, ids: list, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while system.unfinished(ids)[0] and time.monotonic() < deadline:
        time.sleep(POLL_S)


# --- report ---------------------------------------------------------------------------------------------------


def ms(value: float) -> str:
    return f"{1000 * value:.1f} ms"


def phase_line(label: str, phase: Phase) -> str:
    finished = f"{phase.finished_s:.1f} s" if phase.finished_s is not None else "NOT ALL"
    extra = f" ({phase.not_finished})" if phase.not_finished else ""
    errors = f", errors {dict(phase.statuses)} {phase.errors[:2]}" if phase.errors else ""
    return (
        f"    {label:<10} {len(phase.ids):>5} jobs in {phase.seconds:6.1f} s = {phase.rate:7.1f} jobs/s  "
        f"p50 {ms(statistics.median(phase.latencies)) if phase.latencies else '-':>9}  "
        f"p99 {ms(percentile(phase.latencies, 0.99)):>9}   first submit → all finished {finished}{extra}  "
        f"[load {phase.load:.1f}, machine CPU busy {phase.machine_busy_pct:.0f} %]{errors}"
    )


@dataclass
class SystemResult:
    label: str
    kind: str  # "gpupool" or "Slurm"
    rounds: list[tuple[Phase, Phase]] = field(default_factory=list)
    array: ArrayResult | None = None
    #: Per array size: the median of ``--rounds`` submits (each cancelled after it was timed).
    arrays: dict[int, ArrayResult] = field(default_factory=dict)
    skipped: str = ""

    def median(self, which: int, metric: Callable[[Phase], float | None]) -> float | None:
        values = [metric(pair[which]) for pair in self.rounds]
        values = [value for value in values if value is not None]
        return statistics.median(values) if values else None

    def server_errors(self) -> int:
        return sum(phase.server_errors for pair in self.rounds for phase in pair)


def p50(phase: Phase) -> float | None:
    return statistics.median(phase.latencies) if phase.latencies else None


def p99(phase: Phase) -> float | None:
    return percentile(phase.latencies, 0.99) if phase.latencies else None


#: label, phase (0: one client, 1: N clients), metric, unit, higher is better, a target row
METRICS: list[tuple[str, int, Callable[[Phase], float | None], str, bool, bool]] = [
    ("serial submit rate", 0, lambda phase: phase.rate, "jobs/s", True, True),
    ("serial submit p50", 0, p50, "ms", False, False),
    ("serial submit p99", 0, p99, "ms", False, False),
    ("N-client submit rate", 1, lambda phase: phase.rate, "jobs/s", True, True),
    ("N-client submit p50", 1, p50, "ms", False, False),
    ("N-client submit p99", 1, p99, "ms", False, False),
    ("serial: first submit → all finished", 0, lambda phase: phase.finished_s, "s", False, True),
    ("N-client: first submit → all finished", 1, lambda phase: phase.finished_s, "s", False, True),
]


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{1000 * value:.1f} ms"
    if unit == "s":
        return f"{value:.1f} s"
    return f"{value:.1f} {unit}"


def better(a: float | None, b: float | None, higher: bool) -> str:
    """How many times ``a`` is better than ``b``."""
    if not a or not b:
        return "-"
    return f"{(a / b if higher else b / a):.2f}x"


def print_table(results: list[SystemResult], *, clients: int, jobs: int, array: int) -> None:
    shown = [result for result in results if result.rounds]
    slurm = next((result for result in shown if result.kind == "Slurm"), None)
    ours = [result for result in shown if result.kind == "gpupool"]
    rounds = max((len(result.rounds) for result in shown), default=0)
    print(f"\n== medians of {rounds} round(s), {jobs} jobs per phase, {clients} clients in the second")
    header = [result.label for result in shown]
    if slurm is not None:
        header += [f"{result.label.removeprefix('gpupool ')} ÷ Slurm" for result in ours]
    print(f"  {'':<38}" + "".join(f"{name:>16}" for name in header))
    for label, which, metric, unit, higher, _target in METRICS:
        cells = [fmt(result.median(which, metric), unit) for result in shown]
        if slurm is not None:
            cells += [better(result.median(which, metric), slurm.median(which, metric), higher) for result in ours]
        print(f"  {label.replace('N-client', f'{clients}-client'):<38}" + "".join(f"{cell:>16}" for cell in cells))
    for count in sorted({count for result in shown for count in result.arrays}):
        cells = []
        for result in shown:
            array = result.arrays.get(count)
            cells.append("-" if array is None else f"{array.seconds:.3f} s" if array.available else "not available")
        if slurm is not None:
            for result in ours:
                a, b = result.arrays.get(count), slurm.arrays.get(count)
                ok = a and b and a.available and b.available and a.seconds
                cells.append(f"{b.seconds / a.seconds:.2f}x" if ok else "-")
        print(f"  {f'array submit of {count:,}':<38}" + "".join(f"{cell:>16}" for cell in cells))
    if slurm is not None:
        print("  (X ÷ Slurm: how many times gpupool's figure is better than Slurm's; below 1: Slurm is better)")
    for result in results:
        if result.skipped:
            print(f"  {result.label}: {result.skipped}")
        for array in result.arrays.values():
            if array.note:
                print(f"  {result.label} array of {array.count:,}: {array.note}")


def check_targets(results: list[SystemResult], deadlocks: int | None) -> list[str]:
    """Issue 14's targets that this run missed, for each gpupool configuration."""
    slurm = next((result for result in results if result.kind == "Slurm" and result.rounds), None)
    missed = []
    for result in (result for result in results if result.kind == "gpupool" and result.rounds):
        name = result.label
        serial = result.median(0, lambda phase: phase.rate) or 0.0
        parallel = result.median(1, lambda phase: phase.rate) or 0.0
        if serial < SERIAL_TARGET_PER_S:
            missed.append(f"{name}: serial submit {serial:.1f} jobs/s < {SERIAL_TARGET_PER_S:.0f}")
        if parallel < CLIENTS_TARGET_PER_S:
            missed.append(f"{name}: N-client submit {parallel:.1f} jobs/s < {CLIENTS_TARGET_PER_S:.0f}")
        for label, which, metric, _unit, higher, target in METRICS:
            a = result.median(which, metric)
            if target and a is None and "finished" in label:
                missed.append(f"{name}: {label}: not every job finished")
            b = slurm.median(which, metric) if slurm else None
            if not target or a is None or b is None:
                continue
            if (a < b) if higher else (a > b):
                missed.append(f"{name}: {label} {a:.2f} vs Slurm {b:.2f}")
        # Issue 35's: an array of 10,000 in <= 0.05 s and <= 5x Slurm's time, one of 100,000 in <= 0.5 s; the submit
        # rates at least half of Slurm's.
        for count, limit_s in ((10_000, 0.05), (100_000, 0.5)):
            array = result.arrays.get(count)
            if array is None:
                continue
            if not array.available:
                missed.append(f"{name}: array submit of {count:,} not available")
                continue
            if array.seconds > limit_s:
                missed.append(f"{name}: array of {count:,} {array.seconds:.3f} s > {limit_s} s")
            theirs = slurm.arrays.get(count) if slurm else None
            if theirs and theirs.available and array.seconds > 5 * theirs.seconds:
                missed.append(f"{name}: array of {count:,} {array.seconds:.3f} s > 5x Slurm's {theirs.seconds:.3f} s")
        if slurm is not None:
            for which, label in ((0, "serial"), (1, "N-client")):
                ours_rate = result.median(which, lambda phase: phase.rate) or 0.0
                theirs_rate = slurm.median(which, lambda phase: phase.rate) or 0.0
                if theirs_rate and ours_rate < 0.5 * theirs_rate:
                    missed.append(f"{name}: {label} submit {ours_rate:.1f} jobs/s < 0.5x Slurm's {theirs_rate:.1f}")
        if result.server_errors():
            missed.append(f"{name}: {result.server_errors()} HTTP 5xx")
    if deadlocks:
        missed.append(f"gpupool: {deadlocks} deadlocks in PostgreSQL")
    return missed


def where_the_time_goes(results: list[SystemResult], profile: list[str]) -> None:
    print("\n== where gpupool's time goes")
    for line in profile:
        print(f"  {line}")
    for result in (result for result in results if result.kind == "gpupool" and result.rounds):
        for label, which in (("serial", 0), ("N clients", 1)):
            phase = result.rounds[-1][which]
            jobs = max(1, len(phase.ids))
            print(
                f"  {result.label}, {label} (last round): HTTP p50 {fmt(p50(phase), 'ms')} per submit; "
                f"{phase.xacts / jobs:.1f} PostgreSQL transactions per job (submit to finish, every process)"
            )
            by_cpu = sorted(phase.cpu.items(), key=lambda item: -item[1])
            cpu = ", ".join(f"{name} {1000 * seconds / jobs:.1f}" for name, seconds in by_cpu)
            print(f"    CPU ms per job: {cpu}  (the whole machine was {phase.machine_busy_pct:.0f} % busy)")
            print(f"    job steps: {phase.steps}")
            if phase.requested:
                print(
                    f"    cycles asked for by submits and finishes: {sum(t.cycles for t in phase.requested)} in "
                    f"{len(phase.requested)} cycle_requested tasks, {sum(t.seconds for t in phase.requested):.1f} s "
                    "in all"
                )
            ran = [cycle for cycle in phase.cycles if cycle.ran]
            if not ran:
                print("    beat's scheduling cycles: none reported by the worker")
                continue
            times = [cycle.seconds for cycle in ran]
            placed = [cycle.placed for cycle in ran if cycle.placed is not None]
            placements = f", placed median {statistics.median(placed):.0f} / max {max(placed)} jobs" if placed else ""
            print(
                f"    beat's scheduling cycles: {len(ran)} ran ({len(phase.cycles) - len(ran)} found the lock taken), "
                f"median {ms(statistics.median(times))}, max {ms(max(times))}, {sum(times):.1f} s in all{placements}"
            )


def run_system(system, args: argparse.Namespace) -> list[SystemResult]:
    """Start ``system``; per round and per configuration (gpupool: web process counts), a warm-up batch, then
    the serial and the N-client phase; then the array with the last configuration; stop is the caller's."""
    results = {config: SystemResult(label=system.label(config), kind=system.name) for config in system.configs}
    print(f"\n== {system.describe()}", flush=True)
    started = time.monotonic()
    system.start()
    print(f"  started in {time.monotonic() - started:.0f} s", flush=True)
    for number in range(args.rounds):
        for config, result in results.items():
            system.configure(config)
            warm = Phase()
            system.submit(warm, jobs=args.clients, clients=args.clients, tag=f"warmup-{number}-{config}")
            wait_drained(system, warm.ids, args.finish_timeout)
            tag = f"r{number}-{config}"
            timeout = args.finish_timeout
            serial = run_phase(system, jobs=args.jobs, clients=1, tag=f"{tag}-serial", finish_timeout_s=timeout)
            print(f"  round {number + 1}, {result.label}:\n{phase_line('serial', serial)}", flush=True)
            wait_drained(system, serial.ids, timeout)
            clients = run_phase(
                system, jobs=args.jobs, clients=args.clients, tag=f"{tag}-clients", finish_timeout_s=timeout
            )
            print(phase_line(f"{args.clients} clients", clients), flush=True)
            wait_drained(system, clients.ids, timeout)
            result.rounds.append((serial, clients))
    if args.array:
        last = results[system.configs[-1]]
        for count in sorted({args.array, args.array_large} - {0}):
            tries = [system.array(count) for _ in range(args.rounds)]
            seconds = [t.seconds for t in tries]
            last.arrays[count] = array = ArrayResult(
                available=all(t.available for t in tries),
                count=count,
                seconds=statistics.median(seconds),
                note="; ".join(sorted({t.note for t in tries if t.note})),
            )
            each = " / ".join(f"{value:.3f}" for value in seconds)
            state = f"median {array.seconds:.3f} s ({each} s)" if array.available else ""
            print(f"  array of {count:,} ({last.label}): {state or 'not available'} {array.note}", flush=True)
        last.array = last.arrays.get(args.array)
    return list(results.values())


def parse_counts(raw: str) -> list[int]:
    counts = [int(item) for item in raw.split(",") if item.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--web-workers {raw!r}: give one or more counts >= 1, e.g. 1,2")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per phase (serial, then N clients)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients of the second phase")
    parser.add_argument("--array", type=int, default=10000, help="tasks in the array submit (0: skip arrays)")
    parser.add_argument(
        "--array-large", type=int, default=100000, help="tasks in the second, larger array submit (0: skip it)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both phases per system (medians printed)")
    parser.add_argument("--quick", action="store_true", help="200 jobs, arrays of 1,000 and 10,000, one round")
    parser.add_argument("--systems", default="gpupool,slurm", help="comma-separated: gpupool, slurm")
    parser.add_argument(
        "--web-workers",
        type=parse_counts,
        default=[max(2, os.cpu_count() or 1)],
        help="gpupool web processes; several counts (e.g. 1,2) alternate within each round on the same stack",
    )
    parser.add_argument(
        "--web-server", choices=["uvicorn", "daphne"], default="uvicorn", help="daphne: one process (--web-workers 1)"
    )
    parser.add_argument(
        "--db-conn-max-age",
        type=int,
        default=0,
        help="GPUPOOL_DB_CONN_MAX_AGE of the web processes, used only with --db-pool-max-size 0 (0: a connection "
        "per request; under ASGI a longer age leaves one idle connection per finished request's thread)",
    )
    parser.add_argument(
        "--group-commit",
        choices=["on", "off"],
        default="on",
        help="GPUPOOL_GROUP_COMMIT of the web processes (on, the shipped setting: concurrent submits share a "
        "transaction; off: a transaction per submit)",
    )
    parser.add_argument(
        "--agent-db-threads",
        type=int,
        default=4,
        help="GPUPOOL_AGENT_DB_THREADS of the web processes (default 4, the shipped setting: the agent sockets' "
        "database work on 4 threads per process, a node always on the same one; 0: all on one thread)",
    )
    parser.add_argument(
        "--db-pool-max-size",
        type=int,
        default=10,
        help="GPUPOOL_DB_POOL_MAX_SIZE of the web processes (default 10, the shipped setting: a pool of connections "
        "per process; 0: no pool, a connection per request unless --db-conn-max-age)",
    )
    parser.add_argument(
        "--agent-sandbox",
        choices=["namespaces", "none"],
        default="namespaces",
        help="how gpupool's agents confine each job (namespaces: the production default; Slurm here runs jobs "
        "unconfined, proctrack/pgid and task/none, so 'none' compares like with like)",
    )
    parser.add_argument("--finish-timeout", type=float, default=900.0, help="seconds to wait for a phase's jobs")
    parser.add_argument("--database-url", default=os.environ.get("GPUPOOL_DATABASE_URL", ""))
    parser.add_argument("--redis-url", default=os.environ.get("GPUPOOL_REDIS_URL", ""))
    parser.add_argument("--explain", action="store_true", help="print where gpupool's time goes even if on target")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.array, args.array_large, args.rounds = 200, 1000, 10000, 1
    systems = [name.strip().lower() for name in args.systems.split(",") if name.strip()]
    if "gpupool" in systems and (not args.database_url.startswith("postgres") or not args.redis_url):
        parser.error("gpupool runs on PostgreSQL and Redis: give --database-url/GPUPOOL_DATABASE_URL and --redis-url")
    if args.web_server == "daphne" and args.web_workers != [1]:
        parser.error("daphne serves from one process: --web-server daphne --web-workers 1")

    print("command:", " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]))
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    now = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    print(f"machine: {os.cpu_count()} CPUs, load average {load} (1, 5, 15 min); {now}")
    print(
        f"workload: {args.rounds} round(s) of {args.jobs} trivial 1-GPU jobs (`true`) from 1 client, then from "
        f"{args.clients} clients; then an array of {args.array:,}; {GPUS} GPUs"
    )
    results: list[SystemResult] = []
    root = Path(tempfile.mkdtemp(prefix="gpupool-vs-slurm-"))
    profile: list[str] = []
    deadlocks: int | None = None
    try:
        if "slurm" in systems:
            why_not = slurm_installed()
            if why_not:
                results.append(SystemResult(label="Slurm", kind="Slurm", skipped=why_not))
                print(f"\n== Slurm: {why_not}")
            else:
                slurm = Slurm(root / "slurm")
                try:
                    results.extend(run_system(slurm, args))
                finally:
                    slurm.stop()
        if "gpupool" in systems:
            gpupool = Gpupool(
                database_url=args.database_url,
                redis_url=args.redis_url,
                root=root / "gpupool",
                web_workers=args.web_workers,
                web_server=args.web_server,
                conn_max_age=args.db_conn_max_age,
                pool_max_size=args.db_pool_max_size,
                group_commit=args.group_commit == "on",
                agent_db_threads=args.agent_db_threads,
                agent_sandbox=args.agent_sandbox,
            )
            try:
                results.extend(run_system(gpupool, args))
                time.sleep(1.0)  # PostgreSQL publishes its counters about once a second
                deadlocks = gpupool.pg_stat()["deadlocks"] - gpupool.deadlocks_before
                if any(result.server_errors() for result in results if result.kind == "gpupool"):
                    errors = gpupool.server_errors()
                    print("\n== exceptions behind the HTTP 5xx (web log):\n  " + "\n  ".join(errors or ["none logged"]))
                if check_targets(results, deadlocks) or args.explain:
                    profile = gpupool.submit_profile()  # while the stack still runs
            finally:
                gpupool.stop()
        print_table(results, clients=args.clients, jobs=args.jobs, array=args.array)
        if deadlocks is not None:
            errors = sum(result.server_errors() for result in results if result.kind == "gpupool")
            print(f"  gpupool: {deadlocks} deadlocks counted by PostgreSQL during the run; HTTP 5xx: {errors}")
        if profile:
            where_the_time_goes(results, profile)
        missed = check_targets(results, deadlocks)
        print("\n== targets missed: " + ("; ".join(missed) if missed else "none"))
        return 0
    finally:
        if os.environ.get("GPUPOOL_BENCH_KEEP"):
            print(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
