"""Start-time estimates of pending jobs: "when will my job start?".

Three steps, refreshed by the ``scheduler.estimate_starts`` task (``job_start_estimates_refresh``):

1. **Predict runtimes** (``RuntimeHistory``): for each running and pending job, a short, a median and a long
   runtime (10th, 50th and 90th percentile) from, in this order, the same user's last finished jobs of the same
   name, or of the same command; the job's own ``runtime_estimate_s`` (spread like the pool's recent jobs); the
   tenant's recent jobs; the pool's recent jobs; ``GPUPOOL_ETA_DEFAULT_RUNTIME_S``. Always capped by the job's
   ``max_runtime_s``. A running job has its predicted runtime minus the time since it started left (at least
   ``OVERDUE_REMAINING_S`` when it has run past the prediction); one predicted from the pool's jobs has what the
   pool's jobs that ran longer than it has had left (``core_eta.residual_left``).
2. **Forecast** (``scheduler.core.eta``): the live snapshot stepped forward through the engine itself, once per
   percentile; the band is the three forecasts' starts.
3. **Calibrate** (``core_eta.Calibration``): the median forecast's wait is scaled by the 10th and 90th
   percentile of the errors past estimates of its class made (forecast wait, tenant, size; the most specific
   class with ``CALIBRATION_MIN_ERRORS``), so that about 80 % of starts fall inside the band; the median stays
   the forecast's. Each job's first
   estimate is remembered in the cache; once the job has started, its error joins the calibration. Without
   enough errors yet, the three forecasts' band is shown. Then the age rule (``core_eta.age_aware``): a job
   still waiting past the band it was shown gets a wider, open-ended band instead of the same figure again.
4. **Write** every pending job's ``estimated_start_at`` (median), ``estimated_start_p10_at``,
   ``estimated_start_p90_at`` and ``estimated_at`` in one UPDATE. No start within the forecast's limits
   (``GPUPOOL_ETA_HORIZON_S``, ``GPUPOOL_ETA_MAX_CYCLES``), or a job that cannot start (awaiting approval,
   no such flavor), leaves them empty.

A job's runtime in the history is ``finished_at - started_at`` (its first start: a job preempted and restarted
counts its time back in the queue as well).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from kernel.db.bulk import AnyOf, update_rows
from kernel.task_queue import task_queue
from scheduler import snapshot as live
from scheduler.core import eta as core_eta
from scheduler.core import types as core
from scheduler.models import Job, JobKind, JobState
from scheduler.scheduling_policy import policy_from_settings

logger = logging.getLogger(__name__)

# When the last refresh ended and how long it took ({"at": epoch s, "took_s": s}); the throttle reads it.
LAST_REFRESH_KEY = "scheduler:eta:last"
# Held while a refresh runs, so two workers never compute at once; the TTL frees it if its worker dies.
RUNNING_KEY = "scheduler:eta:running"
RUNNING_TTL_S = 900
# After a big change a refresh may come this soon after the last one (still never more often than one takes).
CHANGE_MIN_GAP_S = 5.0
# A group of past jobs predicts only with at least this many members.
MIN_HISTORY_JOBS = 3
# A running job past its predicted runtime is assumed to end this much later (it has not ended yet).
OVERDUE_REMAINING_S = 300.0
# The spread (p10/p50, p90/p50) used around a runtime estimate or the default when the pool has no history.
DEFAULT_SPREAD = (0.5, 2.0)
# At most this many finished jobs are read for the predictions (the most recent ones).
HISTORY_MAX_ROWS = 50_000
_FINISHED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
# The calibration's past errors by class, and each pending job's first estimate (job id → [made at, forecast
# wait s, class keys]) until it starts; both in the cache, JSON-shaped.
CALIBRATION_KEY = "scheduler:eta:calibration"
FIRST_ESTIMATES_KEY = "scheduler:eta:first"
# A class calibrates with at least this many errors (else a coarser class; else the forecasts' own band).
CALIBRATION_MIN_ERRORS = 30
CALIBRATION_MAX_ERRORS = 2000


@dataclass(frozen=True, slots=True)
class RuntimePrediction:
    """Predicted runtime of one job in seconds (10th, 50th and 90th percentile) and where it came from."""

    p10_s: float
    p50_s: float
    p90_s: float
    source: str  # "name", "command", "estimate", "tenant", "pool" or "default"


def _band(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    return core_eta.quantile(ordered, 0.1), core_eta.quantile(ordered, 0.5), core_eta.quantile(ordered, 0.9)


@dataclass(frozen=True, slots=True)
class _Job:
    """The fields of a job a prediction looks at."""

    pk: int
    submitter_id: int | None
    tenant_id: int
    name: str
    command: str  # the command list as text (a key)
    runtime_estimate_s: int | None
    max_runtime_s: int | None
    started_at: datetime | None
    kind: str


class RuntimeHistory:
    """Recent finished jobs' runtimes, grouped the ways a prediction looks them up.

    ``rows`` are (submitter id, tenant id, name, command as text, runtime seconds), most recent first.
    """

    def __init__(self, rows: Sequence[tuple[int | None, int, str, str, float]], *, per_group: int) -> None:
        self.by_name: dict[tuple, list[float]] = defaultdict(list)
        self.by_command: dict[tuple, list[float]] = defaultdict(list)
        self.by_tenant: dict[int, list[float]] = defaultdict(list)
        self.pool: list[float] = []
        for submitter_id, tenant_id, name, command, runtime_s in rows:
            if submitter_id is not None:
                for groups, key in ((self.by_name, (submitter_id, name)), (self.by_command, (submitter_id, command))):
                    if len(groups[key]) < per_group:
                        groups[key].append(runtime_s)
            if len(self.by_tenant[tenant_id]) < per_group * 10:
                self.by_tenant[tenant_id].append(runtime_s)
            self.pool.append(runtime_s)
        self.pool_band = _band(self.pool) if len(self.pool) >= MIN_HISTORY_JOBS else None
        self.pool_sorted = tuple(sorted(self.pool))

    @classmethod
    def load(cls, *, now: datetime, submitter_ids: Collection[int] | None = None) -> RuntimeHistory:
        """The last ``HISTORY_MAX_ROWS`` jobs finished in the last ``GPUPOOL_ETA_HISTORY_DAYS`` (one query)."""
        since = now - timedelta(days=settings.GPUPOOL_ETA_HISTORY_DAYS)
        rows = (
            Job.objects.filter(state__in=_FINISHED, started_at__isnull=False, finished_at__gte=since)
            .exclude(kind=JobKind.INFERENCE)
            .order_by("-finished_at", "-id")
            .values_list("submitter_id", "tenant_id", "name", "command", "started_at", "finished_at")[:HISTORY_MAX_ROWS]
        )
        history = [
            (submitter_id, tenant_id, name, _command_key(command), max(1.0, (finished - started).total_seconds()))
            for submitter_id, tenant_id, name, command, started, finished in rows
        ]
        return cls(history, per_group=settings.GPUPOOL_ETA_HISTORY_JOBS)

    def predict(self, job: _Job, *, use_history: bool = True) -> RuntimePrediction:
        """The job's runtime percentiles (see the module's docstring for the order of the sources)."""
        prediction = self._uncapped(job, use_history=use_history)
        cap = float(job.max_runtime_s) if job.max_runtime_s else math.inf
        return RuntimePrediction(
            p10_s=min(prediction.p10_s, cap),
            p50_s=min(prediction.p50_s, cap),
            p90_s=min(prediction.p90_s, cap),
            source=prediction.source,
        )

    def _uncapped(self, job: _Job, *, use_history: bool) -> RuntimePrediction:
        if use_history and job.submitter_id is not None:
            for groups, key, source in (
                (self.by_name, (job.submitter_id, job.name), "name"),
                (self.by_command, (job.submitter_id, job.command), "command"),
            ):
                samples = groups.get(key, ())
                if len(samples) >= MIN_HISTORY_JOBS:
                    return RuntimePrediction(*_band(list(samples)), source=source)
        low, high = self._spread()
        if job.runtime_estimate_s:
            p50 = float(job.runtime_estimate_s)
            return RuntimePrediction(p50 * low, p50, p50 * high, source="estimate")
        if use_history:
            samples = self.by_tenant.get(job.tenant_id, ())
            if len(samples) >= MIN_HISTORY_JOBS:
                return RuntimePrediction(*_band(list(samples)), source="tenant")
            if self.pool_band is not None:
                return RuntimePrediction(*self.pool_band, source="pool")
        p50 = float(settings.GPUPOOL_ETA_DEFAULT_RUNTIME_S)
        return RuntimePrediction(p50 * low, p50, p50 * high, source="default")

    def _spread(self) -> tuple[float, float]:
        if self.pool_band is None or self.pool_band[1] <= 0:
            return DEFAULT_SPREAD
        p10, p50, p90 = self.pool_band
        return p10 / p50, p90 / p50


def _command_key(command: Any) -> str:
    return "\x1f".join(str(part) for part in command) if isinstance(command, list) else str(command)


def _jobs(pks: Collection[int]) -> dict[int, _Job]:
    if not pks:
        return {}
    rows = Job.objects.filter(AnyOf("pk", pks)).values_list(
        "pk",
        "submitter_id",
        "tenant_id",
        "name",
        "command",
        "runtime_estimate_s",
        "max_runtime_s",
        "started_at",
        "kind",
    )
    return {
        row[0]: _Job(row[0], row[1], row[2], row[3], _command_key(row[4]), row[5], row[6], row[7], row[8])
        for row in rows
    }


def forecast_runtimes(
    snap: core.Snapshot, jobs: dict[int, _Job], history: RuntimeHistory
) -> tuple[core_eta.Runtimes, core_eta.Runtimes, core_eta.Runtimes]:
    """Short, median and long ``Runtimes`` for a forecast of ``snap``: every running job's time left and every
    pending job's runtime. Inference services are left out (the forecast lets them run on)."""
    now = snap.now
    default = float(settings.GPUPOOL_ETA_DEFAULT_RUNTIME_S)
    remaining: tuple[dict[str, float], ...] = ({}, {}, {})
    runtime: tuple[dict[str, float], ...] = ({}, {}, {})
    placed_at: dict[str, float] = {}
    for allocation in snap.allocations:
        placed_at[allocation.job_id] = min(placed_at.get(allocation.job_id, now), allocation.started_at)
    for job_id, placed in placed_at.items():
        job = jobs.get(int(job_id))
        if job is None:
            continue
        if job.kind == JobKind.INFERENCE:
            for table in remaining:
                table[job_id] = math.inf
            continue
        prediction = history.predict(job)
        # Since it first started (an admitted job that has not reported running yet: since it was placed).
        elapsed = max(0.0, now - (job.started_at.timestamp() if job.started_at else placed))
        if prediction.source == "pool":  # no runs of its own: what the pool's jobs that ran this long had left
            for table, q in zip(remaining, (0.1, 0.5, 0.9), strict=True):
                table[job_id] = core_eta.residual_left(
                    history.pool_sorted, elapsed, q, overdue_s=OVERDUE_REMAINING_S, max_runtime_s=job.max_runtime_s
                )
            continue
        for table, predicted in zip(remaining, (prediction.p10_s, prediction.p50_s, prediction.p90_s), strict=True):
            table[job_id] = core_eta.time_left(
                predicted, elapsed, overdue_s=OVERDUE_REMAINING_S, max_runtime_s=job.max_runtime_s
            )
    for pending in snap.pending:
        job = jobs.get(int(pending.job_id))
        if job is None or job.kind == JobKind.INFERENCE:
            continue
        prediction = history.predict(job)
        for table, predicted in zip(runtime, (prediction.p10_s, prediction.p50_s, prediction.p90_s), strict=True):
            table[pending.job_id] = predicted
    short, median, long = (
        core_eta.Runtimes(remaining_s=left, runtime_s=runs, default_s=default)
        for left, runs in zip(remaining, runtime, strict=True)
    )
    return short, median, long


