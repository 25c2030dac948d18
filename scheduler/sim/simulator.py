"""A discrete-event simulator that drives ``scheduler.core.plan`` with simulated time.

Events (a heap ordered by time, then kind, then insertion): job arrivals, completions after the job's remaining
work, the end of a preemption's grace period (the victim stops and returns to the queue), node failures and
repairs, and scheduling cycles. A cycle is triggered by any event that changes what could run, debounced to at
most one per ``SimConfig.cycle_interval_s`` simulated seconds like the real Celery loop; every event up to the
cycle's time is applied first, so a burst of arrivals is scheduled in one cycle. Each cycle builds a core
``Snapshot`` from state kept incrementally (node tuple rebuilt only on failure/repair, allocations per job,
pending jobs in a dict) and applies the ``Plan``: places start jobs, preemptions stop victims after their grace,
and the plan's holds (``Plan.holds``: devices kept for a preemptor while its victims stop) go into the next
snapshot, exactly as the Django side stores and passes them back.

Work accounting: a job needs ``duration_s`` of work. A restart (any start after the first) first spends
``restart_cost_s`` loading its checkpoint; a stopped job keeps the work up to its last checkpoint (every
``checkpoint_interval_s`` of work; with ``checkpoint_on_preempt`` also at the stop of a preemption) and loses
the rest, which it redoes later.

Observers (``SimObserver``, passed as ``observers=``) are told of every start and stop of a job as it
happens — on which nodes, and why it stopped — which is how per-job timelines are recorded
(``records.JobTimeline``) without reaching into the simulator.

The simulator decides nothing itself: which job runs where, who is preempted and who waits is the engine's.
Only the *time* between a decision and its effect (grace period, restart cost) is modelled here.
"""

from __future__ import annotations

import heapq
import math
import random
import time as wallclock
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from itertools import chain
from typing import Protocol

from scheduler.core import decay_usage, plan
from scheduler.core.types import (
    MILLIS_PER_DEVICE,
    Allocation,
    Hold,
    Node,
    PendingJob,
    Place,
    Quota,
    ReplicaRequest,
    Snapshot,
    Tenant,
)

from .policies import SimPolicy
from .workload import SimJob, Workload


@dataclass(frozen=True, slots=True)
class SimConfig:
    # At most one scheduling cycle per this many simulated seconds. The real loop runs every 5 s; a trace replay
    # whose delays are minutes to hours loses little at 60 s and needs 10x fewer ``plan()`` calls.
    cycle_interval_s: float = 60.0
    restart_cost_s: float = 60.0  # a restarted job reloads its checkpoint before it does new work
    checkpoint_interval_s: float | None = 1800.0  # None: no checkpoints, a stopped job starts over
    checkpoint_on_preempt: bool = False  # a preempted job saves its work during the grace period
    mtbf_s: float | None = None  # mean time between failures of one node (exponential); None: no random failures
    repair_s: float = 3600.0  # a failed node is back after this long
    failures: tuple[tuple[float, str, float], ...] = ()  # scheduled failures: (time, node, down for seconds)
    seed: int = 0  # random failures only; the engine's randomness is ``Policy.seed``
    runtime_estimates: bool = False  # tell the engine each job's true remaining time (an oracle for backfill)
    bin_s: float = 3600.0  # width of the allocation-over-time series
    horizon_s: float | None = None  # stop at this simulated time (None: when nothing more can happen)
    guarantee_tolerance_s: float | None = None  # None: grace + min runtime before preemption + 2 cycles
    # Pass the engine's holds (``Plan.holds``) back into the next snapshot, as the Django side does. False
    # forgets them between cycles (an ablation: it shows the preemption loop a one-cycle hold allows).
    hold_for_preemptor: bool = True


# With nothing else left to happen and jobs still waiting, the simulator looks again every quarter usage
# half-life (time-based rules: back-offs, decaying use) at most this many times in a row without a start.
IDLE_LOOKS = 96


