"""The embedded runtime: a Celery worker and beat running as threads of the web process.

Used by ``gpupool demo`` (and by tests) when no Redis is configured: the ``memory://`` broker only connects
producers and consumers of the same process, so the worker has to live here.
"""

from __future__ import annotations

import logging
import threading

from portal.celery import app as celery_app

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_worker = None
_worker_thread: threading.Thread | None = None
_beat = None


def start_worker(*, concurrency: int = 2) -> None:
    """Start a thread-pool Celery worker in this process (idempotent)."""
    global _worker, _worker_thread
    with _lock:
        if _worker_thread is not None and _worker_thread.is_alive():
            return
        _worker = celery_app.WorkController(
            app=celery_app,
            pool_cls="threads",
            concurrency=concurrency,
            hostname="embedded@gpupool",
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            loglevel="WARNING",
        )
        # The worker must not install signal handlers: it is not the main thread.
        _worker_thread = threading.Thread(target=_worker.start, name="celery-worker", daemon=True)
        _worker_thread.start()
        logger.info("embedded Celery worker started")


def start_beat() -> None:
    """Start Celery beat as a thread of this process (idempotent)."""
    global _beat
    from celery.beat import EmbeddedService

    with _lock:
        if _beat is not None:
            return
        _beat = EmbeddedService(celery_app, thread=True, schedule_filename=None)
        _beat.start()
        logger.info("embedded Celery beat started")


def worker_is_running() -> bool:
    return _worker_thread is not None and _worker_thread.is_alive()


def stop() -> None:
    """Stop beat and the worker, waiting for running tasks to finish."""
    global _worker, _worker_thread, _beat
    with _lock:
        if _beat is not None:
            _beat.stop()
            _beat = None
        if _worker is not None:
            _worker.stop(in_sighandler=False)
            if _worker_thread is not None:
                _worker_thread.join(timeout=10)
            _worker = None
            _worker_thread = None