def limits_from_settings() -> core_eta.Limits:
    return core_eta.Limits(horizon_s=float(settings.GPUPOOL_ETA_HORIZON_S), max_cycles=settings.GPUPOOL_ETA_MAX_CYCLES)


def _to_timestamp_sql(column: str) -> str:
    """SQL turning epoch seconds (a double) into the database's datetime (NULL stays NULL)."""
    if connection.vendor == "postgresql":
        return f"to_timestamp(v.{column})"
    return f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', v.{column}, 'unixepoch')"


def estimates_write(bands: dict[str, core_eta.StartBand], *, now: datetime) -> int:
    """Store every band on its job (still pending) in one UPDATE; returns the rows written."""
    rows = [(int(job_id), band.p10_at, band.p50_at, band.p90_at) for job_id, band in bands.items()]
    pending = ", ".join(f"'{state.value}'" for state in (JobState.QUEUED, JobState.PENDING_APPROVAL))
    return update_rows(
        Job,
        columns=(
            ("id", "bigint"),
            ("p10", "double precision"),
            ("p50", "double precision"),
            ("p90", "double precision"),
        ),
        rows=rows,
        set_sql=(
            f"estimated_start_p10_at = {_to_timestamp_sql('p10')}, estimated_start_at = {_to_timestamp_sql('p50')}, "
            f"estimated_start_p90_at = {_to_timestamp_sql('p90')}, estimated_at = %s"
        ),
        set_params=[now],
        where_sql=f"AND state IN ({pending})",
    )


