"""The Celery application. Configuration comes from Django settings (``CELERY_*``)."""

from __future__ import annotations

import os

from celery import Celery

from portal.env import env_int

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("gpupool")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# How often beat checks node leases and starts a scheduling cycle (seconds). Short heartbeats and grace periods
# (tests, benchmarks/recovery.py) need a lease check at least as often as a heartbeat.
LEASE_CHECK_INTERVAL_S = env_int("GPUPOOL_LEASE_CHECK_INTERVAL_S", 5)
CYCLE_INTERVAL_S = env_int("GPUPOOL_CYCLE_INTERVAL_S", 5)

# Node lease (not_ready after missed heartbeats), hourly telemetry rollups, retention of rollups.
app.conf.beat_schedule.update(
    {
        "fleet-lease-check": {"task": "fleet.lease_check", "schedule": float(LEASE_CHECK_INTERVAL_S)},
        "fleet-telemetry-rollup-hours": {"task": "fleet.telemetry_rollup_hours", "schedule": 300.0},
        "fleet-telemetry-purge": {"task": "fleet.telemetry_purge", "schedule": 6 * 3600.0},
    }
)
# The scheduling cycle (events trigger extra ones, debounced; only one runs at a time).
app.conf.beat_schedule.update(
    {"scheduler-run-cycle": {"task": "scheduler.run_cycle", "schedule": float(CYCLE_INTERVAL_S)}}
)
# Approval requests past their expiry (quota changes, job admissions).
app.conf.beat_schedule.update({"tenants-approvals-expire": {"task": "tenants.approvals_expire", "schedule": 300.0}})
