"""The Celery application. Configuration comes from Django settings (``CELERY_*``)."""

from __future__ import annotations

import logging
import os

from celery import Celery
from celery.signals import worker_ready

from kernel.cadence import CYCLE_INTERVAL_S, ETA_INTERVAL_S, LEASE_CHECK_INTERVAL_S, SERVING_SYNC_S

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("gpupool")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
logger = logging.getLogger(__name__)


def _keep_workers_alive_when_redis_goes_away() -> None:
    """Celery 5.7 collects a lost broker connection before closing it; the close then restores the worker's
    unacknowledged messages (an ``acks_late`` task in hand, a countdown task waiting) through the collected
    connection, fails with AttributeError and takes the whole worker down ("Unrecoverable error"). Found by
    tests/resilience: a Redis restart killed every worker that had a task in hand, and nothing was scheduled
    any more. With the connection gone there is nothing to restore through: leave those messages to Redis'
    visibility timeout (our tasks are idempotent and periodic) and let the worker reconnect."""
    try:
        from kombu.transport import redis as kombu_redis
    except ImportError:  # pragma: no cover - redis extra not installed
        return
    original = kombu_redis.QoS.restore_unacked
    if getattr(original, "gpupool_guard", False):
        return

    def restore_unacked(self, client=None):
        if client is None and getattr(self.channel.connection, "client", None) is None:
            logger.warning("broker connection lost with %d unacknowledged message(s) in hand", len(self._delivered))
            return None
        return original(self, client)

    restore_unacked.gpupool_guard = True
    kombu_redis.QoS.restore_unacked = restore_unacked


_keep_workers_alive_when_redis_goes_away()

# How often beat checks node leases and starts a scheduling cycle: kernel.cadence.

# Node lease (not_ready after missed heartbeats), hourly telemetry rollups, retention of rollups.
app.conf.beat_schedule.update(
    {
        "fleet-lease-check": {"task": "fleet.lease_check", "schedule": float(LEASE_CHECK_INTERVAL_S)},
        "fleet-telemetry-rollup-hours": {"task": "fleet.telemetry_rollup_hours", "schedule": 300.0},
        "fleet-telemetry-purge": {"task": "fleet.telemetry_purge", "schedule": 6 * 3600.0},
    }
)
# The scheduling cycle. Changes start one at once (``scheduler.services.cycle.request_cycle``: a dirty flag and one
# ``scheduler.cycle_requested`` task that runs again while more are asked for); this periodic one is the safety
# net for a request lost with Redis or a worker. Only one cycle runs at a time.
app.conf.beat_schedule.update(
    {"scheduler-run-cycle": {"task": "scheduler.run_cycle", "schedule": float(CYCLE_INTERVAL_S)}}
)
# Start-time estimates of pending jobs (scheduler.eta); the task itself skips a run that comes too soon.
app.conf.beat_schedule.update(
    {"scheduler-estimate-starts": {"task": "scheduler.estimate_starts", "schedule": float(ETA_INTERVAL_S)}}
)
# Approval requests past their expiry (quota changes, job admissions).
app.conf.beat_schedule.update({"tenants-approvals-expire": {"task": "tenants.approvals_expire", "schedule": 300.0}})
# Serving endpoints routed in Caddy (scheduler.serving): a restarted Caddy gets its route back.
app.conf.beat_schedule.update(
    {"scheduler-serving-sync": {"task": "scheduler.serving_sync", "schedule": float(SERVING_SYNC_S)}}
)
# What each tenant keeps on the shared storage, shown beside its quotas (scheduler.storage_paths).
app.conf.beat_schedule.update(
    {"scheduler-shared-storage-measure": {"task": "scheduler.shared_storage_measure", "schedule": 600.0}}
)
# Logs of jobs finished longer ago than GPUPOOL_JOB_LOG_RETENTION_DAYS.
app.conf.beat_schedule.update({"scheduler-job-logs-purge": {"task": "scheduler.job_logs_purge", "schedule": 3600.0}})


@worker_ready.connect
def _release_the_cycle_claim_of_a_dead_worker(**_kwargs) -> None:
    """A worker killed mid-cycle leaves the cycle claim behind (until its TTL): drop it as a worker starts, so
    prompt cycles resume at once rather than after ``CYCLE_CLAIM_TTL_S``."""
    from scheduler.services.cycle import cycle_claim_release

    cycle_claim_release()
