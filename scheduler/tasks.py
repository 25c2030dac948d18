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
    """One scheduling cycle (beat runs it every few seconds: the safety net under ``cycle_requested``). Safe to
    run anywhere, any number of times: only one cycle runs at a time (the others return ``ran: False`` at once)
    and a cycle only ever acts on the state it re-reads.

    ``hold_lock=False`` skips the cycle lock; only tests use it, to race the persist step on purpose.
    """
    services.jobs_awaiting_stop_sweep()
    return services.run_cycle(hold_lock=hold_lock).as_dict()


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
    """Cycles asked for by changes (``services.request_cycle``): run at once, again while more are asked for.
    Returns the number of cycles run. After ``CYCLE_LOOP_MAX_S`` of back-to-back cycles it queues a fresh task
    on its own queue and ends, so a worker is never held by one task for long."""
    outcome = services.run_requested_cycles()
    if outcome.hand_over:
        queue = (self.request.delivery_info or {}).get("routing_key")
        services.cycle_task_send(queue=queue)
    return outcome.cycles