@dataclass
class EstimatesRefresh:
    ran: bool
    reason: str = ""  # why it did not run: "throttled", "running", "cache unreachable"
    pending: int = 0
    estimated: int = 0  # pending jobs with a median start
    written: int = 0
    cycles: int = 0  # engine cycles of the three forecasts
    snapshot_s: float = 0.0
    predict_s: float = 0.0
    forecast_s: float = 0.0
    write_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def estimates_compute(*, now: datetime | None = None) -> EstimatesRefresh:
    """Predict, forecast and write the estimates now (no throttle: ``job_start_estimates_refresh`` is the one
    the task calls)."""
    started = time.perf_counter()
    at = now or timezone.now()
    snap = live.build_snapshot(now=at, previous_usage=cache.get(live.USAGE_CACHE_KEY))
    snapshot_done = time.perf_counter()
    pks = {int(a.job_id) for a in snap.allocations} | {int(j.job_id) for j in snap.pending}
    jobs = _jobs(pks)
    history = RuntimeHistory.load(now=at)
    short, median, long = forecast_runtimes(snap, jobs, history)
    predicted = time.perf_counter()
    policy = policy_from_settings()
    limits = limits_from_settings()
    # Half the wall-clock budget for the median forecast, a quarter for each edge of the band.
    budget_s = float(settings.GPUPOOL_ETA_MAX_SECONDS)
    results = [
        core_eta.forecast(snap, policy, runtimes, run_limits, out_of_time=_deadline(budget_s * share))
        for runtimes, run_limits, share in (
            (median, limits, 0.5),
            (short, core_eta.band_limits(limits), 0.25),
            (long, core_eta.band_limits(limits), 0.25),
        )
    ]
    median_run, short_run, long_run = results
    bands = core_eta.bands_from(snap, short_run.starts, median_run.starts, long_run.starts)
    bands = _calibrated(snap, median_run.starts, bands, no_basis=history.pool_band is None)
    forecast_done = time.perf_counter()
    written = estimates_write(bands, now=at)
    if median_run.stopped == core_eta.StopReason.OUT_OF_TIME:
        logger.warning(
            "start-time estimates: the forecast ran out of its %s s (GPUPOOL_ETA_MAX_SECONDS) after %s cycles; "
            "jobs it did not start by then have no estimate",
            settings.GPUPOOL_ETA_MAX_SECONDS,
            median_run.cycles,
        )
    return EstimatesRefresh(
        ran=True,
        pending=len(snap.pending),
        estimated=sum(1 for band in bands.values() if band.p50_at is not None),
        written=written,
        cycles=sum(r.cycles for r in results),
        snapshot_s=round(snapshot_done - started, 4),
        predict_s=round(predicted - snapshot_done, 4),
        forecast_s=round(forecast_done - predicted, 4),
        write_s=round(time.perf_counter() - forecast_done, 4),
    )


