"""The Celery application. Configuration comes from Django settings (``CELERY_*``)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("gpupool")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The scheduling cycle (events trigger extra ones, debounced; only one runs at a time).
app.conf.beat_schedule.update({"scheduler-run-cycle": {"task": "scheduler.run_cycle", "schedule": 5.0}})
