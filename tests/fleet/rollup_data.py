"""Minute rollups for tests, written the way an agent socket hands them over (``telemetry_minutes_write``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from scheduler.fleet.models import Device
from scheduler.fleet.services.rollups import telemetry_minutes_write
from scheduler.fleet.telemetry import MinuteAggregate, minute_of


def write_minutes(
    devices: Iterable[Device],
    *,
    now: datetime,
    minutes_back: int,
    utilisation: Callable[[Device, int], float] = lambda device, minutes_ago: 50.0,
) -> int:
    """One rollup per card for each of the ``minutes_back`` finished minutes before ``now`` (1 = the last one);
    ``utilisation(device, minutes_ago)`` gives each minute's average. Returns the rows written."""
    devices = list(devices)
    aggregates = []
    for device in devices:
        for minutes_ago in range(1, minutes_back + 1):
            value = utilisation(device, minutes_ago)
            aggregates.append(
                MinuteAggregate(
                    uuid=device.uuid,
                    minute=minute_of(now) - timedelta(minutes=minutes_ago),
                    samples=60,
                    utilization_sum=value * 60,
                    utilization_max=value,
                    memory_sum=1024.0 * 60,
                    memory_max=1024.0,
                    power_sum=200.0 * 60,
                    power_samples=60,
                    temperature_max=55.0,
                )
            )
    return telemetry_minutes_write(aggregates=aggregates, device_ids={d.uuid: d.pk for d in devices})