class Ev(IntEnum):
    """Event kinds; at equal times lower values go first (capacity is freed before it is asked for)."""

    FINISH = 0
    STOP = 1
    REPAIR = 2
    FAIL = 3
    ARRIVE = 4
    TICK = 8
    CYCLE = 9


class StopReason(StrEnum):
    """Why a job left its devices."""

    FINISHED = "finished"  # its work was done
    PREEMPTED = "preempted"  # its grace period after a preemption ended; it went back to the queue
    NODE_FAILED = "node_failed"  # a node it ran on failed; it went back to the queue
    END = "end"  # still running when the replay stopped (``SimConfig.horizon_s``)


class SimObserver(Protocol):
    """Receives a job's starts and stops in simulated-time order (see ``records.JobTimeline``)."""

    def job_started(self, job_id: str, t: float, *, nodes: tuple[str, ...], flavor: str) -> None: ...

    def job_stopped(self, job_id: str, t: float, *, reason: StopReason) -> None: ...


class St(IntEnum):
    FUTURE = 0
    QUEUED = 1
    RUNNING = 3
    STOPPING = 4  # preempted, in its grace period
    DONE = 5


@dataclass(slots=True)
class JobRecord:
    """What happened to one job; the input of ``metrics.summarize``."""

    job_id: str
    tenant: str
    submit_s: float
    duration_s: float
    gpus: float
    first_start_s: float | None = None
    finish_s: float | None = None
    queued_s: float = 0.0  # total time waiting, over all its stays in the queue
    starts: int = 0
    preemptions: int = 0
    failures: int = 0
    # Time waiting while owed room in its tenant's unused guarantee: the room (guarantee - held) is handed out
    # over the tenant's waiting jobs in queue order (preemptors the engine holds devices for first, then
    # priority, submit time, trace order), each job that fits taking its size out of what is left — a tenant one
    # card below its guarantee with a thousand one-card jobs queued owes that card to one of them, not to each.
    starved_s: float = 0.0
    longest_starved_s: float = 0.0  # the longest single such wait
    # The stricter reading: time waiting while the job alone would have fit in its tenant's unused guarantee,
    # whatever the jobs ahead of it wait for (every one of the thousand jobs above counts).
    starved_alone_s: float = 0.0


@dataclass(slots=True)
class SimResult:
    policy: str
    workload: str
    capacity_millis: int
    jobs: list[JobRecord]
    bin_s: float
    allocated_bins: list[float]  # mean allocated millis per bin, from t = 0
    allocated_millis_s: float  # ∫ allocated millis dt over the whole run
    overhead_gpu_s: float  # restart time spent on devices
    lost_gpu_s: float  # work done and then lost by a stop (redone later)
    end_s: float
    window_s: float  # time of the last arrival
    cycles: int
    skipped_cycles: int
    preemptions: int
    failure_requeues: int
    node_failures: int
    plan_wall_s: float  # wall time spent inside ``plan()``
    plan_calls: int
    wall_s: float
    guarantee_tolerance_s: float
    guarantee_millis: dict[str, int] = field(default_factory=dict)
    # Time some tenant had a job waiting that fit in its unused guarantee while another tenant held more than
    # its guarantee; and the part of it when such a job had already waited longer than the tolerance.
    starved_while_borrowed_s: float = 0.0
    starved_while_borrowed_beyond_tolerance_s: float = 0.0
    preemption_times: list[float] = field(default_factory=list)
    # The reclaim promise (issue 33): a job owed room in its tenant's guarantee starts within grace + minimum
    # runtime before preemption + one cycle; ``metrics.owed_wait_beyond_s`` measures waits against it.
    reclaim_bound_s: float = 0.0


