"""The Celery application. Configuration comes from Django settings (``CELERY_*``)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("gpupool")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Node lease (not_ready after missed heartbeats), hourly telemetry rollups, retention of rollups.
app.conf.beat_schedule.update(
    {
        "fleet-lease-check": {"task": "fleet.lease_check", "schedule": 5.0},
        "fleet-telemetry-rollup-hours": {"task": "fleet.telemetry_rollup_hours", "schedule": 300.0},
        "fleet-telemetry-purge": {"task": "fleet.telemetry_purge", "schedule": 6 * 3600.0},
    }
)
# The scheduling cycle (events trigger extra ones, debounced; only one runs at a time).
app.conf.beat_schedule.update({"scheduler-run-cycle": {"task": "scheduler.run_cycle", "schedule": 5.0}})
# Approval requests past their expiry (quota changes, job admissions).
app.conf.beat_schedule.update({"tenants-approvals-expire": {"task": "tenants.approvals_expire", "schedule": 300.0}})
