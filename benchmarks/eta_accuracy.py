"""Benchmark: how accurate are start-time estimates? Replays a bundled trace and, at each sampled job's submit,
estimates its start; then compares every estimate with the start the replay gave it.

Estimators, each given only what was known at the submit:

- ``naive`` — what a user could work out from the queue position gpupool showed before estimates: position x
  mean runtime / jobs running (the queue drains one job per finishing job; the fair version of the naive rule);
- ``naive, calibrated`` — the same figure with a band from its own past errors, per class, exactly as the
  forecasts are calibrated below (its median is the naive figure: ``naive-literal``, position x mean runtime,
  off by days, is left out);
- ``forecast, history`` — the engine stepped forward (``scheduler.core.eta.forecast``, what the Celery task
  runs), every job's runtime predicted by the median of the last ``--history-jobs`` finished jobs of its group,
  then calibrated (``scheduler.core.eta.Calibration``): the median forecast's wait scaled by the 10th and 90th
  percentile of the errors of past estimates of its class (forecast wait, tenant, size; the most specific with
  30 errors) gives p10 and p90; the median is the forecast's own (scaled by the errors' median it moved hours
  off: the days before are not the day estimated);
- ``forecast, no history`` — the same with every runtime the pool's median (what a pool knows without per-user
  history or runtime estimates; the trace has no runtime estimates), calibrated the same way.

Held out: the calibration is fitted on a replay of the ``--calibrate-days`` before the window (same cluster),
then grows only with the errors of jobs that have started before the estimate is made (as a live pool learns):
no figure printed comes from a calibration that saw its job's start. Nothing is fitted on the window itself.

Philly has no user or job name: the group of a job is its virtual cluster (tenant) and its GPU count, the
closest the trace has to "the same user's jobs of the same kind". The history starts with the
``--warmup-days`` of the trace before each replay (a live pool has history), then grows with the replay.

Error = |estimated start - actual start| in seconds. "Within" = within 20 % of the actual wait or 10 minutes,
whichever is larger. A job with no estimate ("unknown": no class has enough past errors) counts as a miss.
The band coverage is how many actual starts fell inside p10 to p90 (one 60 s replay cycle of slack either side).
"Past the band" re-estimates every sampled job still waiting one cycle after its p90 (up to three times) and
shows how often the actual start is inside the new band (``scheduler.core.eta.age_aware``: widened, no p90)
and inside the fresh calibrated band alone (what repeating the forecast would show). The replay is
deterministic (no random failures): one run gives the figures; only the wall times vary. Figures, not
assertions. ``--raw`` adds the uncalibrated forecasts and their p10/p90 forecast band (three times the work).

    .venv/bin/python benchmarks/eta_accuracy.py                     # Philly, 1 day from 2017-10-09, load 0.8
    .venv/bin/python benchmarks/eta_accuracy.py --every 1           # every job (slower)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict, deque
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.core import plan
from scheduler.core.eta import (
    Calibration,
    Limits,
    Runtimes,
    StartBand,
    age_aware,
    band_limits,
    forecast,
    quantile,
    residual_left,
    size_class,
    time_left,
    wait_class,
)
from scheduler.core.types import Snapshot
from scheduler.sim.loaders import PHILLY_CSV, _open, load_philly, philly_jobs, read_philly_rows, traces_dir
from scheduler.sim.policies import get
from scheduler.sim.simulator import SimConfig, Simulator, StopReason

OVERDUE_S = 300.0  # as scheduler.eta.OVERDUE_REMAINING_S
QUANTILES = (0.1, 0.5, 0.9)
WITHIN_SHARE = 0.2
WITHIN_FLOOR_S = 600.0
SLACK_S = 60.0  # the replay's cycle interval: a job that fits starts at the next cycle
MIN_CALIBRATION = 30  # errors a class needs before it calibrates (else the next, coarser class)
RELOOKS = 3  # re-estimates of a job past its band
CALIBRATED = ("naive, calibrated", "forecast, history", "forecast, no history")


class History:
    """Finished jobs' runtimes per group (tenant, GPUs), most recent last, and the pool's."""

    def __init__(self, per_group: int) -> None:
        self.per_group = per_group
        self.groups: dict[tuple[str, float], deque[float]] = defaultdict(lambda: deque(maxlen=per_group))
        self.pool: deque[float] = deque(maxlen=5000)
        self.total = 0.0
        self.count = 0
        self._sorted_at = -1
        self._pool_sorted: tuple[float, ...] = ()

    def add(self, tenant: str, gpus: float, runtime_s: float) -> None:
        self.groups[(tenant, gpus)].append(runtime_s)
        self.pool.append(runtime_s)
        self.total += runtime_s
        self.count += 1

    def mean(self) -> float:
        return self.total / self.count if self.count else 3600.0

    def pool_samples(self) -> tuple[float, ...]:
        if self._sorted_at != self.count:  # sorted again only after a job finished
            self._pool_sorted = tuple(sorted(self.pool)) or (3600.0,)
            self._sorted_at = self.count
        return self._pool_sorted

    def samples(self, tenant: str, gpus: float) -> tuple[float, ...]:
        """The group's runtimes, sorted; the pool's when the group has fewer than 3 (as scheduler.eta)."""
        group = self.groups.get((tenant, gpus))
        if not group or len(group) < 3:
            return self.pool_samples()
        return tuple(sorted(group))


def calibration_keys(wait_s: float, tenant: str, gpus: float) -> list[tuple[str, ...]]:
    """Most specific first, as ``scheduler.eta`` does live: (forecast wait, tenant, size), (wait, size), (wait,)."""
    cls, size = wait_class(wait_s), size_class(gpus)
    return [(cls, tenant, size), (cls, size), (cls,), ()]


class Probe(Simulator):
    """The replay; at each sampled submit it estimates that job's start with every estimator; once the job has
    started, each estimator's error goes into its calibration (used by later estimates only)."""

    def __init__(
        self,
        *args,
        sample: set[str],
        history: History,
        limits: Limits,
        raw: bool,
        calibrations: dict[str, Calibration],
        relook: bool,
        **kwargs,
    ) -> None:
        super().__init__(*args, observers=[self], **kwargs)
        self.sample = sample
        self.history = history
        self.limits = limits
        self.raw = raw
        self.calibrations = calibrations
        self.relook = relook
        self.estimates: dict[str, dict[str, float | None]] = defaultdict(dict)
        self.bands: dict[str, dict[str, StartBand]] = defaultdict(dict)
        self.basis: dict[str, dict[str, tuple[float, list[tuple[str, ...]]]]] = defaultdict(dict)
        self.estimate_wall_s: dict[str, float] = defaultdict(float)
        self.relooks: list[tuple[str, StartBand, StartBand]] = []  # (job, age-aware band, fresh band)
        self.due: list[tuple[float, str, StartBand, int]] = []  # (when, job, band shown, re-looks so far)

    # observer: the history grows as jobs finish; the calibrations as sampled jobs start
    def job_started(self, job_id: str, t: float, *, nodes: tuple[str, ...], flavor: str) -> None:
        record = self.by_id[job_id].record
        if job_id not in self.sample or record.starts != 1:
            return
        for name, (wait_s, keys) in self.basis.pop(job_id, {}).items():
            self.calibrations[name].add(keys, wait_s, t - record.submit_s)

    def job_stopped(self, job_id: str, t: float, *, reason: StopReason) -> None:
        if reason == StopReason.FINISHED:
            record = self.by_id[job_id].record
            self.history.add(record.tenant, record.gpus, t - (record.first_start_s or t))

    def _arrive(self, run, t: float) -> None:
        super()._arrive(run, t)
        if run.job.job_id in self.sample:
            self._estimate(run.job.job_id, t)

    def _cycle(self, t: float) -> None:
        super()._cycle(t)
        if not self.relook:
            return
        due, self.due = [d for d in self.due if d[0] <= t], [d for d in self.due if d[0] > t]
        for _when, job_id, shown, looks in due:
            if job_id in self.pending:
                self._relook(job_id, t, shown, looks)

    def _snapshot(self, t: float) -> Snapshot:
        return Snapshot(
            now=t,
            nodes=self.nodes,
            allocations=tuple(a for j in self.flavor_of for a in self.by_id[j].allocs),
            tenants=self.tenants,
            quotas=self.quotas,
            usage=self.usage,
            pending=tuple(r.pending for r in self.pending.values()),
            holds=self.holds,
        )

    def _runtimes(self, t: float, *, use_history: bool, which: int) -> Runtimes:
        """Runtimes at quantile ``QUANTILES[which]``: with history, of each job's group (the pool's when the group
        has fewer than 3); without, the pool's for every job. A running job has that less what it has run (without
        history: the quantile of the pool's runtimes longer than it has run, less that)."""
        q = QUANTILES[which]
        pool = quantile(self.history.pool_samples(), q)
        remaining, runtime = {}, {}
        for job_id in self.flavor_of:
            run = self.by_id[job_id]
            elapsed = t - (run.record.first_start_s or t)
            if use_history:
                predicted = quantile(self.history.samples(run.job.tenant, run.job.gpus), q)
                remaining[job_id] = time_left(predicted, elapsed, overdue_s=OVERDUE_S)
            else:  # as scheduler.eta for a job predicted from the pool's runtimes
                remaining[job_id] = residual_left(self.history.pool_samples(), elapsed, q, overdue_s=OVERDUE_S)
        for job_id, run in self.pending.items():
            runtime[job_id] = quantile(self.history.samples(run.job.tenant, run.job.gpus), q) if use_history else pool
        return Runtimes(remaining_s=remaining, runtime_s=runtime, default_s=pool)

    def _median_start(self, snap: Snapshot, job_id: str, t: float, *, use_history: bool, which: int = 1):
        runtimes = self._runtimes(t, use_history=use_history, which=which)
        limits = self.limits if which == 1 else band_limits(self.limits)
        return forecast(snap, self.p, runtimes, limits, until_started={job_id}).starts.get(job_id)

    def _calibrated(self, name: str, job_id: str, t: float, wait_s: float | None) -> StartBand:
        """The calibrated band of a raw wait (None: the forecast did not start it — no basis, "unknown")."""
        if wait_s is None:
            return StartBand(None, None, None)
        job = self.by_id[job_id].job
        keys = calibration_keys(wait_s, job.tenant, job.gpus)
        self.basis[job_id][name] = (wait_s, keys)
        return self.calibrations[name].band(keys, now=t, forecast_wait_s=wait_s) or StartBand(None, None, None)

    def _estimate(self, job_id: str, t: float) -> None:
        snap = self._snapshot(t)
        began = time.perf_counter()
        explained = {e.job_id: e.position_overall for e in plan(snap, self.p).explanations}
        position = explained.get(job_id, 0)  # 0: it fits now
        running = max(1, len(self.flavor_of))
        naive_wait = position * self.history.mean() / running
        self.estimates["naive"][job_id] = t + naive_wait
        self._keep("naive, calibrated", job_id, self._calibrated("naive, calibrated", job_id, t, naive_wait))
        self.estimate_wall_s["naive"] += time.perf_counter() - began
        for name, use_history in (("forecast, history", True), ("forecast, no history", False)):
            began = time.perf_counter()
            start = self._median_start(snap, job_id, t, use_history=use_history)
            if self.raw:
                self.estimates[f"{name} (raw)"][job_id] = start
            self._keep(name, job_id, self._calibrated(name, job_id, t, None if start is None else start - t))
            self.estimate_wall_s[name] += time.perf_counter() - began
        if self.raw:
            for name, which in (("band p10", 0), ("band p90", 2)):
                began = time.perf_counter()
                self.estimates[name][job_id] = self._median_start(snap, job_id, t, use_history=True, which=which)
                self.estimate_wall_s[name] += time.perf_counter() - began
        shown = self.bands["forecast, history"][job_id]
        if self.relook and shown.p50_at is not None:
            self._due(job_id, shown, 0)

    def _keep(self, name: str, job_id: str, band: StartBand) -> None:
        self.bands[name][job_id] = band
        self.estimates[name][job_id] = band.p50_at

    def _due(self, job_id: str, shown: StartBand, looks: int) -> None:
        if looks < RELOOKS and shown.p50_at is not None:
            limit = shown.p90_at if shown.p90_at is not None else shown.p50_at
            self.due.append((limit + SLACK_S, job_id, shown, looks))

    def _relook(self, job_id: str, t: float, shown: StartBand, looks: int) -> None:
        """The job waited past the band it was shown: estimate again (calibrated), then the age rule."""
        start = self._median_start(self._snapshot(t), job_id, t, use_history=True)
        job = self.by_id[job_id].job
        if start is None:
            fresh = StartBand(None, None, None)
        else:
            keys = calibration_keys(start - t, job.tenant, job.gpus)
            fresh = self.calibrations["forecast, history"].band(keys, now=t, forecast_wait_s=start - t)
            fresh = fresh or StartBand(None, None, None)
        band = age_aware(fresh, shown, now=t, submitted_at=job.submit_s, slack_s=SLACK_S)
        self.relooks.append((job_id, band, fresh))
        self._due(job_id, band, looks + 1)


