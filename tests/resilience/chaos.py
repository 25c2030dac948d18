"""A chaos run on the fault harness: many jobs of mixed shapes while processes die and links break.

:func:`run_chaos` submits jobs — whole cards, two-card jobs, fractions of a card, gangs of two, arrays — in
waves through the API (each submit with an ``Idempotency-Key``, retried while the web server is down), while a
seeded schedule of faults runs in background threads: Celery workers SIGKILLed and started again, the private
Redis restarted, the web server SIGKILLed and started again, agents SIGKILLed and started again (their workloads
live on, to be re-adopted), and agents' links cut by their proxies, briefly (less than the fence time) or past
the grace period (the agent fences, the portal requeues). Every ``sample_s`` the safety rules of
``invariants.py`` are checked against the database and ``/proc`` — no job in two process groups, no card past
1000 millis or its memory, allocations only for active jobs, unbroken histories. When every job has ended the
run checks that each ended exactly once and none was lost, no allocation is open, PostgreSQL counted no
deadlock, and the audit trail verifies. Used by ``tests/resilience/test_chaos.py`` (small) and
``benchmarks/chaos.py`` (≥ 200 jobs).

The caller's process has Django set up on the cluster's database; the fault threads touch processes only.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import statistics
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.resilience.cluster import FLAVOR, Cluster, RedisServer

#: Shapes of the jobs submitted, with their weights.
SHAPES: dict[str, float] = {"whole": 0.3, "two_cards": 0.1, "fraction": 0.3, "gang": 0.15, "array": 0.15}
ARRAY_COUNT = 4
FRACTION = {"millis": 500, "memory_mib": 20000}
#: Marks a long job in its env (the long cut looks for a node that has just started one).
LONG_ENV = "CHAOS_LONG"
FAULT_KINDS = ("worker_kill", "redis_restart", "web_restart", "agent_kill", "short_cut", "long_cut")


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: str = ""
    #: How long the fault lasts: a cut's length, the seconds before a killed process is started again.
    duration_s: float = 0.0


@dataclass
class ChaosPlan:
    jobs: int
    faults: dict[str, int]
    #: Jobs are submitted over this window; the faults happen in it too.
    window_s: float
    seed: int = 1
    steps: tuple[int, int] = (2, 6)
    #: This share of the jobs runs ``long_steps`` instead (outlasting the fence time of a cut).
    long_share: float = 0.2
    long_steps: tuple[int, int] = (50, 70)
    step_s: float = 0.5
    #: A long cut outlasts the portal's lease + grace (the cluster's settings), so the agent fences.
    long_cut_s: float = 34.0
    short_cut_s: tuple[float, float] = (2.0, 8.0)
    sample_s: float = 1.0
    drain_timeout_s: float = 240.0


@dataclass
class ChaosResult:
    plan: ChaosPlan
    submitted: Counter = field(default_factory=Counter)
    faults: list[tuple[float, Fault]] = field(default_factory=list)
    samples: int = 0
    violations: list[str] = field(default_factory=list)
    max_card_millis: int = 0
    max_copies: int = 0
    finals: Counter = field(default_factory=Counter)
    lost: list[int] = field(default_factory=list)
    #: Jobs that did not succeed: (job id, state, the job's message).
    unsuccessful: list[tuple[int, str, str]] = field(default_factory=list)
    ended_more_than_once: list[int] = field(default_factory=list)
    open_allocations: int = 0
    deadlocks: int = 0
    deadlock_log_lines: int = 0
    requeues: Counter = field(default_factory=Counter)
    reruns: int = 0
    fenced_stops: int = 0
    submit_retries: int = 0
    audit_records: int = 0
    audit_ok: bool = False
    wall_s: float = 0.0
    finish_s: list[float] = field(default_factory=list)

    @property
    def jobs(self) -> int:
        return sum(self.finals.values()) + len(self.lost)

    def lines(self) -> list[str]:
        kinds = Counter(fault.kind for _at, fault in self.faults)
        finish = sorted(self.finish_s) or [0.0]
        return [
            f"jobs: {self.jobs} ({', '.join(f'{n} {shape}' for shape, n in sorted(self.submitted.items()))}), "
            f"{self.submit_retries} submits retried while the web server was away",
            f"faults: {', '.join(f'{kinds[kind]} {kind}' for kind in FAULT_KINDS)}",
            f"samples: {self.samples} (one every {self.plan.sample_s:.0f} s): most millis on one card "
            f"{self.max_card_millis}, most live copies of one job {self.max_copies}, safety violations "
            f"{len(self.violations)}",
            f"ended: {dict(sorted(self.finals.items()))}; lost {len(self.lost)}, ended more than once "
            f"{len(self.ended_more_than_once)}; open allocations {self.open_allocations}",
            f"requeued: {dict(sorted(self.requeues.items()))}; fenced stops {self.fenced_stops}; replicas that ran "
            f"to the end more than once (finished during a cut, before the fence: re-run after the requeue) "
            f"{self.reruns}",
            f"deadlocks: {self.deadlocks} (pg_stat_database), {self.deadlock_log_lines} 'deadlock detected' log lines",
            f"audit trail: {'verifies' if self.audit_ok else 'DOES NOT VERIFY'} ({self.audit_records} records)",
            f"submit → ended: median {statistics.median(finish):.1f} s, "
            f"p95 {finish[int(0.95 * (len(finish) - 1))]:.1f} s; wall {self.wall_s:.0f} s",
        ]

    @property
    def ok(self) -> bool:
        return (
            not self.violations
            and not self.lost
            and not self.ended_more_than_once
            and self.open_allocations == 0
            and self.deadlocks == 0
            and self.deadlock_log_lines == 0
            and self.audit_ok
        )


# --- faults ---------------------------------------------------------------------------------------------------


def fault_schedule(plan: ChaosPlan, agent_names: list[str], rng: random.Random) -> list[Fault]:
    """The faults of ``plan`` at random moments of the window (a long cut early enough to end inside it)."""
    faults = []
    for kind, count in plan.faults.items():
        for _ in range(count):
            # A long cut picks its node when it starts (the busiest one).
            target = rng.choice(agent_names) if kind in ("agent_kill", "short_cut") else ""
            if kind == "long_cut":
                at = rng.uniform(0.1, 0.4) * plan.window_s
                duration = plan.long_cut_s
            else:
                at = rng.uniform(0.05, 0.95) * plan.window_s
                duration = {
                    "short_cut": rng.uniform(*plan.short_cut_s),
                    "agent_kill": rng.uniform(1.0, 5.0),
                    "worker_kill": rng.uniform(0.5, 2.0),
                    "redis_restart": rng.uniform(0.5, 2.0),
                }.get(kind, 0.0)
            faults.append(Fault(at_s=round(at, 1), kind=kind, target=target, duration_s=round(duration, 1)))
    return sorted(faults, key=lambda fault: fault.at_s)


class FaultInjector:
    """Runs each fault of a schedule in its own thread at its moment (processes only: no database access)."""

    def __init__(self, cluster: Cluster, redis: RedisServer, schedule: list[Fault]) -> None:
        self.cluster = cluster
        self.redis = redis
        self.schedule = schedule
        self.done: list[tuple[float, Fault]] = []
        self.errors: list[str] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, t0: float) -> None:
        for fault in self.schedule:
            thread = threading.Thread(target=self._run, args=(fault, t0), name=f"fault-{fault.kind}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, fault: Fault, t0: float) -> None:
        time.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
        started = time.monotonic() - t0
        try:
            getattr(self, f"_{fault.kind}")(fault)
        except Exception as exc:  # a fault that could not be injected is reported, the run goes on
            with self._lock:
                self.errors.append(f"{fault.kind} at {fault.at_s} s: {exc!r}")
            return
        with self._lock:
            self.done.append((started, fault))

    def _worker_kill(self, fault: Fault) -> None:
        for worker in list(self.cluster.workers):
            if worker.alive():
                worker.kill(signal.SIGKILL)
        time.sleep(fault.duration_s)  # then the supervisor starts a new one
        self.cluster.start_worker()

    def _redis_restart(self, fault: Fault) -> None:
        self.redis.stop()
        time.sleep(fault.duration_s)
        self.redis.start()

    def _web_restart(self, fault: Fault) -> None:
        self.cluster.web.kill(signal.SIGKILL)
        self.cluster.start_web()

    def _agent_kill(self, fault: Fault) -> None:
        agent = self.cluster.agents[fault.target]
        agent.proc.kill(signal.SIGKILL)  # the agent's own process group: its workloads live on
        time.sleep(fault.duration_s)
        agent.proc.start()

    def _short_cut(self, fault: Fault) -> None:
        proxy = self.cluster.agents[fault.target].proxy
        proxy.cut()
        time.sleep(fault.duration_s)
        proxy.restore()

    def _long_cut(self, fault: Fault) -> None:
        """Cut a node that has just started a long job (one that outlasts the fence time), so that its agent has
        a workload to fence; waits up to a minute for one."""
        deadline = time.monotonic() + 60
        target = None
        while target is None and time.monotonic() < deadline:
            target = _node_with_a_fresh_long_job(self.cluster)
            time.sleep(0.2)
        if target is None:
            raise RuntimeError("no node started a long job within a minute")
        self._short_cut(Fault(at_s=fault.at_s, kind=fault.kind, target=target, duration_s=fault.duration_s))


def _node_with_a_fresh_long_job(cluster: Cluster, *, within_s: float = 3.0) -> str | None:
    """A node whose agent started a long job in the last ``within_s`` seconds (its state file and ``/proc``)."""
    from tests.resilience.cluster import workload_processes

    long_jobs = set()
    for process in workload_processes(cluster.run_id):
        with contextlib.suppress(OSError):
            if f"{LONG_ENV}=1".encode() in Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0"):
                long_jobs.add(process.job_id)
    for agent in cluster.agents.values():
        try:
            workloads = json.loads((agent.work_dir / "state.json").read_text()).get("workloads", [])
        except (OSError, ValueError):
            continue
        for workload in workloads:
            fresh = time.time() - workload.get("started_at", 0) <= within_s
            if workload.get("state") == "running" and workload.get("job_id") in long_jobs and fresh:
                return agent.name
    return None


# --- jobs -----------------------------------------------------------------------------------------------------


def job_spec(cluster: Cluster, shape: str, name: str, rng: random.Random, plan: ChaosPlan) -> dict:
    long = rng.random() < plan.long_share
    spec = cluster.job_spec(name, steps=rng.randint(*(plan.long_steps if long else plan.steps)), step_s=plan.step_s)
    if long:
        spec["env"][LONG_ENV] = "1"
    if shape == "two_cards":
        spec["resources"] = {"flavors": [FLAVOR], "gpus": 2}
    elif shape == "fraction":
        spec["resources"] = {"flavors": [FLAVOR], **FRACTION}
    elif shape == "gang":
        spec["replicas"] = 2
    elif shape == "array":
        spec["array"] = {"count": ARRAY_COUNT}
        # One checkpoint dir per copy: relative, in each copy's own job directory.
        spec["checkpoint_dir"] = "checkpoint"
        if rng.random() < 0.5:
            spec["resources"] = {"flavors": [FLAVOR], **FRACTION}
    return spec


class Submitter:
    """Submits specs with an Idempotency-Key each; a submit that finds the web server away is tried again later
    with the same key, so a retry never makes a second job."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.pending: list[tuple[str, dict, float]] = []  # (key, spec, first tried at)
        self.accepted: dict[str, float] = {}  # key → when first tried
        self.retries = 0

    def add(self, spec: dict) -> None:
        self.pending.append((uuid.uuid4().hex, spec, time.time()))

    def flush(self) -> None:
        still = []
        for key, spec, first in self.pending:
            if self._post(key, spec):
                self.accepted[key] = first
            else:
                self.retries += 1
                still.append((key, spec, first))
        self.pending = still

    def _post(self, key: str, spec: dict) -> bool:
        request = urllib.request.Request(
            self.cluster.url + "/api/v1/jobs/",
            data=json.dumps(spec).encode(),
            headers={
                "Authorization": f"Bearer {self.cluster.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
                "Idempotency-Key": key,
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status in (200, 201)
        except urllib.error.HTTPError as error:
            if error.code >= 500 or error.code == 429:
                return False
            raise AssertionError(f"submit refused: {error.code} {error.read()[:300]!r}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False


# --- the run --------------------------------------------------------------------------------------------------


def run_chaos(
    cluster: Cluster, redis: RedisServer, plan: ChaosPlan, *, log: Callable[[str], None] = print
) -> ChaosResult:
    """Run ``plan`` against a started ``cluster`` whose agents reach the portal through proxies."""
    from scheduler.models import Allocation
    from tests.resilience.invariants import safety_violations

    rng = random.Random(plan.seed)
    result = ChaosResult(plan=plan)
    schedule = fault_schedule(plan, sorted(cluster.agents), rng)
    log("fault schedule: " + ", ".join(f"{f.kind} at {f.at_s:.0f} s {f.target}".strip() for f in schedule))
    deadlocks_before = _deadlocks()
    injector = FaultInjector(cluster, redis, schedule)
    submitter = Submitter(cluster)
    shapes, weights = zip(*SHAPES.items(), strict=True)
    wanted = plan.jobs
    planned = 0
    started = time.monotonic()
    injector.start(started)
    next_sample = started
    waves = max(1, int(plan.window_s / 2))
    wave = 0
    while True:
        now = time.monotonic()
        elapsed = now - started
        # Submissions: waves every 2 s over the window, the planned number spread evenly.
        while wave < waves and elapsed >= wave * plan.window_s / waves:
            target = round(wanted * (wave + 1) / waves)
            while planned < target:
                shape = rng.choices(shapes, weights)[0]
                submitter.add(job_spec(cluster, shape, f"chaos-{planned}", rng, plan))
                count = ARRAY_COUNT if shape == "array" else 1
                result.submitted[shape] += count
                planned += count
            wave += 1
        submitter.flush()
        if now >= next_sample:
            next_sample = now + plan.sample_s
            _sample(cluster, result, safety_violations)
        window_over = elapsed >= plan.window_s and wave >= waves and not submitter.pending
        if window_over and len(injector.done) + len(injector.errors) == len(schedule) and _all_ended(cluster):
            break
        if elapsed > plan.window_s + plan.drain_timeout_s:
            log(f"not every job ended within {plan.drain_timeout_s:.0f} s after the window")
            break
        time.sleep(0.2)
    injector.join(timeout_s=30)
    result.wall_s = time.monotonic() - started
    result.faults = sorted(injector.done, key=lambda done: done[0])
    result.submit_retries = submitter.retries
    for error in injector.errors:
        result.violations.append(f"fault not injected: {error}")
    _sample(cluster, result, safety_violations)
    _final_checks(cluster, result, deadlocks_before)
    result.open_allocations = Allocation.objects.active().count()
    return result


def _sample(cluster: Cluster, result: ChaosResult, safety_violations) -> None:
    from django.db import connection, transaction
    from django.db.models import Sum

    from scheduler.models import Allocation
    from tests.resilience.cluster import workload_processes

    result.samples += 1
    # One snapshot of the database for the whole sample (the portal commits all the while); /proc after it, so a
    # job the snapshot has finished has no process left (the agent reports an end after the process exited).
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        problems = safety_violations(cluster)
        by_device = list(Allocation.objects.active().values("device_id").annotate(millis=Sum("millis")))
    for problem in problems:
        if len(result.violations) < 50:
            result.violations.append(f"sample {result.samples}: {problem}")
    result.max_card_millis = max([result.max_card_millis, *(row["millis"] for row in by_device)])
    groups: dict[tuple[int, int], set[int]] = defaultdict(set)  # (job, replica) → process groups running it
    for process in workload_processes(cluster.run_id):
        groups[(process.job_id, process.replica)].add(process.pgid)
    result.max_copies = max([result.max_copies, *(len(pgids) for pgids in groups.values())])


def _all_ended(cluster: Cluster) -> bool:
    from scheduler.models import FINAL_JOB_STATES, Job

    return not Job.objects.exclude(state__in=FINAL_JOB_STATES).exists()


def _deadlocks() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _final_checks(cluster: Cluster, result: ChaosResult, deadlocks_before: int) -> None:
    from django.test import override_settings

    from audit.trail_verifier import verify_trail
    from scheduler.models import FINAL_JOB_STATES, Job, JobEvent

    jobs = list(Job.objects.all())
    finals = Counter(
        JobEvent.objects.filter(to_state__in=FINAL_JOB_STATES)
        .exclude(from_state__in=FINAL_JOB_STATES)
        .values_list("job_id", flat=True)
    )
    for job in jobs:
        if job.state in FINAL_JOB_STATES:
            result.finals[job.state] += 1
            if job.state != "succeeded":
                result.unsuccessful.append((job.pk, job.state, job.state_message))
        else:
            result.lost.append(job.pk)
        if finals[job.pk] > 1:
            result.ended_more_than_once.append(job.pk)
        if job.submitted_at and job.finished_at:
            result.finish_s.append((job.finished_at - job.submitted_at).total_seconds())
    result.requeues = Counter(
        JobEvent.objects.filter(to_state="queued").exclude(from_state="submitted").values_list("reason", flat=True)
    )
    # "agent: fenced workloads 12/0, 14/1" (job/replica), one line per fence.
    result.fenced_stops = sum(
        len(line.rsplit("fenced workloads ", 1)[1].split(", "))
        for agent in cluster.agents.values()
        for line in _log_lines(agent.proc.log_path, "fenced workloads ")
    )
    dones: Counter = Counter()  # "<job>-<replica>" → runs that reached their last step, on any node
    for path in (cluster.root / "agents").glob("*/work/jobs/*/marks.jsonl"):
        with contextlib.suppress(OSError, ValueError):
            dones[path.parent.name] += sum(
                1 for line in path.read_text().splitlines() if json.loads(line).get("event") == "done"
            )
    result.reruns = sum(1 for count in dones.values() if count > 1)
    result.deadlocks = _deadlocks() - deadlocks_before
    result.deadlock_log_lines = sum(
        1 for proc in cluster._spawned for _line in _log_lines(proc.log_path, "deadlock detected")
    )
    with override_settings(GPUPOOL_AUDIT_WITNESS_PATH=str(cluster.witness_path)):
        report = verify_trail(record_result=False)
    result.audit_ok = report.ok
    result.audit_records = report.records
    if not report.ok:
        result.violations += [str(finding.as_dict()) for finding in report.findings[:10]]


def _log_lines(path: Path, needle: str) -> list[str]:
    try:
        return [line for line in path.read_text(errors="replace").splitlines() if needle in line]
    except OSError:
        return []
