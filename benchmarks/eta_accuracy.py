"""Benchmark: how accurate are start-time estimates? Replays a bundled trace and, at each sampled job's submit,
estimates its start; then compares every estimate with the start the replay gave it.

Estimators, each given only what was known at the submit:

- ``naive`` — what a user could work out from the queue position gpupool showed before estimates: position x
  mean runtime / jobs running (the queue drains one job per finishing job; the fair version of the naive rule);
- ``naive-literal`` — position x mean runtime, as the rule is usually stated;
- ``forecast, history`` — the engine stepped forward (``scheduler.core.eta.forecast``, what the Celery task
  runs), every job's runtime predicted by the median of the last ``--history-jobs`` finished jobs of its group;
- ``forecast, no history`` — the same forecast with every runtime the pool's median (what a pool knows without
  per-user history or runtime estimates; the trace has no runtime estimates).

Philly has no user or job name: the group of a job is its virtual cluster (tenant) and its GPU count, the
closest the trace has to "the same user's jobs of the same kind". The history starts with the
``--warmup-days`` of the trace before the window (a live pool has history), then grows with the replay.

Error = |estimated start - actual start| in seconds. "Within" = within 20 % of the actual wait or 10 minutes,
whichever is larger. A job with no estimate (it would not start within the forecast's limits) counts as a miss.
``--band`` adds the p10 and p90 forecasts and prints how many actual starts fell inside the band. Figures, not
assertions.

    .venv/bin/python benchmarks/eta_accuracy.py                     # Philly, 1 day from 2017-10-09, load 0.8
    .venv/bin/python benchmarks/eta_accuracy.py --every 1 --band    # every job, with the band (slower)
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
from scheduler.core.eta import Limits, Runtimes, band_limits, forecast, quantile, time_left
from scheduler.core.types import Snapshot
from scheduler.sim.loaders import PHILLY_CSV, _open, load_philly, philly_jobs, read_philly_rows, traces_dir
from scheduler.sim.policies import get
from scheduler.sim.simulator import SimConfig, Simulator, StopReason

OVERDUE_S = 300.0  # as scheduler.eta.OVERDUE_REMAINING_S
QUANTILES = (0.1, 0.5, 0.9)
WITHIN_SHARE = 0.2
WITHIN_FLOOR_S = 600.0
SLACK_S = 60.0  # the replay's cycle interval: a job that fits starts at the next cycle


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


class Probe(Simulator):
    """The replay; at each sampled submit it estimates that job's start with every estimator."""

    def __init__(self, *args, sample: set[str], history: History, limits: Limits, band: bool, **kwargs) -> None:
        super().__init__(*args, observers=[self], **kwargs)
        self.sample = sample
        self.history = history
        self.limits = limits
        self.band = band
        self.estimates: dict[str, dict[str, float | None]] = defaultdict(dict)
        self.estimate_wall_s: dict[str, float] = defaultdict(float)

    # observer: the history grows as jobs finish
    def job_started(self, job_id: str, t: float, *, nodes: tuple[str, ...], flavor: str) -> None:
        pass

    def job_stopped(self, job_id: str, t: float, *, reason: StopReason) -> None:
        if reason == StopReason.FINISHED:
            record = self.by_id[job_id].record
            self.history.add(record.tenant, record.gpus, t - (record.first_start_s or t))

    def _arrive(self, run, t: float) -> None:
        super()._arrive(run, t)
        if run.job.job_id in self.sample:
            self._estimate(run.job.job_id, t)

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
        has fewer than 3); without, the pool's for every job. A running job has that less what it has run."""
        q = QUANTILES[which]
        pool = quantile(self.history.pool_samples(), q)
        remaining, runtime = {}, {}
        for job_id in self.flavor_of:
            run = self.by_id[job_id]
            elapsed = t - (run.record.first_start_s or t)
            predicted = quantile(self.history.samples(run.job.tenant, run.job.gpus), q) if use_history else pool
            remaining[job_id] = time_left(predicted, elapsed, overdue_s=OVERDUE_S)
        for job_id, run in self.pending.items():
            runtime[job_id] = quantile(self.history.samples(run.job.tenant, run.job.gpus), q) if use_history else pool
        return Runtimes(remaining_s=remaining, runtime_s=runtime, default_s=pool)

    def _estimate(self, job_id: str, t: float) -> None:
        snap = self._snapshot(t)
        began = time.perf_counter()
        explained = {e.job_id: e.position_overall for e in plan(snap, self.p).explanations}
        position = explained.get(job_id, 0)  # 0: it fits now
        running = max(1, len(self.flavor_of))
        mean = self.history.mean()
        self.estimates["naive"][job_id] = t + position * mean / running
        self.estimates["naive-literal"][job_id] = t + position * mean
        self.estimate_wall_s["naive"] += time.perf_counter() - began
        wanted = [("forecast, history", True, 1), ("forecast, no history", False, 1)]
        if self.band:
            wanted += [("band p10", True, 0), ("band p90", True, 2)]
        for name, use_history, which in wanted:
            began = time.perf_counter()
            runtimes = self._runtimes(t, use_history=use_history, which=which)
            limits = self.limits if which == 1 else band_limits(self.limits)
            result = forecast(snap, self.p, runtimes, limits, until_started={job_id})
            self.estimates[name][job_id] = result.starts.get(job_id)
            self.estimate_wall_s[name] += time.perf_counter() - began


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