def summarize(name: str, estimates: dict[str, float | None], actual: dict[str, tuple[float, float]]) -> str:
    """Median and p90 of |error|, the share within ±20 % / 10 min, and the signed error (estimate - actual: below
    zero is early) at its 5th, 50th and 95th percentile, in minutes."""
    errors, signed, within, missing = [], [], 0, 0
    for job_id, (submit, start) in actual.items():
        estimate = estimates.get(job_id)
        if estimate is None:
            missing += 1
            continue
        signed.append(estimate - start)
        error = abs(estimate - start)
        errors.append(error)
        if error <= max(WITHIN_SHARE * (start - submit), WITHIN_FLOOR_S):
            within += 1
    if not errors:
        return f"{name:<22} no estimates"
    ordered, signed = sorted(errors), sorted(signed)
    bias = "/".join(f"{quantile(signed, q) / 60:+.0f}" for q in (0.05, 0.5, 0.95))
    return (
        f"{name:<22} median |error| {statistics.median(ordered) / 60:7.1f} min"
        f"   p90 {quantile(ordered, 0.9) / 60:7.1f} min"
        f"   within ±20 %/10 min {100 * within / len(actual):5.1f} %   signed p5/p50/p95 {bias} min"
        f"   no estimate {missing}"
    )


def inside(band: StartBand, start: float) -> int:
    """-1 before the band, 0 inside, 1 after it (no p90: "possibly much later", nothing is after it)."""
    if band.p50_at is None:
        return 1
    if start < min(band.p10_at if band.p10_at is not None else band.p50_at, band.p50_at) - SLACK_S:
        return -1
    if band.p90_at is not None and start > max(band.p90_at, band.p50_at) + SLACK_S:
        return 1
    return 0


