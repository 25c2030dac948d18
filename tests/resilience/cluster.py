"""A real gpupool deployment made of processes, for the fault tests and ``benchmarks/recovery.py``.

``Cluster`` starts what production runs — daphne (ASGI web + agent WebSockets), ``celery -A portal worker``,
``celery -A portal beat`` and ``gpupool-agent run --backend simulated`` per node — on free ports, against a
given PostgreSQL database and Redis, with short heartbeat / lease / grace settings passed the way an operator
passes them (environment variables). Every process runs in its own session so a test can SIGKILL exactly one of
them; :meth:`Cluster.stop` ends them all, workloads included.

The caller's process must have Django set up on the same database: tenants, bootstrap tokens and the checks
read and write it directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.nodeagent.sandboxing import WORKLOAD_PYTHON, sandbox_args

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
WORKLOAD = Path(__file__).resolve().parent / "workload.py"
FLAVOR = "nvidia-h100-80g"
SIM_MODEL = ("H100-80G", "NVIDIA H100 80GB HBM3", 81559)
#: Marks the processes of one cluster's workloads (the job's env), so checks never count anyone else's.
RUN_ENV = "RESILIENCE_RUN"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url(settings_dict: dict) -> str:
    """A ``postgres://`` URL for Django's connection settings (the test database pytest-django made)."""
    auth = quote(settings_dict.get("USER") or "postgres")
    if settings_dict.get("PASSWORD"):
        auth += ":" + quote(settings_dict["PASSWORD"])
    host = settings_dict.get("HOST") or "127.0.0.1"
    return f"postgres://{auth}@{host}:{settings_dict.get('PORT') or 5432}/{settings_dict['NAME']}"


class Timeout(AssertionError):
    pass


def wait_until(
    predicate: Callable[[], Any], *, timeout_s: float, what: str, interval_s: float = 0.2, describe=None
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{describe()}" if describe is not None else ""
            raise Timeout(f"timed out after {timeout_s:.0f} s waiting for {what}{extra}")
        time.sleep(interval_s)


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    popen: subprocess.Popen | None = None

    def start(self) -> Proc:
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} start {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, signum: int = signal.SIGKILL, *, wait_s: float = 20) -> None:
        """Signal the process group (no goodbye with SIGKILL) and reap it; SIGKILL if it outlives ``wait_s``."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)
        try:
            self.popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Agent:
    name: str
    work_dir: Path
    credential_file: Path
    proc: Proc
    proxy: Any = None  # a CuttableProxy when the agent reaches the portal through one

    def workload_pids(self) -> list[int]:
        """Pids of the workloads this agent's state file says are active."""
        try:
            state = json.loads((self.work_dir / "state.json").read_text())
        except (OSError, ValueError):
            return []
        active = ("starting", "running")
        return [w["pid"] for w in state.get("workloads", []) if w.get("pid") and w.get("state") in active]


