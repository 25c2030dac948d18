"""Celery tasks of the scheduler: thin wrappers over ``scheduler.services``."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from scheduler import eta, logs, serving, storage_paths
from scheduler.fleet.services import workload_reports
from scheduler.services import cycle


@shared_task(
    name="scheduler.run_cycle",
    acks_late=True,
    ignore_result=False,
    # A deadlock or serialisation failure rolls the whole cycle back; running it again is safe.
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=3,
)
def run_cycle(hold_lock: bool = True) -> dict:
    """One scheduling cycle (beat runs it every few seconds: the safety net under ``cycle_requested``). Safe to
    run anywhere, any number of times: only one cycle runs at a time (the others return ``ran: False`` at once)
    and a cycle only ever acts on the state it re-reads.

    ``hold_lock=False`` skips the cycle lock; only tests use it, to race the persist step on purpose.
    """
    workload_reports.jobs_awaiting_stop_sweep()
    return cycle.run_cycle(hold_lock=hold_lock).as_dict()


@shared_task(
    name="scheduler.cycle_requested",
    bind=True,
    acks_late=True,
    ignore_result=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=3,
)
def cycle_requested(self) -> int:
    """Cycles asked for by changes (``cycle.request_cycle``): run at once, again while more are asked for.
    Returns the number of cycles run. After ``CYCLE_LOOP_MAX_S`` of back-to-back cycles it queues a fresh task
    on its own queue and ends, so a worker is never held by one task for long."""
    outcome = cycle.run_requested_cycles()
    if outcome.hand_over:
        queue = (self.request.delivery_info or {}).get("routing_key")
        cycle.cycle_task_send(queue=queue)
    return outcome.cycles


@shared_task(name="scheduler.serving_sync", acks_late=True, ignore_result=True)
def serving_sync() -> bool:
    """Route every serving endpoint in Caddy (``scheduler.serving``); beat's safety net beside the syncs that
    placements and stops make."""
    return serving.serving_sync()


@shared_task(name="scheduler.shared_storage_measure", acks_late=True, ignore_result=True)
def shared_storage_measure() -> int:
    """Measure each tenant's part of the shared storage (where this worker mounts it) and store the figures shown
    beside quotas (``storage_paths.measure_tenants``; beat: every 10 minutes)."""
    return storage_paths.measure_tenants()


@shared_task(name="scheduler.job_logs_purge", acks_late=True, ignore_result=True)
def job_logs_purge() -> int:
    """Delete the logs of jobs finished longer ago than ``GPUPOOL_JOB_LOG_RETENTION_DAYS`` (beat: hourly)."""
    return logs.job_logs_purge()


@shared_task(
    name="scheduler.estimate_starts",
    acks_late=True,
    ignore_result=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=2,
    # A safety net under the forecast's own limits (GPUPOOL_ETA_MAX_CYCLES, GPUPOOL_ETA_HORIZON_S).
    soft_time_limit=600,
)
def estimate_starts(after_change: bool = False) -> dict:
    """Start-time estimates of the pending jobs (``scheduler.eta``). Beat asks every ``GPUPOOL_ETA_INTERVAL_S``
    and a cycle that starts or preempts many jobs asks at once (``after_change``); it runs unless one ran less
    than that interval (or than the last one took) ago, and never on two workers at once."""
    return eta.job_start_estimates_refresh(after_change=after_change).as_dict()
