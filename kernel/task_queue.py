"""Queue a Celery task by its registered name, without importing the module that defines it.

A service that queues follow-up work would otherwise import its app's ``tasks`` module, which imports the
service back: a circle that only an import inside a function hid. By name, the arrow goes one way (tasks →
services), and ``apply_async`` (not ``send_task``) keeps ``GPUPOOL_CELERY_EAGER`` working: scripts and tests
that run tasks inline still do.
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from celery.result import AsyncResult


def task_queue(name: str, **options: Any) -> AsyncResult:
    """``apply_async(**options)`` of the task registered as ``name`` (a ``KeyError`` names an unknown one)."""
    task = current_app.tasks.get(name)
    if task is None:
        # A process that never started a worker has not imported the autodiscovered task modules yet.
        current_app.loader.import_default_modules()
        task = current_app.tasks[name]
    return task.apply_async(**options)