def band_coverage(bands: dict[str, StartBand], actual: dict[str, tuple[float, float]]) -> str:
    """Where the actual starts fell against the bands (a job with no band — unknown — counts as outside)."""
    where = [inside(bands.get(job_id, StartBand(None, None, None)), start) for job_id, (_s, start) in actual.items()]
    total = max(1, len(actual))
    unknown = sum(1 for job_id in actual if bands.get(job_id, StartBand(None, None, None)).p50_at is None)
    return (
        f"{100 * where.count(0) / total:5.1f} % of actual starts inside, {100 * where.count(-1) / total:.1f} % "
        f"earlier, {100 * where.count(1) / total:.1f} % later (of which {unknown} unknown)"
    )


def raw_bands(estimates: dict[str, dict[str, float | None]]) -> dict[str, StartBand]:
    """The uncalibrated band: p10 and p90 forecasts around the median one (as scheduler.core.eta.bands_from)."""
    median, p10, p90 = (estimates[n] for n in ("forecast, history (raw)", "band p10", "band p90"))
    return {job_id: StartBand(p10.get(job_id) or mid, mid, p90.get(job_id)) for job_id, mid in median.items()}


def replay(args, start: datetime, days: float, cluster: str | int, calibrations, *, relook: bool):
    """One replay of ``days`` from ``start`` with estimates at every ``--every``th submit."""
    workload = load_philly(args.traces, start=start, days=days, cluster=cluster)
    history = History(args.history_jobs)
    if args.warmup_days > 0:
        rows = read_philly_rows(_open(traces_dir(args.traces), PHILLY_CSV))
        warm, _t0 = philly_jobs(rows, start=start - timedelta(days=args.warmup_days), days=args.warmup_days)
        for job in sorted(warm, key=lambda j: j.submit_s + j.duration_s):
            history.add(job.tenant, job.gpus, job.duration_s)
    sample = {j.job_id for i, j in enumerate(workload.jobs) if i % args.every == 0}
    probe = Probe(
        workload,
        get("gpupool"),
        SimConfig(cycle_interval_s=60.0),
        sample=sample,
        history=history,
        limits=Limits(min_step_s=args.min_step, relative_step=args.relative_step),
        raw=args.raw and relook,
        calibrations=calibrations,
        relook=relook,
    )
    result = probe.run()
    actual = {
        r.job_id: (r.submit_s, r.first_start_s)
        for r in result.jobs
        if r.job_id in sample and r.first_start_s is not None
    }
    return workload, history, probe, actual


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=None, help="the traces folder (default: ../shared/traces)")
    parser.add_argument("--start", default="2017-10-09", help="window start (Philly, UTC date)")
    parser.add_argument("--days", type=float, default=1.0, help="window length in days")
    parser.add_argument("--cluster", default="load:0.8", help="cluster size as scheduler.sim.loaders.load_philly")
    parser.add_argument("--every", type=int, default=3, help="estimate at every Nth submit (1: all)")
    parser.add_argument("--history-jobs", type=int, default=20, help="finished jobs per group the median uses")
    parser.add_argument("--warmup-days", type=float, default=7.0, help="trace days before the window as history")
    parser.add_argument("--min-step", type=float, default=Limits().min_step_s, help="forecast: min cycle step (s)")
    parser.add_argument("--relative-step", type=float, default=Limits().relative_step, help="forecast step")
    parser.add_argument("--calibrate-days", type=float, default=2.0, help="days before the window to calibrate on")
    parser.add_argument(
        "--calibrate-cluster",
        default="load:0.8",
        help="the calibration replay's cluster: as --cluster, sized on its own days, or 'window' (the window's)",
    )
    parser.add_argument("--calibration-errors", type=int, default=2000, help="latest errors kept per class")
    parser.add_argument("--raw", action="store_true", help="also the uncalibrated forecasts and p10/p90 forecasts")
    args = parser.parse_args()

    began = time.perf_counter()
    start = datetime.fromisoformat(args.start)
    calibrations = {
        name: Calibration(min_samples=MIN_CALIBRATION, max_samples=args.calibration_errors) for name in CALIBRATED
    }
    window = load_philly(args.traces, start=start, days=args.days, cluster=args.cluster)
    gpus = int(window.meta["gpus"])
    calibrated_on = 0
    if args.calibrate_days > 0:
        cluster = gpus if args.calibrate_cluster == "window" else args.calibrate_cluster
        _w, _h, _p, fitted = replay(
            args, start - timedelta(days=args.calibrate_days), args.calibrate_days, cluster, calibrations, relook=False
        )
        calibrated_on = len(fitted)
    workload, history, probe, actual = replay(args, start, args.days, gpus, calibrations, relook=True)
    waits = sorted(start - submit for submit, start in actual.values())
    waited = {j: v for j, v in actual.items() if v[1] - v[0] >= 600}

    print(f"start-time estimate accuracy (python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f})")
    print(
        f"trace philly, {args.days:g} day(s) from {args.start}, cluster {args.cluster} = {gpus} GPUs, "
        f"{len(workload.jobs)} jobs, {len(history.pool)} warm-up runtimes ({args.warmup_days:g} days); "
        f"estimated at {len(actual)} submits (every {args.every}); actual wait median "
        f"{statistics.median(waits) / 60:.1f} min, p90 {quantile(waits, 0.9) / 60:.1f} min"
    )
    print(
        f"calibrated on the {args.calibrate_days:g} day(s) before ({calibrated_on} estimates; held out), then "
        f"online on jobs started before each estimate; min {MIN_CALIBRATION} errors per class"
    )
    print(f"forecast limits: {probe.limits}; history: last {args.history_jobs} jobs of (tenant, GPUs)")
    names = ["naive", "naive, calibrated", "forecast, history", "forecast, no history"]
    if args.raw:
        names += ["forecast, history (raw)", "forecast, no history (raw)"]
    for title, subset in (
        (f"all {len(actual)} sampled jobs", actual),
        (f"the {len(waited)} that waited >= 10 min", waited),
    ):
        print(f"-- {title}")
        for name in names:
            print("   " + summarize(name, probe.estimates[name], subset))
    bands = [(name, probe.bands[name]) for name in CALIBRATED]
    if args.raw:
        bands.append(("forecast, history (raw)", raw_bands(probe.estimates)))
    for title, subset in (("all", actual), (">= 10 min wait", waited)):
        for name, band in bands:
            print(f"-- band p10-p90, {name}, {title}: {band_coverage(band, subset)}")
    starts = {job_id: start for job_id, (_submit, start) in actual.items()}
    looked = [(j, band, fresh) for j, band, fresh in probe.relooks if j in starts]
    if looked:
        aged = sum(1 for j, band, _f in looked if inside(band, starts[j]) == 0)
        fresh = sum(1 for j, _b, band in looked if inside(band, starts[j]) == 0)
        print(
            f"-- past the band: {len(looked)} re-estimates of {len({j for j, _b, _f in looked})} jobs still waiting "
            f"after their p90: age-aware band holds {100 * aged / len(looked):.1f} % of their starts, the fresh "
            f"calibrated band alone {100 * fresh / len(looked):.1f} %, the band shown before 0 %"
        )
    cost = ", ".join(
        f"{name} {seconds / max(1, len(actual)) * 1000:.0f} ms" for name, seconds in probe.estimate_wall_s.items()
    )
    print(f"wall time per estimate: {cost}; whole run {time.perf_counter() - began:.0f} s")
    print("reproduce: .venv/bin/python benchmarks/eta_accuracy.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