def band_coverage(estimates: dict[str, dict[str, float | None]], actual: dict[str, tuple[float, float]]) -> str:
    """Where the actual starts fell against the band, with one replay cycle (60 s) of slack either side."""
    median, p10, p90 = (estimates[n] for n in ("forecast, history", "band p10", "band p90"))
    below = inside = above = 0
    for job_id, (_submit, start) in actual.items():
        if median.get(job_id) is None:
            continue
        # As scheduler.core.eta.bands_from: the band always holds the median; no p90 means "later than it looked".
        low = min(p10.get(job_id) or median[job_id], median[job_id]) - SLACK_S
        high = None if p90.get(job_id) is None else max(p90[job_id], median[job_id]) + SLACK_S
        if start < low:
            below += 1
        elif high is not None and start > high:
            above += 1
        else:
            inside += 1
    total = max(1, len(actual))
    return (
        f"{100 * inside / total:.1f} % of actual starts inside, {100 * below / total:.1f} % earlier, "
        f"{100 * above / total:.1f} % later"
    )


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
    parser.add_argument("--band", action="store_true", help="also the p10/p90 forecasts (three times the work)")
    args = parser.parse_args()

    began = time.perf_counter()
    start = datetime.fromisoformat(args.start)
    workload = load_philly(args.traces, start=start, days=args.days, cluster=args.cluster)
    history = History(args.history_jobs)
    if args.warmup_days > 0:
        rows = read_philly_rows(_open(traces_dir(args.traces), PHILLY_CSV))
        warm, _t0 = philly_jobs(rows, start=start - timedelta(days=args.warmup_days), days=args.warmup_days)
        for job in sorted(warm, key=lambda j: j.submit_s + j.duration_s):
            history.add(job.tenant, job.gpus, job.duration_s)
    sample = {j.job_id for i, j in enumerate(workload.jobs) if i % args.every == 0}
    limits = Limits(min_step_s=args.min_step, relative_step=args.relative_step)
    probe = Probe(
        workload,
        get("gpupool"),
        SimConfig(cycle_interval_s=60.0),
        sample=sample,
        history=history,
        limits=limits,
        band=args.band,
    )
    result = probe.run()
    actual = {
        r.job_id: (r.submit_s, r.first_start_s)
        for r in result.jobs
        if r.job_id in sample and r.first_start_s is not None
    }
    waits = sorted(start - submit for submit, start in actual.values())
    waited = {j: v for j, v in actual.items() if v[1] - v[0] >= 600}

    print(f"start-time estimate accuracy (python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f})")
    print(
        f"trace philly, {args.days:g} day(s) from {args.start}, cluster {args.cluster} = {workload.meta['gpus']} GPUs, "
        f"{len(workload.jobs)} jobs, {len(history.pool)} warm-up runtimes ({args.warmup_days:g} days); "
        f"estimated at {len(actual)} submits (every {args.every}); actual wait median "
        f"{statistics.median(waits) / 60:.1f} min, p90 {quantile(waits, 0.9) / 60:.1f} min"
    )
    print(f"forecast limits: {limits}; history: last {args.history_jobs} jobs of (tenant, GPUs)")
    for title, subset in (
        (f"all {len(actual)} sampled jobs", actual),
        (f"the {len(waited)} that waited >= 10 min", waited),
    ):
        print(f"-- {title}")
        for name in ("naive", "naive-literal", "forecast, history", "forecast, no history"):
            print("   " + summarize(name, probe.estimates[name], subset))
    if args.band:
        for title, subset in (("all", actual), (">= 10 min wait", waited)):
            print(f"-- band (p10 and p90 forecasts, history), {title}: {band_coverage(probe.estimates, subset)}")
    cost = ", ".join(
        f"{name} {seconds / max(1, len(actual)) * 1000:.0f} ms" for name, seconds in probe.estimate_wall_s.items()
    )
    print(f"wall time per estimate: {cost}; whole run {time.perf_counter() - began:.0f} s")
    print("reproduce: .venv/bin/python benchmarks/eta_accuracy.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
