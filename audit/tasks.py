"""Periodic audit work (thin: call a service)."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_shutdown

from audit.integrity import run_integrity_check
from audit.services import checkpoint_all

logger = logging.getLogger(__name__)


@shared_task(name="audit.checkpoint", acks_late=True)
def checkpoint() -> int:
    """Seal every stream with new records to the witness (beat runs this every GPUPOOL_AUDIT_CHECKPOINT_SECONDS,
    5 s by default: the tail a database administrator could cut undetected). Idempotent and cheap when nothing
    changed (one query on the chain-head table)."""
    return len(checkpoint_all())


@shared_task(name="audit.integrity_check", acks_late=True)
def integrity_check() -> bool:
    """Verify what changed since the last run against the witness and the trust root (audit.integrity)."""
    return run_integrity_check().ok


@worker_shutdown.connect
def checkpoint_on_shutdown(**_kwargs) -> None:
    """A worker going down seals what it (and the web processes) appended since the last beat, so a stopped
    deployment leaves no unwitnessed tail. Errors are logged: shutdown must go on."""
    try:
        made = checkpoint_all()
        logger.info("audit: %d checkpoint(s) sealed to the witness on worker shutdown", len(made))
    except Exception:
        logger.exception("audit: could not seal the chain heads on worker shutdown")
