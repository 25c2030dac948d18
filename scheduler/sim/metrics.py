"""Figures of one simulated run, computed from its ``SimResult`` (pure Python, no numpy needed)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from scheduler.core.types import MILLIS_PER_DEVICE

from .simulator import JobRecord, SimResult

BIG_GANG_GPUS = 32  # "big gangs" in the figures: jobs of at least this many GPUs


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile with linear interpolation between closest ranks (numpy's default); NaN if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one gets everything; NaN if empty."""
    if not values:
        return math.nan
    square_sum = sum(x * x for x in values)
    if square_sum == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * square_sum)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def within_share(jobs: Sequence[JobRecord], tolerance_s: float, *, alone: bool = False) -> float:
    """Share of ``jobs`` starved within their guarantee for no longer than ``tolerance_s`` in all
    (``JobRecord.starved_s``; with ``alone``, ``starved_alone_s``); NaN for no jobs."""
    if not jobs:
        return math.nan
    return sum(1 for j in jobs if (j.starved_alone_s if alone else j.starved_s) <= tolerance_s) / len(jobs)


def owed_wait_beyond_s(jobs: Sequence[JobRecord], bound_s: float) -> float:
    """The longest time one of ``jobs`` waited while owed room in its tenant's unused guarantee beyond
    ``bound_s`` (grace + minimum runtime + one cycle: what reclaim promises, ``SimResult.reclaim_bound_s``);
    0 when every such wait kept the promise."""
    return max((max(0.0, j.longest_starved_s - bound_s) for j in jobs), default=0.0)


