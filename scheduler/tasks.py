"""Celery tasks of the scheduler: thin wrappers over ``scheduler.services``."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from scheduler import services


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
    """One scheduling cycle. Safe to run anywhere, any number of times: only one cycle runs at a time
    (the others return ``ran: False`` at once) and a cycle only ever acts on the state it re-reads.

    ``hold_lock=False`` skips the cycle lock; only tests use it, to race the persist step on purpose.
    """
    services.jobs_awaiting_stop_sweep()
    return services.run_cycle(hold_lock=hold_lock).as_dict()
