"""Start-time estimates: step the real engine forward from a snapshot, with predicted runtimes.

``forecast(snapshot, policy, runtimes)`` answers "when does each pending job start?" by replaying the future
through ``plan`` itself: running jobs end when ``runtimes`` says, each end (and each preemption's grace, and the
end of a placed job's protection from preemption) is an event, and after the events a cycle is planned on the
new state; the engine's places start jobs (which then end after their predicted runtime), its preemptions stop
victims after their grace (they go back to the queue with the work they had left), its holds are passed back.
No rule of its own: whoever the engine would serve next is served next. What it cannot know is what has not
happened yet — jobs submitted later, node failures, cancellations — and how long jobs really run.

Bounded work, stated: cycles are at least ``Limits.min_step_s`` apart and, further out, at least
``Limits.relative_step`` of the time already looked ahead (so an estimate hours away is as coarse as a few
percent of it); it stops after ``Limits.max_cycles`` cycles or ``Limits.horizon_s`` of simulated time, and the
jobs not started by then have no estimate. A job started by a cycle is given the time of the latest event
before that cycle (when the capacity it took was freed), which is at most one step late.

``estimate_starts`` runs three forecasts (short, median and long runtimes, e.g. the 10th, 50th and 90th
percentile of each job's prediction; the short and long ones with coarser steps, ``band_limits``) and returns a
band per job. A queue is not monotonic in its runtimes (a
job that ends sooner can let another job in first), so the band is made ordered: p10 is the earlier of the short
and median starts, p90 the later of the long and median ones.

Pure: no Django, no clock (``snapshot.now`` is the time), deterministic for the same inputs.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from itertools import chain

from .engine import plan
from .order import decay_usage
from .types import (
    MILLIS_PER_DEVICE,
    Allocation,
    JobKind,
    PendingJob,
    PendingReason,
    Place,
    Policy,
    ReplicaRequest,
    Reservation,
    Snapshot,
)

# Reasons no later cycle can change in a forecast (nodes, quotas and approvals stay as they are): such jobs are
# taken out of the queue after the first cycle instead of being looked at again every cycle.
_NEVER_IN_FORECAST = frozenset(
    {
        PendingReason.AWAITING_APPROVAL,
        PendingReason.INVALID_REQUEST,
        PendingReason.NEVER_FITS,
        PendingReason.NO_QUOTA,
        PendingReason.NO_SUCH_FLAVOR,
        PendingReason.NO_MATCHING_NODE,
    }
)


@dataclass(frozen=True, slots=True)
class Runtimes:
    """Predicted times, in seconds, by job id. ``math.inf`` means "does not end" (an inference service)."""

    remaining_s: Mapping[str, float] = field(default_factory=dict)  # running job → time until it ends
    runtime_s: Mapping[str, float] = field(default_factory=dict)  # pending job → how long it runs once started
    default_s: float = 3600.0  # a job in neither map (running: unless its allocation states ``expected_end_at``)


@dataclass(frozen=True, slots=True)
class Limits:
    """How far and how finely a forecast looks ahead (its cost is about one ``plan`` per cycle)."""

    horizon_s: float = 7 * 86400.0
    max_cycles: int = 100
    min_step_s: float = 60.0
    relative_step: float = 0.1


class StopReason(StrEnum):
    DONE = "done"  # every job that could start has started
    NO_EVENTS = "no_events"  # nothing left that could change what runs
    HORIZON = "horizon"
    MAX_CYCLES = "max_cycles"
    OUT_OF_TIME = "out_of_time"  # the caller's ``out_of_time`` said so (a wall-clock budget)


@dataclass(frozen=True, slots=True)
class Forecast:
    starts: Mapping[str, float]  # pending job id → simulated first start (epoch seconds)
    never: frozenset[str]  # jobs that cannot start whatever ends (awaiting approval, invalid, no such flavor …)
    cycles: int
    reached_at: float  # the simulated time the forecast got to
    stopped: StopReason


@dataclass(frozen=True, slots=True)
class StartBand:
    """A job's estimated start (epoch seconds); None: not within the forecast's limits (later, or never)."""

    p10_at: float | None
    p50_at: float | None
    p90_at: float | None


class _Ev(IntEnum):
    """Event kinds; at equal times a job's end goes before a victim's stop (both free capacity)."""

    END = 0
    STOP = 1
    TICK = 2


class _Forward:
    def __init__(self, snapshot: Snapshot, policy: Policy, runtimes: Runtimes, limits: Limits) -> None:
        self.s = snapshot
        self.p = policy
        self.rt = runtimes
        self.lim = limits
        self.start_s = snapshot.now
        self.allocs: dict[str, list[Allocation]] = defaultdict(list)
        for a in snapshot.allocations:
            self.allocs[a.job_id].append(a)
        self.pending: dict[str, PendingJob] = {j.job_id: j for j in snapshot.pending}
        self.holds = snapshot.holds
        self.reservations = list(snapshot.reservations)
        self.usage = {t: dict(f) for t, f in snapshot.usage.items()}
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self.epoch: dict[str, int] = defaultdict(int)
        self.end_at: dict[str, float] = {}
        self.stopping: set[str] = set()
        self.known: dict[str, PendingJob] = dict(self.pending)  # every job that was pending, for requeues
        self.left_s: dict[str, float] = {}  # requeued victims: the work they had left
        self.starts: dict[str, float] = {}
        self.never: set[str] = set()
        self.victim_of: dict[str, frozenset[str]] = {}  # victim → the jobs it was stopped for
        self.tick_at: float | None = None
        self.usage_at = snapshot.now
        self._schedule_running()

    def _push(self, at: float, kind: _Ev, job_id: str = "") -> None:
        if math.isinf(at):
            return
        self.seq += 1
        heapq.heappush(self.heap, (at, int(kind), self.seq, job_id, self.epoch[job_id]))

    def _schedule_running(self) -> None:
        now = self.start_s
        stopping_since: dict[str, float] = {}
        for hold in self.s.holds:
            for victim in hold.victims:
                stopping_since[victim] = min(stopping_since.get(victim, hold.since), hold.since)
        for job_id, rows in self.allocs.items():
            if job_id in self.rt.remaining_s:
                end = now + max(0.0, self.rt.remaining_s[job_id])
            else:
                stated = [a.expected_end_at for a in rows if a.expected_end_at is not None]
                end = max(now, min(stated)) if stated else now + self.rt.default_s
            self.end_at[job_id] = end
            self._push(end, _Ev.END, job_id)
            if job_id in stopping_since:  # asked to stop: it goes when its grace is over (or ends before)
                self.stopping.add(job_id)
                stop = max(now, stopping_since[job_id] + self.p.grace_period_s)
                if stop < end:
                    self._push(stop, _Ev.STOP, job_id)

    # -- the loop --------------------------------------------------------------------------------------------

    def run(self, until_started: Collection[str] | None, out_of_time: Callable[[], bool] | None) -> Forecast:
        lim = self.lim
        t = self.start_s
        started_at = t
        cycles = 0
        waiting_for = set(until_started) if until_started is not None else None
        while True:
            self._cycle(t, started_at)
            cycles += 1
            if waiting_for is not None:
                waiting_for -= self.starts.keys() | self.never
                if not waiting_for:
                    return self._result(cycles, t, StopReason.DONE)
            if not self.pending:
                return self._result(cycles, t, StopReason.DONE)
            if cycles >= lim.max_cycles:
                return self._result(cycles, t, StopReason.MAX_CYCLES)
            if out_of_time is not None and out_of_time():
                return self._result(cycles, t, StopReason.OUT_OF_TIME)
            if not self.heap:
                return self._result(cycles, t, StopReason.NO_EVENTS)
            step = max(lim.min_step_s, lim.relative_step * (t - self.start_s))
            t_next = max(self.heap[0][0], t + step)
            if t_next > self.start_s + lim.horizon_s:
                return self._result(cycles, t, StopReason.HORIZON)
            latest = None
            while self.heap and self.heap[0][0] <= t_next:
                at, kind, _seq, job_id, epoch = heapq.heappop(self.heap)
                if self._apply(_Ev(kind), job_id, epoch, at):
                    latest = at
            started_at = latest if latest is not None else t_next
            t = t_next

    def _result(self, cycles: int, t: float, why: StopReason) -> Forecast:
        return Forecast(starts=dict(self.starts), never=frozenset(self.never), cycles=cycles, reached_at=t, stopped=why)

    def _apply(self, kind: _Ev, job_id: str, epoch: int, at: float) -> bool:
        """Apply one event; True when it freed capacity (not a tick, nor a job that ended or stopped already)."""
        if kind == _Ev.TICK:
            self.tick_at = None
            return False
        if self.epoch[job_id] != epoch or job_id not in self.allocs:
            return False
        rows = self.allocs.pop(job_id)
        self.epoch[job_id] += 1
        self.stopping.discard(job_id)
        if kind == _Ev.STOP:
            self._requeue(job_id, rows, at)
        return True

    def _requeue(self, job_id: str, rows: list[Allocation], at: float) -> None:
        """A preempted job goes back to the queue with the work it had left (plus the restart's cost)."""
        self.left_s[job_id] = max(0.0, self.end_at.get(job_id, at) - at) + self.p.restart_cost_s
        job = self.known.get(job_id) or _pending_from(rows)
        self.pending[job_id] = replace(
            job,
            preemptions=job.preemptions + 1,
            preempted_by=job.preempted_by | self.victim_of.get(job_id, frozenset()),
        )

    # -- one cycle -------------------------------------------------------------------------------------------

    def _cycle(self, t: float, started_at: float) -> None:
        self._decay_usage(t)
        if not self.pending:
            return
        snapshot = Snapshot(
            now=t,
            nodes=self.s.nodes,
            allocations=tuple(chain.from_iterable(self.allocs.values())),
            tenants=self.s.tenants,
            quotas=self.s.quotas,
            usage=self.usage,
            pending=tuple(self.pending.values()),
            reservations=tuple(self.reservations),
            holds=self.holds,
        )
        result = plan(snapshot, self.p)
        self.holds = result.holds
        for place in result.places:
            self._start(place, started_at)
        for pre in result.preemptions:
            if pre.job_id in self.allocs and pre.job_id not in self.stopping:
                self.stopping.add(pre.job_id)
                self.allocs[pre.job_id] = [replace(a, preemptible=False) for a in self.allocs[pre.job_id]]
                self.victim_of[pre.job_id] = self.victim_of.get(pre.job_id, frozenset()) | {pre.victim_of}
                self._push(t + pre.grace_s, _Ev.STOP, pre.job_id)
        for why in result.explanations:
            if why.code in _NEVER_IN_FORECAST and why.job_id in self.pending:
                del self.pending[why.job_id]
                self.never.add(why.job_id)
        if result.places and self.p.preemption and self.tick_at is None:
            # Jobs placed now may be preempted once their minimum runtime is over: look again then.
            self.tick_at = t + self.p.min_runtime_before_preempt_s + 1.0
            self._push(self.tick_at, _Ev.TICK)

    def _start(self, place: Place, at: float) -> None:
        job = self.pending.pop(place.job_id, None)
        if job is None:
            return
        self.starts.setdefault(job.job_id, at)
        joining = job.job_id in self.allocs  # a running inference service scaling up
        self.allocs[job.job_id].extend(
            place.allocations(
                priority=job.priority,
                preemptible=job.preemptible,
                started_at=at,
                last_checkpoint_at=at,
                # What the live engine is told (a pending job carries its runtime estimate), not our guess.
                expected_end_at=at + job.runtime_estimate_s if job.runtime_estimate_s else None,
                kind=job.kind,
                preemptions=job.preemptions,
            )
        )
        self.reservations.extend(
            Reservation(job.job_id, job.tenant, r.node, r.device_uuid, place.flavor, r.millis, r.memory_mib)
            for r in place.reserved
        )
        if joining:
            return  # the service's own end (if any) stays as it was
        if job.job_id in self.left_s:
            runtime = self.left_s.pop(job.job_id)
        elif job.kind == JobKind.INFERENCE:
            runtime = self.rt.runtime_s.get(job.job_id, math.inf)
        else:
            runtime = self.rt.runtime_s.get(job.job_id, self.rt.default_s)
        self.end_at[job.job_id] = at + runtime
        self._push(at + runtime, _Ev.END, job.job_id)

    def _decay_usage(self, t: float) -> None:
        elapsed = t - self.usage_at
        self.usage_at = t
        if elapsed <= 0:
            return
        held: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for rows in self.allocs.values():
            for a in rows:
                held[a.tenant][a.flavor] += a.millis
        half_life = self.p.usage_half_life_s
        usage: dict[str, dict[str, float]] = {}
        for tenant in sorted(set(self.usage) | set(held)):
            before = self.usage.get(tenant, {})
            now_held = held.get(tenant, {})
            row = {
                flavor: decay_usage(before.get(flavor, 0.0), now_held.get(flavor, 0.0), elapsed, half_life)
                for flavor in sorted(set(before) | set(now_held))
            }
            row = {flavor: value for flavor, value in row.items() if value > 1e-6}
            if row:
                usage[tenant] = row
        self.usage = usage


def _pending_from(rows: list[Allocation]) -> PendingJob:
    """A running job of the snapshot that is preempted in the forecast, as the pending job it becomes (its
    request read back from its allocations; a node selector or topology it had is not known here)."""
    first = rows[0]
    replicas = sorted({a.replica for a in rows})
    of_first = [a for a in rows if a.replica == replicas[0]]
    millis = of_first[0].millis if first.millis < MILLIS_PER_DEVICE else len(of_first) * MILLIS_PER_DEVICE
    request = ReplicaRequest(
        flavors=(first.flavor,),
        millis=millis,
        memory_mib=first.memory_mib if millis < MILLIS_PER_DEVICE else 0,
        cpu_millicores=sum(a.cpu_millicores for a in of_first),
        host_memory_mib=sum(a.host_memory_mib for a in of_first),
    )
    return PendingJob(
        job_id=first.job_id,
        tenant=first.tenant,
        request=request,
        priority=first.priority,
        preemptible=True,
        submitted_at=first.started_at,
        kind=first.kind,
        replicas=len(replicas),
        preemptions=first.preemptions,
    )


def time_left(predicted_s: float, elapsed_s: float, *, overdue_s: float, max_runtime_s: float | None = None) -> float:
    """What a running job has left: its predicted runtime less the time it has run; ``overdue_s`` once it has run
    past the prediction (it has not ended, so it ends some time later); never past its ``max_runtime_s``.

    (Conditioning on the jobs like it that ran longer than it has — "a job that has run for hours is one of the
    long ones" — was tried: better median error on the Philly replay, a far worse 90th percentile; docs/eta.md.)
    """
    left = predicted_s - elapsed_s
    if left <= 0:
        left = overdue_s
    if max_runtime_s:
        left = min(left, max(0.0, max_runtime_s - elapsed_s))
    return left


def residual_left(
    ordered: Sequence[float], elapsed_s: float, q: float, *, overdue_s: float, max_runtime_s: float | None = None
) -> float:
    """What a running job has left when its runtime is predicted from the pool's runtimes (``ordered``, sorted),
    not from jobs of its own: the ``q`` quantile of the runtimes longer than it has run, less what it has run;
    ``overdue_s`` when none ran that long; never past its ``max_runtime_s``.

    Why: a job still running is not a fresh draw from the pool — the short ones have ended. Its pool median less
    its time so far called most running jobs nearly done, so the forecast was consistently early (Philly replay
    without history: signed error -41 min on the jobs that waited; none within ±20 %/10 min, against 38 % with
    this; benchmarks/eta_accuracy.py). With a job's own history the plain rule (``time_left``) is kept: there
    conditioning made the 90th-percentile error worse.
    """
    longer = ordered[bisect.bisect_right(ordered, elapsed_s) :]
    left = quantile(longer, q) - elapsed_s if longer else overdue_s
    if max_runtime_s:
        left = min(left, max(0.0, max_runtime_s - elapsed_s))
    return max(0.0, left)


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ordered`` (linear between neighbours, as numpy's default)."""
    if not ordered:
        raise ValueError("no values")
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def forecast(
    snapshot: Snapshot,
    policy: Policy,
    runtimes: Runtimes,
    limits: Limits | None = None,
    *,
    until_started: Collection[str] | None = None,
    out_of_time: Callable[[], bool] | None = None,
) -> Forecast:
    """Simulated first start of every pending job of ``snapshot`` (see the module's docstring).

    ``until_started``: stop as soon as these jobs have started (or are known never to), instead of when every
    pending job has — the cheaper question "when does *this* job start?". ``out_of_time``: asked after every
    cycle; True stops the forecast there (the caller's wall-clock budget: the core reads no clock itself).
    """
    return _Forward(snapshot, policy, runtimes, limits or Limits()).run(until_started, out_of_time)


def estimate_starts(
    snapshot: Snapshot,
    policy: Policy,
    *,
    short: Runtimes,
    median: Runtimes,
    long: Runtimes,
    limits: Limits | None = None,
) -> dict[str, StartBand]:
    """A start band for every pending job of ``snapshot``: forecasts with short, median and long runtimes."""
    limits = limits or Limits()
    low = forecast(snapshot, policy, short, band_limits(limits)).starts
    mid = forecast(snapshot, policy, median, limits).starts
    high = forecast(snapshot, policy, long, band_limits(limits)).starts
    return bands_from(snapshot, low, mid, high)


def band_limits(limits: Limits) -> Limits:
    """The limits of the short and long forecasts: five times the minimum step and twice the relative one (at
    least 0.2) — the band's edges are a range, not a time to the minute, and they cost two of three forecasts."""
    return replace(limits, min_step_s=5 * limits.min_step_s, relative_step=max(0.2, 2 * limits.relative_step))


def bands_from(
    snapshot: Snapshot, short: Mapping[str, float], median: Mapping[str, float], long: Mapping[str, float]
) -> dict[str, StartBand]:
    """The band of every pending job from the starts of three forecasts (short, median, long runtimes)."""
    bands = {}
    for job in snapshot.pending:
        p50 = median.get(job.job_id)
        if p50 is None:
            bands[job.job_id] = StartBand(None, None, None)
            continue
        short_start, long_start = short.get(job.job_id), long.get(job.job_id)
        p10 = p50 if short_start is None else min(short_start, p50)
        p90 = None if long_start is None else max(long_start, p50)  # None: later than the long forecast looked
        bands[job.job_id] = StartBand(p10_at=p10, p50_at=p50, p90_at=p90)
    return bands


# -- calibration and age ------------------------------------------------------------------------------------

# Errors are ratios of (wait + one cycle): a job that starts at once has a wait of 0, and a one-minute miss on a
# one-minute wait is not as wrong as an hour's miss on an hour's wait.
CALIBRATION_OFFSET_S = 60.0
# Edges of the forecast-wait classes (seconds): the forecast is near-exact for a job that fits now and far less
# so hours out, so each class is calibrated apart (Mondrian conformal prediction).
WAIT_CLASS_EDGES_S = (60.0, 1800.0, 3 * 3600.0)


def wait_class(forecast_wait_s: float) -> str:
    """The class of a forecast wait: "now" (under a minute), "short" (30 min), "long" (3 h) or "longer"."""
    for edge, name in zip(WAIT_CLASS_EDGES_S, ("now", "short", "long"), strict=True):
        if forecast_wait_s < edge:
            return name
    return "longer"


def size_class(devices: float) -> str:
    """The class of a request's size (cards over all replicas): "part", "1", "2-4", "5-8" or "9+"."""
    if devices < 1:
        return "part"
    if devices <= 1:
        return "1"
    return "2-4" if devices <= 4 else "5-8" if devices <= 8 else "9+"


class Calibration:
    """Past errors of the median forecast, per class, to turn it into a calibrated band (split conformal).

    ``add`` records one job's error once it has started: log((actual wait + c) / (forecast wait + c)), under
    each of ``keys`` (most specific first, e.g. (wait class, tenant, size), (wait class, size), (wait class,)).
    ``band`` answers with the most specific key that has at least ``min_samples`` errors: the forecast wait
    scaled by their 10th and 90th percentile (p10, p90; the median is the forecast's own). If the past is like
    the future (the errors exchangeable), about 80 % of starts fall inside p10 to p90 whatever the forecast's own
    bias: it is measured, not assumed.
    Only the last ``max_samples`` errors of a key are kept (the pool changes). None: no key has enough — the
    caller has no calibrated band ("unknown" beats a band no past supports).
    """

    def __init__(self, *, min_samples: int = 30, max_samples: int = 2000) -> None:
        self.min_samples = min_samples
        self.max_samples = max_samples
        self.errors: dict[tuple[str, ...], list[float]] = defaultdict(list)

    def add(self, keys: Sequence[tuple[str, ...]], forecast_wait_s: float, actual_wait_s: float) -> None:
        error = math.log(
            (max(0.0, actual_wait_s) + CALIBRATION_OFFSET_S) / (max(0.0, forecast_wait_s) + CALIBRATION_OFFSET_S)
        )
        for key in keys:
            errors = self.errors[key]
            errors.append(error)
            if len(errors) > self.max_samples:
                del errors[: len(errors) - self.max_samples]

    def samples(self, keys: Sequence[tuple[str, ...]]) -> tuple[tuple[str, ...], int] | None:
        """The key that would answer and how many errors it has; None when none has ``min_samples``."""
        for key in keys:
            if len(self.errors.get(key, ())) >= self.min_samples:
                return key, len(self.errors[key])
        return None

    def band(self, keys: Sequence[tuple[str, ...]], *, now: float, forecast_wait_s: float) -> StartBand | None:
        found = self.samples(keys)
        if found is None:
            return None
        ordered = sorted(self.errors[found[0]])
        n = len(ordered)
        # The finite-sample correction of split conformal: the ceil((n + 1) q) / n quantile of n errors.
        low = quantile(ordered, max(0.0, 1 - 0.9 * (n + 1) / n))
        high = quantile(ordered, min(1.0, 0.9 * (n + 1) / n))
        base = max(0.0, forecast_wait_s) + CALIBRATION_OFFSET_S

        def at(error: float) -> float:
            return now + max(0.0, base * math.exp(error) - CALIBRATION_OFFSET_S)

        # The median stays the forecast's: scaled by the past errors' median it moved hours off (the errors of
        # the days before are not today's; benchmarks/eta_accuracy.py: median error 1.7 min unscaled, 22.8
        # scaled). The errors set the band, widened to hold the median.
        median_at = now + max(0.0, forecast_wait_s)
        return StartBand(p10_at=min(at(low), median_at), p50_at=median_at, p90_at=max(at(high), median_at))

    def as_dict(self) -> dict[str, list[float]]:
        """The errors by key joined with "|" (to store it as JSON)."""
        return {"|".join(key): list(errors) for key, errors in self.errors.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Sequence[float]], **kwargs: int) -> Calibration:
        calibration = cls(**kwargs)
        for key, errors in data.items():
            calibration.errors[tuple(key.split("|")) if key else ()] = [float(e) for e in errors]
        return calibration


def age_aware(
    fresh: StartBand, previous: StartBand | None, *, now: float, submitted_at: float, slack_s: float = 60.0
) -> StartBand:
    """The band to show now, given the one shown before: a job still waiting past the previous band's p90 (or,
    with no p90, past its median) has proved the forecast wrong — the forecast sees something happen that does
    not (a reclaim, a node coming back) or misses arrivals served first — so repeating "in 5 minutes" would
    repeat a wrong figure. Such a job gets a median no earlier than ``now`` plus the time it has waited (the
    longer it has waited past every estimate, the longer it is likely to wait: doubling, not a fixed step), and
    no p90 ("possibly much later": unknown). An open-ended band stays open-ended, its median moving out with the
    wait, so a fresh forecast cannot pull it back to the figure that failed; only a fresh band that starts after
    that median (something changed) is shown as it is.
    """
    if previous is None or previous.p50_at is None or fresh.p50_at is None:
        return fresh
    limit = previous.p90_at if previous.p90_at is not None else previous.p50_at
    failed = now > limit + slack_s or previous.p90_at is None
    floor = now + max(slack_s, now - submitted_at)
    fresh_p10 = fresh.p10_at if fresh.p10_at is not None else fresh.p50_at
    if not failed or fresh_p10 > floor:
        return fresh
    p50 = max(fresh.p50_at, floor)
    return StartBand(p10_at=max(now, min(fresh_p10, p50)), p50_at=p50, p90_at=None)


__all__ = [
    "CALIBRATION_OFFSET_S",
    "Calibration",
    "Forecast",
    "Limits",
    "Runtimes",
    "StartBand",
    "StopReason",
    "age_aware",
    "band_limits",
    "bands_from",
    "estimate_starts",
    "forecast",
    "quantile",
    "residual_left",
    "size_class",
    "time_left",
    "wait_class",
]