def summarize(result: SimResult) -> dict[str, float | int | str]:
    """The benchmark's figures. Definitions:

    - ``gpu_allocation``: time-average share of GPUs held by jobs from the first arrival to the end of the run;
      ``gpu_allocation_window``: the same over the submission window only (first to last arrival);
    - ``gpu_utilisation``: useful work (GPU-seconds of the jobs that finished, each counted once) over the
      capacity in the same span — allocation minus restarts and work redone after a stop;
    - ``queue_delay``: time to first start (first start - submit) — it hides the waits of a requeued job;
    - ``queued``: *total* time queued, every stay in the queue (after each preemption or failure too), over all
      jobs (a job that never started counts its wait until the end of the run); mean, p95, p99;
    - ``jct``: finish - submit (mean, p95, p99); ``makespan``: last finish - first arrival;
    - ``gpu_hours``: the work of the jobs that finished (GPUs x duration), each counted once;
    - ``preemptions_per_job``: p50/p99/max over all jobs; ``preempted_3plus``: jobs preempted 3 times or
      more; ``preemptions_per_hour_max``: the most preemptions in one simulated hour;
    - ``starved_while_borrowed``: share of the run (first arrival to end) during which some tenant had a job
      waiting that fit in its unused guarantee while another tenant held more than its guarantee;
      ``..._beyond_tol``: the part when such a job had already waited longer than ``guarantee_tolerance_s``;
    - ``big_gang_*``: jobs of at least ``BIG_GANG_GPUS`` GPUs: total time queued, mean and p95;
    - ``jain_fairness``: Jain's index across tenants of each tenant's mean job speed (run time / JCT);
    - ``within_guarantee``: share of jobs that were never owed room in their tenant's unused guarantee for
      longer than ``guarantee_tolerance_s`` in all (``JobRecord.starved_s``): the room (guarantee - held) is
      handed out over the tenant's waiting jobs in queue order (preemptors first, then priority, submit time),
      as a guarantee is capacity, not a promise to every queued job at once — a tenant one card below its
      guarantee with a thousand one-card jobs queued owes that card to one of them, not to each;
      ``within_guarantee_alone``: the stricter reading, each job judged alone (it waited while it would have
      fit in its tenant's unused guarantee, whatever the jobs ahead of it waited for);
    - ``owed_wait_max_s``: the longest single wait of a job owed room in its guarantee beyond grace + minimum
      runtime + one cycle (``owed_wait_beyond_s``), over all tenants; ``per_tenant`` gives it per tenant.
    """
    jobs = result.jobs
    capacity = result.capacity_millis
    first = min((j.submit_s for j in jobs), default=0.0)
    span = max(result.end_s - first, 1e-9)
    finished = [j for j in jobs if j.finish_s is not None]
    started = [j for j in jobs if j.first_start_s is not None]
    delays = [j.first_start_s - j.submit_s for j in started]
    jct = [j.finish_s - j.submit_s for j in finished]
    useful_gpu_s = sum(j.gpus * j.duration_s for j in finished)
    speed: dict[str, list[float]] = defaultdict(list)
    for j in finished:
        speed[j.tenant].append(j.duration_s / max(j.finish_s - j.submit_s, 1e-9))
    tenant_speed = [mean(v) for _, v in sorted(speed.items())]
    queued = [j.queued_s for j in jobs]
    preempted = [float(j.preemptions) for j in jobs]
    gangs = [j.queued_s for j in jobs if j.gpus >= BIG_GANG_GPUS]
    per_hour: dict[int, int] = defaultdict(int)
    for t in result.preemption_times:
        per_hour[int(t // 3600)] += 1
    return {
        "policy": result.policy,
        "workload": result.workload,
        "gpus": capacity // MILLIS_PER_DEVICE,
        "jobs": len(jobs),
        "finished": len(finished),
        "never_started": len(jobs) - len(started),
        "gpu_allocation": result.allocated_millis_s / (capacity * span) if capacity else math.nan,
        "gpu_allocation_window": window_allocation(result, first),
        "gpu_utilisation": useful_gpu_s * MILLIS_PER_DEVICE / (capacity * span) if capacity else math.nan,
        "queue_delay_avg_s": mean(delays),
        "queue_delay_p50_s": percentile(delays, 50),
        "queue_delay_p95_s": percentile(delays, 95),
        "queued_avg_s": mean(queued),
        "queued_p95_s": percentile(queued, 95),
        "queued_p99_s": percentile(queued, 99),
        "jct_avg_s": mean(jct),
        "jct_p95_s": percentile(jct, 95),
        "jct_p99_s": percentile(jct, 99),
        "gpu_hours": useful_gpu_s / 3600.0,
        "makespan_s": (max(j.finish_s for j in finished) - first) if finished else math.nan,
        "preemptions": result.preemptions,
        "preemptions_per_job_p50": percentile(preempted, 50),
        "preemptions_per_job_p99": percentile(preempted, 99),
        "preemptions_per_job_max": int(max(preempted, default=0)),
        "preempted_3plus": sum(1 for p in preempted if p >= 3),
        "preemptions_per_hour_max": max(per_hour.values(), default=0),
        "starved_while_borrowed": result.starved_while_borrowed_s / span,
        "starved_while_borrowed_beyond_tol": result.starved_while_borrowed_beyond_tolerance_s / span,
        "big_gangs": len(gangs),
        "big_gang_queued_avg_s": mean(gangs),
        "big_gang_queued_p95_s": percentile(gangs, 95),
        "failure_requeues": result.failure_requeues,
        "node_failures": result.node_failures,
        "lost_gpu_hours": result.lost_gpu_s / 3600.0,
        "restart_gpu_hours": result.overhead_gpu_s / 3600.0,
        "jain_fairness": jain_index(tenant_speed),
        "within_guarantee": within_share(jobs, result.guarantee_tolerance_s),
        "within_guarantee_alone": within_share(jobs, result.guarantee_tolerance_s, alone=True),
        "owed_wait_max_s": owed_wait_beyond_s(jobs, result.reclaim_bound_s),
        "cycles": result.cycles,
        "plan_calls": result.plan_calls,
        "plan_ms_per_cycle": 1000.0 * result.plan_wall_s / result.plan_calls if result.plan_calls else 0.0,
        "wall_s": result.wall_s,
    }


def per_tenant(result: SimResult) -> list[dict[str, float | int | str]]:
    """One row per tenant: jobs (finished, never started), guarantee (GPUs), share within guarantee, time
    starved (and its longest wait beyond the reclaim promise, ``owed_wait_beyond_s``), total time queued and
    JCT (mean, p95, p99), preemptions, and the GPU-hours of its finished jobs."""
    by_tenant: dict[str, list] = defaultdict(list)
    for j in result.jobs:
        by_tenant[j.tenant].append(j)
    rows = []
    for tenant, jobs in sorted(by_tenant.items()):
        jct = [j.finish_s - j.submit_s for j in jobs if j.finish_s is not None]
        queued = [j.queued_s for j in jobs]
        rows.append(
            {
                "tenant": tenant,
                "jobs": len(jobs),
                "finished": len(jct),
                "never_started": sum(1 for j in jobs if j.first_start_s is None),
                "guarantee_gpus": result.guarantee_millis.get(tenant, 0) / MILLIS_PER_DEVICE,
                "within_guarantee": within_share(jobs, result.guarantee_tolerance_s),
                "within_guarantee_alone": within_share(jobs, result.guarantee_tolerance_s, alone=True),
                "starved_s": sum(j.starved_s for j in jobs),
                "longest_starved_s": max(j.longest_starved_s for j in jobs),
                "owed_wait_beyond_s": owed_wait_beyond_s(jobs, result.reclaim_bound_s),
                "queued_avg_s": mean(queued),
                "queued_p95_s": percentile(queued, 95),
                "queued_p99_s": percentile(queued, 99),
                "jct_avg_s": mean(jct),
                "jct_p95_s": percentile(jct, 95),
                "jct_p99_s": percentile(jct, 99),
                "preemptions": sum(j.preemptions for j in jobs),
                "preemptions_max": max(j.preemptions for j in jobs),
                "gpu_hours": sum(j.gpus * j.duration_s for j in jobs if j.finish_s is not None) / 3600.0,
            }
        )
    return rows


def window_allocation(result: SimResult, first_s: float) -> float:
    """Mean share of GPUs held between the first and the last arrival (whole hourly bins)."""
    if not result.capacity_millis or not result.allocated_bins:
        return math.nan
    lo = int(first_s // result.bin_s)
    hi = max(lo + 1, math.ceil(result.window_s / result.bin_s))
    bins = result.allocated_bins[lo:hi]
    return mean(bins) / result.capacity_millis if bins else math.nan


def utilisation_series(result: SimResult) -> tuple[list[float], list[float]]:
    """(hours since start, share of GPUs held) per bin, for plots."""
    hours = [i * result.bin_s / 3600.0 for i in range(len(result.allocated_bins))]
    share = [b / result.capacity_millis for b in result.allocated_bins] if result.capacity_millis else []
    return hours, share
