"""Periodic fleet work (Celery beat entries in ``portal.celery``). Thin: each calls one service."""

from __future__ import annotations

from celery import shared_task

from scheduler.fleet.services import lease, rollups


@shared_task(name="fleet.lease_check", acks_late=True, ignore_result=True)
def lease_check() -> dict:
    return lease.lease_check()


@shared_task(name="fleet.telemetry_rollup_hours", acks_late=True, ignore_result=True)
def telemetry_rollup_hours() -> int:
    return rollups.telemetry_hours_rollup()


@shared_task(name="fleet.telemetry_purge", acks_late=True, ignore_result=True)
def telemetry_purge() -> dict:
    return rollups.telemetry_purge()