@dataclass
class Cluster:
    database_url: str
    redis_url: str
    root: Path
    #: Extra environment for every portal process (e.g. ``GPUPOOL_NODE_LOST_GRACE_S``).
    settings: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for folder in ("logs", "data", "storage", "agents"):
            (self.root / folder).mkdir(exist_ok=True)
        self.web: Proc | None = None
        self.workers: list[Proc] = []
        self.beat: Proc | None = None
        self.agents: dict[str, Agent] = {}
        self.proxies: list[Any] = []
        self.token = ""
        self.tenant_slug = ""
        self._spawned: list[Proc] = []

    # --- environment ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def witness_path(self) -> Path:
        """The test process's own witness: one witness per database, as in production. Its processes and the test
        (which writes records too: the seed, submissions) then cosign one history, which the verifier checks."""
        from django.conf import settings as django_settings

        return Path(django_settings.GPUPOOL_AUDIT_WITNESS_PATH)

    @property
    def storage(self) -> Path:
        """Stands for the shared storage that checkpoint dirs live on (every node sees it)."""
        return self.root / "storage"

    def portal_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env.update(
            DJANGO_SETTINGS_MODULE="portal.settings",
            PYTHONUNBUFFERED="1",
            GPUPOOL_DATABASE_URL=self.database_url,
            GPUPOOL_REDIS_URL=self.redis_url,
            GPUPOOL_DATA_DIR=str(self.root / "data"),
            GPUPOOL_AUDIT_WITNESS_PATH=str(self.witness_path),
            GPUPOOL_CHANNELS_PREFIX=f"gpupool-{self.run_id}",
            GPUPOOL_LOG_LEVEL="INFO",
            GPUPOOL_HEARTBEAT_INTERVAL_S="1",
            GPUPOOL_LEASE_MISSES="5",
            GPUPOOL_NODE_LOST_GRACE_S="24",
            # A cut-off agent fences 16 s after the portal's last answer (lease 5 + grace 24 - 3 - margin 10), its
            # workloads given 3 s to checkpoint: later than any restart of the web server here takes.
            GPUPOOL_FENCE_GRACE_S="3",
            GPUPOOL_LEASE_CHECK_INTERVAL_S="1",
            GPUPOOL_CYCLE_INTERVAL_S="2",
            # Checkpoint dirs live on the "shared storage" folder, which every tenant may use here.
            GPUPOOL_CHECKPOINT_PREFIXES=json.dumps({"*": [str(self.storage)]}),
        )
        env.update(self.settings)
        return env

    def agent_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") and k != "DJANGO_SETTINGS_MODULE"}
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        proc = Proc(name=name, argv=argv, log_path=self.root / "logs" / f"{name}.log", env=env).start()
        self._spawned.append(proc)
        return proc

    # --- data ----------------------------------------------------------------------------------------------

    def seed(self, *, slug: str = "resilience", cards: int = 16) -> str:
        """A tenant with a quota of ``cards`` H100s and a member with a write API token (through the services,
        so the audit trail has them). Returns the token; runs in the caller's process (Django set up)."""
        from catalog.models import ResourceFlavor, Vendor
        from tenants.models import MembershipRole, TenantKind
        from tenants.services.identity import user_create
        from tenants.services.memberships import membership_create
        from tenants.services.quotas import quota_set
        from tenants.services.tenancy import tenant_create
        from tenants.services.tokens import api_token_create

        _model, model_name, memory_mib = SIM_MODEL
        flavor, _ = ResourceFlavor.objects.get_or_create(
            name=FLAVOR, defaults={"vendor": Vendor.NVIDIA, "model": model_name, "memory_mib": memory_mib}
        )
        tenant = tenant_create(actor=None, name=slug.title(), slug=slug, kind=TenantKind.COMPANY)
        user = user_create(actor=None, username=f"{slug}-member", password=None)
        membership_create(actor=None, user=user, tenant=tenant, role=MembershipRole.MEMBER)
        quota_set(
            actor=None,
            tenant=tenant,
            flavor=flavor,
            values={"guaranteed_millis": cards * 1000, "limit_millis": cards * 1000},
        )
        _token, raw = api_token_create(actor=user, name="resilience", scope="write")
        self.token, self.tenant_slug = raw, slug
        return raw

    # --- processes -----------------------------------------------------------------------------------------

    def start_web(self) -> Proc:
        self.web = self._spawn(
            "web",
            [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "portal.asgi:application"],
            self.portal_env(),
        )
        return self.web

    def wait_web(self, timeout_s: float = 90) -> None:
        def answers() -> bool:
            if self.web is not None and not self.web.alive():
                raise AssertionError(f"daphne exited:\n{self.web.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/accounts/login/", timeout=5) as response:
                    return response.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                return False

        wait_until(answers, timeout_s=timeout_s, what="the web server to answer", interval_s=0.3)

    def start_worker(self, name: str = "worker") -> Proc:
        proc = self._spawn(
            f"{name}-{len(self.workers)}",
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "--pool",
                "solo",
                "--hostname",
                f"{name}-{len(self.workers)}-{self.run_id}@%h",
                "--without-mingle",
                "--without-gossip",
                "--loglevel",
                "INFO",
            ],
            self.portal_env(),
        )
        self.workers.append(proc)
        return proc

    def start_beat(self) -> Proc:
        self.beat = self._spawn(
            "beat",
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "portal",
                "beat",
                "-s",
                str(self.root / "data" / "beat-schedule"),
                "--loglevel",
                "INFO",
            ],
            self.portal_env(),
        )
        return self.beat

    def start(self, *, agents: int = 2, via_proxy: bool = False, workers: int = 1) -> Cluster:
        """Web, ``workers`` workers, beat and ``agents`` registered simulated agents (2 cards each), all up."""
        if not self.token:
            self.seed()
        self.start_web()
        for _ in range(workers):
            self.start_worker()
        self.start_beat()
        self.wait_web()
        for index in range(agents):
            self.add_agent(f"node-{index}-{self.run_id[:6]}", via_proxy=via_proxy)
        self.wait_nodes_ready(list(self.agents))
        return self

    def add_agent(
        self,
        name: str,
        *,
        cards: int = 2,
        via_proxy: bool = False,
        seed: int = 0,
        address: str = "",
        extra_args: tuple[str, ...] = (),
    ) -> Agent:
        """Register node ``name`` with a fresh bootstrap token and run its agent (through a cuttable proxy)."""
        from scheduler.fleet.services.enrolment import bootstrap_token_create

        _row, secret = bootstrap_token_create(actor=None, ttl_s=600, description=f"resilience {name}")
        folder = self.root / "agents" / name
        folder.mkdir(parents=True, exist_ok=True)
        credential = folder / "agent.json"
        subprocess.run(
            [
                *(PYTHON, "-m", "nodeagent", "register", "--server", self.url, "--token", secret),
                *("--node-name", name, "--credential-file", str(credential)),
            ],
            cwd=ROOT,
            env=self.agent_env(),
            check=True,
            capture_output=True,
            timeout=60,
        )
        proxy = None
        server = self.url
        if via_proxy:
            from tests.resilience.proxy import CuttableProxy

            proxy = CuttableProxy(self.port)
            self.proxies.append(proxy)
            server = proxy.url
        work_dir = folder / "work"
        proc = self._spawn(
            f"agent-{name}",
            [
                *(PYTHON, "-m", "nodeagent", "run", "--server", server, "--backend", "simulated"),
                *("--cards", str(cards), "--model", SIM_MODEL[0], "--seed", str(seed)),
                *("--credential-file", str(credential), "--work-dir", str(work_dir)),
                # The real sandbox where it can work (root: CI), as in production.
                *sandbox_args(),
                # Its own nftables table: agents of one machine must not replace each other's rules.
                *("--network-table", self.network_table(name)),
                *(("--address", address) if address else ()),
                *(
                    ("--shared-storage", self.settings["GPUPOOL_SHARED_STORAGE"])
                    if self.settings.get("GPUPOOL_SHARED_STORAGE")
                    else ()
                ),
                # Agents of one machine share its ports: each hands out its own part of them.
                *("--job-ports", self.job_ports(len(self.agents))),
                *extra_args,
            ],
            self.agent_env(),
        )
        agent = Agent(name=name, work_dir=work_dir, credential_file=credential, proc=proc, proxy=proxy)
        self.agents[name] = agent
        return agent

    def job_ports(self, index: int) -> str:
        """The ports agent ``index`` of this cluster hands to jobs (``--job-ports``): 40 of its own."""
        first = 29500 + (int(self.run_id[:4], 16) % 10) * 40 * 8 + index * 40
        return f"{first}-{first + 39}"

    def network_table(self, agent_name: str) -> str:
        """The nftables table of agent ``agent_name`` (``gpupool-agent run --network-table``)."""
        return "gpupool_" + hashlib.sha1(f"{self.run_id}/{agent_name}".encode()).hexdigest()[:12]

    def kill_node(self, agent: Agent) -> list[int]:
        """The node disappears: SIGKILL its agent and every workload it started, no goodbye. Returns the
        workload pids killed."""
        pids = agent.workload_pids()
        agent.proc.kill(signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        if agent.proxy is not None:
            agent.proxy.cut()
        return pids

    def wait_nodes_ready(self, names: list[str], timeout_s: float = 60) -> None:
        from scheduler.fleet.models import Node, NodeStatus

        def ready() -> bool:
            return Node.objects.filter(name__in=names, status=NodeStatus.READY).count() == len(names)

        wait_until(ready, timeout_s=timeout_s, what=f"nodes {names} ready", describe=self.describe)

    def stop(self) -> None:
        """End every process this cluster started, and the workloads of its agents."""
        for agent in self.agents.values():
            pids = agent.workload_pids()
            agent.proc.kill(signal.SIGKILL)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        for pid in _workload_groups(self.run_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for proc in reversed(self._spawned):
            proc.kill(signal.SIGTERM, wait_s=3)
        for proxy in self.proxies:
            proxy.close()
        if shutil.which("nft"):  # the agents were killed: their isolation rules stay unless removed here
            for name in self.agents:
                subprocess.run(["nft", "delete", "table", "inet", self.network_table(name)], capture_output=True)

    # --- the API -------------------------------------------------------------------------------------------

    def api(self, path: str, body: dict | None = None, *, timeout_s: float = 30, token: str = "") -> tuple[int, dict]:
        request = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {token or self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
            method="GET" if body is None else "POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            raw = error.read() or b"{}"
            try:
                return error.code, json.loads(raw)
            except ValueError:
                return error.code, {"raw": raw[:500].decode(errors="replace")}

    def job_spec(self, name: str, *, steps: int = 10, step_s: float = 0.5) -> dict:
        """One whole H100 running ``workload.py``: ``steps`` checkpointed steps of ``step_s`` seconds."""
        return {
            "name": name,
            "tenant": self.tenant_slug,
            "kind": "training",
            "priority_class": "normal",
            "resources": {"flavors": [FLAVOR], "gpus": 1},
            # An interpreter the sandbox's unprivileged uid can run (not a pyenv under /root).
            # The script's text, not its path: the sandbox gives a job a private /tmp, and a checkout (CI's
            # clone) may well live under /tmp, where the job could not see the file.
            "command": [WORKLOAD_PYTHON, "-c", WORKLOAD.read_text(), str(steps), str(step_s)],
            "env": {RUN_ENV: self.run_id},
            "checkpoint_dir": str(self.storage / name),
        }

    def submit(self, name: str, **kwargs: Any) -> int:
        status, job = self.api("/api/v1/jobs/", self.job_spec(name, **kwargs))
        assert status == 201, (status, job)
        return job["id"]

    # --- what happened -------------------------------------------------------------------------------------

    def marks_of(self, job_id: int) -> list[dict]:
        """The start/done lines the job's runs wrote (workload.py), from its directory on every node, in time
        order."""
        marks = []
        for path in (self.root / "agents").glob(f"*/work/jobs/{job_id}-*/marks.jsonl"):
            with contextlib.suppress(OSError):
                marks += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return sorted(marks, key=lambda mark: mark["at"])

    def starts_of(self, job_id: int) -> list[dict]:
        return [mark for mark in self.marks_of(job_id) if mark["event"] == "start"]

    def describe(self) -> str:
        """Jobs, nodes and log tails, for a failure message."""
        from scheduler.fleet.models import Node
        from scheduler.models import Allocation, Job

        lines = ["jobs:"]
        for job in Job.objects.order_by("pk"):
            held = list(Allocation.objects.active().filter(job=job).values_list("node__name", flat=True))
            lines.append(f"  {job.pk} {job.name}: {job.state} {held} {job.state_message!r} {job.pending_message!r}")
        lines.append("nodes:")
        for node in Node.objects.order_by("name"):
            lines.append(f"  {node.name}: {node.status} heartbeat {node.last_heartbeat_at}")
        for proc in self._spawned:
            lines.append(f"--- {proc.name} ({'alive' if proc.alive() else 'exited'}):\n{proc.log_tail(15)}")
        return "\n".join(lines)


class RedisServer:
    """A private ``redis-server`` on a free port that a test may restart (never the shared one)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.folder)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        import redis

        client = redis.Redis.from_url(self.url)

        def pong() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(pong, timeout_s=20, what=f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _environ(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, _sep, value in pairs}


@dataclass(frozen=True)
class WorkloadProcess:
    pid: int
    pgid: int
    job_id: int
    devices: tuple[str, ...]
    replica: int = 0


def workload_processes(run_id: str) -> list[WorkloadProcess]:
    """Every live (not zombie) process of this run's workloads, found in /proc by the job env marker."""
    from nodeagent.launcher import process_start_time

    found = []
    marker = f"{RUN_ENV}={run_id}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if marker not in Path(f"/proc/{entry}/environ").read_bytes():
                continue
        except OSError:
            continue
        env = _environ(entry)
        pid = int(entry)
        if process_start_time(pid) is None:
            continue
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            continue
        devices = tuple(sorted(filter(None, env.get("CUDA_VISIBLE_DEVICES", "").split(","))))
        found.append(
            WorkloadProcess(
                pid=pid,
                pgid=pgid,
                job_id=int(env.get("GPUPOOL_JOB_ID", "0")),
                devices=devices,
                replica=int(env.get("GPUPOOL_REPLICA", "0")),
            )
        )
    return found


def _workload_groups(run_id: str) -> set[int]:
    return {process.pgid for process in workload_processes(run_id)}