@dataclass(slots=True, eq=False)
class _Run:
    job: SimJob
    record: JobRecord
    remaining_s: float
    state: St = St.FUTURE
    epoch: int = 0
    started_at: float = 0.0
    productive_from: float = 0.0
    queued_at: float = 0.0
    preempted_by: frozenset[str] = frozenset()
    preempted_at: float | None = None  # the last preemption decision (the Django side: its PREEMPTING event)
    allocs: tuple[Allocation, ...] = ()
    pending: PendingJob | None = None
    starved_since: float | None = None
    starved_alone_since: float | None = None
    queue_key: tuple[int, float, int] = (0, 0.0, 0)  # the tenant's queue order: -priority, submit, trace order
    millis_held: int = 0


class Simulator:
    """Replays ``workload`` under ``policy``; ``run()`` returns a ``SimResult``. Each of ``observers`` is told
    of every start and stop of a job (``SimObserver``)."""

    def __init__(
        self,
        workload: Workload,
        policy: SimPolicy,
        config: SimConfig | None = None,
        *,
        observers: Sequence[SimObserver] = (),
    ) -> None:
        self.w = workload
        self.observers = tuple(observers)
        self.sp = policy
        self.p = policy.policy
        self.c = config or SimConfig()
        self.runs = [
            _Run(job=j, record=_record(j), remaining_s=j.duration_s, queue_key=(-int(j.priority), j.submit_s, i))
            for i, j in enumerate(workload.jobs)
        ]
        self.by_id = {r.job.job_id: r for r in self.runs}
        self.index = {r.job.job_id: i for i, r in enumerate(self.runs)}
        if len(self.by_id) != len(self.runs):
            raise ValueError("job ids in the workload must be unique")
        self.base_nodes = {n.name: n for n in workload.nodes}
        self.down: set[str] = set()
        self.node_idx = {n.name: i for i, n in enumerate(workload.nodes)}
        self.nodes: tuple[Node, ...] = tuple(workload.nodes)
        self.tenants = tuple(Tenant(t, parent=workload.parents.get(t)) for t in workload.tenants)
        self.quotas = self._quotas() if policy.use_quotas else ()
        self.guarantee = {t: sum(f.values()) for t, f in workload.guarantees.items()}
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.now = 0.0
        self.cycle_at: float | None = None
        self.tick_at: float | None = None
        self.idle_looks = 0  # looks again with nothing else to happen since the last start (``IDLE_LOOKS``)
        self.last_cycle = -math.inf
        self.pending: dict[str, _Run] = {}
        self.holds: tuple[Hold, ...] = ()  # the last plan's holds, for the next snapshot
        self.node_jobs: dict[str, set[str]] = defaultdict(set)
        self.flavor_of: dict[str, str] = {}  # running (or stopping) job → the flavor it was placed on
        self.allocated = 0  # millis held now
        self.tenant_held: dict[str, int] = defaultdict(int)
        self.tenant_flavor_held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.usage: dict[str, dict[str, float]] = {}
        self.usage_at = 0.0
        self.bins: list[float] = []
        self.area = 0.0
        self.overhead_gpu_s = 0.0
        self.lost_gpu_s = 0.0
        self.cycles = 0
        self.plan_calls = 0
        self.skipped_cycles = 0  # cycles not run because no pending job could possibly fit (see _cannot_place)
        self.capacity = workload.capacity_millis
        self.node_millis = {n.name: len(n.devices) * MILLIS_PER_DEVICE for n in workload.nodes}
        self.done = 0
        self.preemptions = 0
        self.failure_requeues = 0
        self.node_failures = 0
        self.plan_wall_s = 0.0
        self.rng = random.Random(self.c.seed)
        self.starve_at: float | None = None  # last _flag_starved time
        self.starve_flags = (False, False)  # (starved while borrowed, beyond tolerance) since then
        self.starved_while_borrowed_s = 0.0
        self.starved_beyond_s = 0.0
        self.preemption_times: list[float] = []
        self.tolerance = (
            self.c.guarantee_tolerance_s
            if self.c.guarantee_tolerance_s is not None
            else self.p.grace_period_s + self.p.min_runtime_before_preempt_s + 2 * self.c.cycle_interval_s
        )

    # -- setup -----------------------------------------------------------------------------------------------

    def _quotas(self) -> tuple[Quota, ...]:
        rows = []
        for tenant in sorted(self.w.guarantees):
            for flavor, millis in sorted(self.w.guarantees[tenant].items()):
                limit = self.w.limits.get(tenant, {}).get(flavor)
                if not self.p.borrowing:
                    limit = millis  # a strict partition: the guarantee is also the cap
                rows.append(
                    Quota(
                        tenant=tenant,
                        flavor=flavor,
                        guaranteed_millis=millis,
                        limit_millis=limit,
                        lending_limit_millis=self.w.lending_limits.get(tenant, {}).get(flavor),
                        max_running_jobs=self.w.max_running_jobs.get(tenant, {}).get(flavor),
                    )
                )
        return tuple(rows)

    def _push(self, t: float, kind: Ev, idx: int = -1, epoch: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, int(kind), self.seq, idx, epoch))

    # -- the loop --------------------------------------------------------------------------------------------

    def run(self) -> SimResult:
        started = wallclock.perf_counter()
        for i, r in enumerate(self.runs):
            self._push(r.job.submit_s, Ev.ARRIVE, i)
        self._schedule_failures()
        horizon = self.c.horizon_s
        while self.heap or self._look_again():
            t, kind, _, idx, epoch = heapq.heappop(self.heap)
            if horizon is not None and t > horizon:
                break
            if kind == Ev.TICK and not self.pending:
                self.tick_at = None
                continue  # nobody waits: nothing to look at again (and the clock must not run on)
            self._advance(t)
            if kind == Ev.CYCLE:
                self.cycle_at = None
                self._cycle(t)
            elif kind == Ev.TICK:
                self.tick_at = None
                if self.pending:
                    self._want_cycle(t)
            elif kind == Ev.ARRIVE:
                self._arrive(self.runs[idx], t)
            elif kind == Ev.FINISH:
                run = self.runs[idx]
                if run.epoch == epoch and run.state in (St.RUNNING, St.STOPPING):
                    self._finish(run, t)
            elif kind == Ev.STOP:
                run = self.runs[idx]
                if run.epoch == epoch and run.state == St.STOPPING:
                    self._stop(run, t, preempted=True)
            elif kind == Ev.FAIL:
                self._fail(self.w.nodes[idx].name, t, epoch)
            elif kind == Ev.REPAIR:
                self._repair(self.w.nodes[idx].name, t)
        end = self.now
        for run in self.runs:  # jobs still waiting at the end never started again: close their books
            if run.state == St.QUEUED:
                run.record.queued_s += end - run.queued_at
                self._unflag(run, end)
            elif run.state in (St.RUNNING, St.STOPPING):
                for observer in self.observers:
                    observer.job_stopped(run.job.job_id, end, reason=StopReason.END)
        self._account_starvation(end)
        window = max((r.job.submit_s for r in self.runs), default=0.0)
        return SimResult(
            policy=self.sp.name,
            workload=self.w.name,
            capacity_millis=self.w.capacity_millis,
            jobs=[r.record for r in self.runs],
            bin_s=self.c.bin_s,
            allocated_bins=[b / self.c.bin_s for b in self.bins],
            allocated_millis_s=self.area,
            overhead_gpu_s=self.overhead_gpu_s,
            lost_gpu_s=self.lost_gpu_s,
            end_s=end,
            window_s=window,
            cycles=self.cycles,
            skipped_cycles=self.skipped_cycles,
            preemptions=self.preemptions,
            failure_requeues=self.failure_requeues,
            node_failures=self.node_failures,
            plan_wall_s=self.plan_wall_s,
            plan_calls=self.plan_calls,
            wall_s=wallclock.perf_counter() - started,
            guarantee_tolerance_s=self.tolerance,
            reclaim_bound_s=self.p.grace_period_s + self.p.min_runtime_before_preempt_s + self.c.cycle_interval_s,
            guarantee_millis=dict(self.guarantee),
            starved_while_borrowed_s=self.starved_while_borrowed_s,
            starved_while_borrowed_beyond_tolerance_s=self.starved_beyond_s,
            preemption_times=list(self.preemption_times),
        )

    def _advance(self, t: float) -> None:
        """Integrate the allocated millis from the last event to ``t`` (into the run total and hourly bins)."""
        if t <= self.now:
            return
        a = self.allocated
        if a:
            self.area += a * (t - self.now)
        width = self.c.bin_s
        cursor = self.now
        while cursor < t:
            b = int(cursor // width)
            while len(self.bins) <= b:
                self.bins.append(0.0)
            edge = min(t, (b + 1) * width)
            self.bins[b] += a * (edge - cursor)
            cursor = edge
        self.now = t

    def _want_cycle(self, t: float) -> None:
        if self.cycle_at is not None:
            return
        at = max(t, self.last_cycle + self.c.cycle_interval_s)
        self.cycle_at = at
        self._push(at, Ev.CYCLE)

    # -- events ----------------------------------------------------------------------------------------------

    def _arrive(self, run: _Run, t: float) -> None:
        run.state = St.QUEUED
        run.queued_at = t
        run.pending = self._pending_job(run)
        self.pending[run.job.job_id] = run
        self._want_cycle(t)

    def _pending_job(self, run: _Run) -> PendingJob:
        j = run.job
        return PendingJob(
            job_id=j.job_id,
            tenant=j.tenant,
            request=ReplicaRequest(
                flavors=j.flavors,
                millis=j.millis,
                memory_mib=j.memory_mib,
                cpu_millicores=j.cpu_millicores,
                host_memory_mib=j.host_memory_mib,
                any_flavor=j.any_flavor,
            ),
            preemptions=run.record.preemptions,
            last_preempted_at=run.preempted_at,
            priority=j.priority,
            preemptible=j.preemptible,
            submitted_at=j.submit_s,
            replicas=j.replicas,
            topology=j.topology,
            preempted_by=run.preempted_by,
            runtime_estimate_s=self._estimate_left(run),
        )

    def _estimate_left(self, run: _Run) -> float | None:
        """What the engine is told the job still needs: the truth with ``runtime_estimates`` (an oracle), else
        the trace's estimate less the work already kept, else nothing."""
        if self.c.runtime_estimates:
            return run.remaining_s
        estimate = run.job.runtime_estimate_s
        if estimate is None:
            return None
        return max(0.0, estimate - (run.job.duration_s - run.remaining_s))

    def _start(self, run: _Run, place: Place, t: float) -> None:
        j = run.job
        del self.pending[j.job_id]
        self._unflag(run, t)
        rec = run.record
        rec.queued_s += t - run.queued_at
        if rec.first_start_s is None:
            rec.first_start_s = t
        overhead = self.c.restart_cost_s if rec.starts else 0.0
        rec.starts += 1
        run.state = St.RUNNING
        run.epoch += 1
        run.started_at = t
        run.productive_from = t + overhead
        estimate = self._estimate_left(run)
        expected = run.productive_from + estimate if estimate is not None else None
        # The simulator runs no inference services: every job is a training job (the default kind).
        allocs = place.allocations(
            priority=j.priority,
            preemptible=j.preemptible,
            started_at=t,
            last_checkpoint_at=run.productive_from,
            expected_end_at=expected,
            preemptions=rec.preemptions,
        )
        held = 0
        for a in place.assignments:
            held += min(a.millis, MILLIS_PER_DEVICE)
            self.node_jobs[a.node].add(j.job_id)
        run.allocs = tuple(allocs)
        run.millis_held = held
        self.allocated += held
        self.tenant_held[j.tenant] += held
        self.tenant_flavor_held[j.tenant][place.flavor] += held
        self.flavor_of[j.job_id] = place.flavor
        self._push(run.productive_from + run.remaining_s, Ev.FINISH, self.index[j.job_id], run.epoch)
        if self.observers:
            nodes = tuple(sorted({a.node for a in place.assignments}))
            for observer in self.observers:
                observer.job_started(j.job_id, t, nodes=nodes, flavor=place.flavor)

    def _release(self, run: _Run) -> None:
        """Free the job's devices."""
        j = run.job
        for a in run.allocs:
            self.node_jobs[a.node].discard(j.job_id)
        self.allocated -= run.millis_held
        self.tenant_held[j.tenant] -= run.millis_held
        flavor = self.flavor_of.pop(j.job_id, None)
        if flavor is not None:
            self.tenant_flavor_held[j.tenant][flavor] -= run.millis_held
        run.allocs = ()
        run.millis_held = 0

    def _finish(self, run: _Run, t: float) -> None:
        self.overhead_gpu_s += run.job.gpus * (run.productive_from - run.started_at)
        self._release(run)
        run.state = St.DONE
        run.remaining_s = 0.0
        run.epoch += 1
        run.record.finish_s = t
        self.done += 1
        for observer in self.observers:
            observer.job_stopped(run.job.job_id, t, reason=StopReason.FINISHED)
        self._want_cycle(t)

    def _stop(self, run: _Run, t: float, *, preempted: bool) -> None:
        """The job stops before it is done (grace over, or its node failed) and goes back to the queue."""
        gpus = run.job.gpus
        self.overhead_gpu_s += gpus * (min(t, run.productive_from) - run.started_at)
        worked = max(0.0, t - run.productive_from)
        if preempted and self.c.checkpoint_on_preempt:
            saved = worked
        elif self.c.checkpoint_interval_s:
            saved = math.floor(worked / self.c.checkpoint_interval_s) * self.c.checkpoint_interval_s
        else:
            saved = 0.0
        saved = min(saved, run.remaining_s)
        self.lost_gpu_s += gpus * (worked - saved)
        run.remaining_s -= saved
        self._release(run)
        for observer in self.observers:
            observer.job_stopped(
                run.job.job_id, t, reason=StopReason.PREEMPTED if preempted else StopReason.NODE_FAILED
            )
        run.state = St.QUEUED
        run.epoch += 1
        run.queued_at = t
        run.pending = self._pending_job(run)
        self.pending[run.job.job_id] = run
        self._want_cycle(t)

    def _preempt(self, victim_id: str, victim_of: str, grace_s: float, t: float) -> None:
        run = self.by_id.get(victim_id)
        if run is None or run.state != St.RUNNING:
            return
        run.state = St.STOPPING
        # Like the Django side, a job being stopped is no longer a preemption candidate.
        run.allocs = tuple(replace(a, preemptible=False) for a in run.allocs)
        run.preempted_by = run.preempted_by | {victim_of}
        run.preempted_at = t
        run.record.preemptions += 1
        self.preemptions += 1
        self.preemption_times.append(t)
        self._push(t + grace_s, Ev.STOP, self.index[victim_id], run.epoch)

    # -- failures --------------------------------------------------------------------------------------------

    def _schedule_failures(self) -> None:
        for at, name, down in self.c.failures:
            if name not in self.node_idx:
                raise ValueError(f"failure schedule names unknown node {name!r}")
            self._push(at, Ev.FAIL, self.node_idx[name], int(down * 1000))
        if self.c.mtbf_s:
            for i in range(len(self.w.nodes)):
                self._push(self.rng.expovariate(1.0 / self.c.mtbf_s), Ev.FAIL, i, int(self.c.repair_s * 1000))

    def _fail(self, name: str, t: float, down_ms: int) -> None:
        if name in self.down:
            return
        if not self._anything_left():
            return  # the replay is over; do not keep a failure chain alive on an idle cluster
        self.down.add(name)
        self.node_failures += 1
        self._rebuild_nodes()
        for job_id in sorted(self.node_jobs.get(name, ())):
            run = self.by_id[job_id]
            if run.state in (St.RUNNING, St.STOPPING):
                run.record.failures += 1
                self.failure_requeues += 1
                self._stop(run, t, preempted=False)
        self._push(t + down_ms / 1000.0, Ev.REPAIR, self._node_index(name))
        self._want_cycle(t)

    def _repair(self, name: str, t: float) -> None:
        self.down.discard(name)
        self._rebuild_nodes()
        if self.c.mtbf_s and self._anything_left():
            delay = self.rng.expovariate(1.0 / self.c.mtbf_s)
            self._push(t + delay, Ev.FAIL, self._node_index(name), int(self.c.repair_s * 1000))
        self._want_cycle(t)

    def _anything_left(self) -> bool:
        return self.done < len(self.runs)

    def _node_index(self, name: str) -> int:
        return self.node_idx[name]

    def _rebuild_nodes(self) -> None:
        self.nodes = tuple(replace(n, schedulable=False) if n.name in self.down else n for n in self.w.nodes)

    # -- a cycle ---------------------------------------------------------------------------------------------

    def _cycle(self, t: float) -> None:
        self.last_cycle = t
        self._decay_usage(t)
        if not self.pending:
            self._flag_starved(t)  # nobody waits: nobody starves from now on
            return
        if not self.p.preemption and self._cannot_place():
            self.skipped_cycles += 1
            self._flag_starved(t)
            return
        self.cycles += 1
        placed = self._plan_and_apply(t, list(self.pending.values()))
        if placed and self.p.preemption and self.tick_at is None:
            # Jobs placed now become preemption candidates after the minimum runtime: look again then.
            self.tick_at = t + self.p.min_runtime_before_preempt_s + 1.0
            self._push(self.tick_at, Ev.TICK)
        self.idle_looks = 0 if placed else self.idle_looks
        self._flag_starved(t)

    def _look_again(self) -> bool:
        """Nothing else will happen, yet preempted jobs wait: what they wait for may be time itself (a
        borrowing back-off, tenants' decaying use), so look again later, as the real beat would — a bounded number of
        times, so a job that can never start does not keep the clock running for ever. False: the run ends."""
        if not self.p.preemption or self.idle_looks >= IDLE_LOOKS:
            return False
        if not any(run.record.preemptions for run in self.pending.values()):
            return False  # only a preempted job waits for time (its back-off, a firm loan's idle guarantee)
        self.idle_looks += 1
        self.tick_at = self.now + self.p.usage_half_life_s / 4
        self._push(self.tick_at, Ev.TICK)
        return True

    def _plan_and_apply(self, t: float, pending: list[_Run]) -> bool:
        if not pending:
            return False
        snapshot = Snapshot(
            now=t,
            nodes=self.nodes,
            allocations=tuple(chain.from_iterable(self.by_id[j].allocs for j in self.flavor_of)),
            tenants=self.tenants,
            quotas=self.quotas,
            usage=self.usage,
            pending=tuple(r.pending for r in pending),
            holds=self.holds,
        )
        began = wallclock.perf_counter()
        result = plan(snapshot, self.p)
        self.plan_wall_s += wallclock.perf_counter() - began
        self.plan_calls += 1
        self.holds = result.holds if self.c.hold_for_preemptor else ()
        for place in result.places:
            run = self.by_id[place.job_id]
            if run.state == St.QUEUED:
                self._start(run, place, t)
        for pre in result.preemptions:
            self._preempt(pre.job_id, pre.victim_of, pre.grace_s, t)
        return bool(result.places)

    def _cannot_place(self) -> bool:
        """True when even the smallest pending job needs more millis than are free in the whole cluster: then
        the engine could place nothing (and, without preemption, decide nothing), so the call is skipped."""
        free = self.capacity - self.allocated - sum(self.node_millis[n] for n in self.down)
        smallest = min((r.job.charged_millis for r in self.pending.values()), default=0)
        return free < smallest

    def _decay_usage(self, t: float) -> None:
        elapsed = t - self.usage_at
        self.usage_at = t
        half_life = self.p.usage_half_life_s
        tenants = set(self.usage) | set(self.tenant_flavor_held)
        usage: dict[str, dict[str, float]] = {}
        for tenant in sorted(tenants):
            flavors = set(self.usage.get(tenant, {})) | set(self.tenant_flavor_held.get(tenant, {}))
            row = {}
            for flavor in sorted(flavors):
                prev = self.usage.get(tenant, {}).get(flavor, 0.0)
                held = self.tenant_flavor_held.get(tenant, {}).get(flavor, 0)
                value = decay_usage(prev, float(held), elapsed, half_life)
                if value > 1e-6:
                    row[flavor] = value
            if row:
                usage[tenant] = row
        self.usage = usage

    def _flag_starved(self, t: float) -> None:
        """A waiting job 'starves' while it is owed room in its tenant's unused guarantee (``JobRecord.starved_s``:
        the room handed out in queue order); the cluster is 'starved while borrowed' while some tenant starves
        and another holds more than its guarantee."""
        self._account_starvation(t)
        starving: set[str] = set()
        beyond: set[str] = set()
        preemptors = {h.job_id for h in self.holds}
        waiting: dict[str, list[_Run]] = defaultdict(list)
        for run in self.pending.values():
            waiting[run.job.tenant].append(run)
        for tenant, runs in waiting.items():
            unused = room = self.guarantee.get(tenant, 0) - self.tenant_held[tenant]
            runs.sort(key=lambda r: (r.job.job_id not in preemptors, r.queue_key))
            for run in runs:
                size = run.job.charged_millis
                alone = size <= unused
                owed = size <= room
                if owed:
                    room -= size
                if alone and run.starved_alone_since is None:
                    run.starved_alone_since = t
                elif not alone:
                    self._close_starved_alone(run, t)
                if owed and run.starved_since is None:
                    run.starved_since = t
                elif not owed:
                    self._close_starved(run, t)
                if run.starved_since is not None:
                    starving.add(tenant)
                    if t - run.starved_since > self.tolerance:
                        beyond.add(tenant)
        borrowing = {x for x, held in self.tenant_held.items() if held > self.guarantee.get(x, 0)}

        def other(tenants: set[str]) -> bool:
            return any(borrowing - {x} for x in tenants)

        self.starve_flags = (other(starving), other(beyond))

    def _account_starvation(self, t: float) -> None:
        if self.starve_at is not None and t > self.starve_at:
            starved, beyond = self.starve_flags
            if starved:
                self.starved_while_borrowed_s += t - self.starve_at
            if beyond:
                self.starved_beyond_s += t - self.starve_at
        self.starve_at = t

    def _close_starved(self, run: _Run, t: float) -> None:
        if run.starved_since is not None:
            waited = t - run.starved_since
            run.record.starved_s += waited
            run.record.longest_starved_s = max(run.record.longest_starved_s, waited)
            run.starved_since = None

    def _close_starved_alone(self, run: _Run, t: float) -> None:
        if run.starved_alone_since is not None:
            run.record.starved_alone_s += t - run.starved_alone_since
            run.starved_alone_since = None

    def _unflag(self, run: _Run, t: float) -> None:
        self._close_starved(run, t)
        self._close_starved_alone(run, t)


def _record(job: SimJob) -> JobRecord:
    return JobRecord(job.job_id, job.tenant, job.submit_s, job.duration_s, job.gpus)


def simulate(
    workload: Workload,
    policy: SimPolicy,
    config: SimConfig | None = None,
    *,
    observers: Sequence[SimObserver] = (),
) -> SimResult:
    """Replay ``workload`` under ``policy`` and return what happened (``observers`` see every start and stop)."""
    return Simulator(workload, policy, config, observers=observers).run()