def calibration_keys(job: core.PendingJob, wait_s: float) -> list[tuple[str, ...]]:
    """The classes a job's error is kept under, most specific first: (forecast wait, tenant, size), (forecast
    wait, size), (forecast wait), all."""
    cards = job.request.millis * job.replicas / core.MILLIS_PER_DEVICE
    wait, size = core_eta.wait_class(wait_s), core_eta.size_class(cards)
    return [(wait, job.tenant, size), (wait, size), (wait,), ()]


def _calibrated(
    snap: core.Snapshot, median: dict[str, float], bands: dict[str, core_eta.StartBand], *, no_basis: bool
) -> dict[str, core_eta.StartBand]:
    """The calibrated, age-aware band of every pending job (see the module's docstring); the forecasts' bands
    as they are when the cache is unreachable. ``no_basis``: no finished job to predict runtimes from (every
    runtime is the default): a job that waits, with no calibration either, gets no p90 — its wait is a guess,
    and a band would dress the guess up as a range."""
    try:
        calibration = core_eta.Calibration.from_dict(
            cache.get(CALIBRATION_KEY) or {},
            min_samples=CALIBRATION_MIN_ERRORS,
            max_samples=CALIBRATION_MAX_ERRORS,
        )
        first: dict[str, list] = cache.get(FIRST_ESTIMATES_KEY) or {}
    except Exception:
        logger.warning("start-time estimates not calibrated: the cache is unreachable", exc_info=True)
        return bands
    now = snap.now
    pending = {j.job_id: j for j in snap.pending}
    gone = [job_id for job_id in first if job_id not in pending]
    if gone:
        rows = Job.objects.filter(AnyOf("pk", [int(j) for j in gone])).values_list("pk", "started_at")
        for pk, started_at in rows:
            made_at, wait_s, keys = first[str(pk)]
            if started_at is not None:
                calibration.add([tuple(k) for k in keys], wait_s, started_at.timestamp() - made_at)
        for job_id in gone:
            del first[job_id]
    shown = {
        str(pk): (p10, p50, p90, submitted)
        for pk, p10, p50, p90, submitted in Job.objects.filter(AnyOf("pk", [int(j) for j in pending])).values_list(
            "pk", "estimated_start_p10_at", "estimated_start_at", "estimated_start_p90_at", "submitted_at"
        )
    }
    out = {}
    for job_id, band in bands.items():
        job = pending[job_id]
        start = median.get(job_id)
        if start is not None:
            keys = calibration_keys(job, start - now)
            first.setdefault(job_id, [now, start - now, [list(k) for k in keys]])
            calibrated = calibration.band(keys, now=now, forecast_wait_s=start - now)
            if calibrated is not None:
                band = calibrated
            elif no_basis and start - now >= core_eta.WAIT_CLASS_EDGES_S[0]:
                band = replace(band, p90_at=None)
        p10, p50, p90, submitted = shown.get(job_id, (None, None, None, None))
        previous = core_eta.StartBand(*(None if d is None else d.timestamp() for d in (p10, p50, p90)))
        out[job_id] = core_eta.age_aware(
            band, previous, now=now, submitted_at=submitted.timestamp() if submitted else job.submitted_at
        )
    try:
        cache.set(CALIBRATION_KEY, calibration.as_dict(), timeout=None)
        cache.set(FIRST_ESTIMATES_KEY, first, timeout=None)
    except Exception:
        logger.warning("start-time calibration not saved: the cache is unreachable", exc_info=True)
    return out


