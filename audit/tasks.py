"""Periodic audit work (thin: call a service)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="audit.checkpoint", acks_late=True)
def checkpoint() -> int:
    """Sign a checkpoint for every stream with new records (beat runs this every GPUPOOL_AUDIT_CHECKPOINT_SECONDS;
    DESIGN §12 asks for at least every 60 s). Idempotent: a stream without new records gets none."""
    from audit.services import checkpoint_all

    return len(checkpoint_all())