def _deadline(seconds: float) -> Callable[[], bool]:
    ends = time.monotonic() + seconds
    return lambda: time.monotonic() > ends


def job_start_estimates_refresh(*, after_change: bool = False, now: datetime | None = None) -> EstimatesRefresh:
    """Recompute the estimates unless one was computed less than ``GPUPOOL_ETA_INTERVAL_S`` ago (after a big
    change: ``CHANGE_MIN_GAP_S``), or less than the last one took (so it never keeps a worker busy more than half
    the time), or another worker is computing them now."""
    gap_s = CHANGE_MIN_GAP_S if after_change else float(settings.GPUPOOL_ETA_INTERVAL_S)
    try:
        if _too_soon(gap_s):
            return EstimatesRefresh(ran=False, reason="throttled")
        if not cache.add(RUNNING_KEY, 1, timeout=RUNNING_TTL_S):
            return EstimatesRefresh(ran=False, reason="running")
    except Exception:
        logger.warning("start-time estimates skipped: the cache is unreachable", exc_info=True)
        return EstimatesRefresh(ran=False, reason="cache unreachable")
    began = None
    try:
        if _too_soon(gap_s):  # another worker finished one between the first look and the claim
            return EstimatesRefresh(ran=False, reason="throttled")
        began = time.time()
        return estimates_compute(now=now)
    finally:
        if began is not None:  # also when it failed: a failing refresh must not be retried back to back
            cache.set(LAST_REFRESH_KEY, {"at": time.time(), "took_s": time.time() - began}, timeout=None)
        cache.delete(RUNNING_KEY)


def _too_soon(gap_s: float) -> bool:
    last = cache.get(LAST_REFRESH_KEY)
    if not last:
        return False
    return time.time() - float(last["at"]) < max(gap_s, float(last.get("took_s", 0.0)))


def estimates_refresh_request() -> None:
    """After a cycle with big changes: queue a refresh unless one ran moments ago (call it ``on_commit``)."""
    try:
        if _too_soon(CHANGE_MIN_GAP_S):
            return
        task_queue("scheduler.estimate_starts", kwargs={"after_change": True})
    except Exception:
        logger.warning("could not ask for new start-time estimates", exc_info=True)
