"""Telemetry rollups: per-minute rows aggregated in memory per connection, hourly rows, retention."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from channels.db import database_sync_to_async

from nodeagent import protocol
from scheduler.fleet import tasks
from scheduler.fleet.consumers import AgentConsumer
from scheduler.fleet.models import Device, TelemetryHour, TelemetryMinute
from scheduler.fleet.services.inventory import node_hello
from scheduler.fleet.services.rollups import telemetry_hours_rollup, telemetry_minutes_write, telemetry_purge
from scheduler.fleet.telemetry import ROLLUP_SPREAD_S, MinuteAggregator
from tests.fleet.conftest import connect_agent, register_node, settle, telemetry

db = database_sync_to_async
M0 = datetime(2026, 4, 1, 10, 15, 0, tzinfo=UTC)


def sample(utilization: float, memory: float, power: float | None = 100.0, temperature: float | None = 50.0) -> dict:
    return {"utilization_pct": utilization, "memory_used_mib": memory, "power_w": power, "temperature_c": temperature}


def test_aggregator_keeps_avg_and_max_per_device_and_minute_and_drains_only_finished_minutes():
    aggregator = MinuteAggregator()
    aggregator.add(uuid="a", sample=sample(10, 100, 100, 40), at=M0 + timedelta(seconds=1))
    aggregator.add(uuid="a", sample=sample(30, 300, 200, 70), at=M0 + timedelta(seconds=2))
    aggregator.add(uuid="a", sample=sample(90, 900, None, None), at=M0 + timedelta(minutes=1))
    assert not aggregator.has_finished(M0 + timedelta(seconds=59))
    assert aggregator.has_finished(M0 + timedelta(minutes=1))
    [done] = aggregator.drain(M0 + timedelta(minutes=1, seconds=5))
    assert done.minute == M0 and done.samples == 2
    assert done.utilization_avg == 20 and done.utilization_max == 30
    assert done.memory_avg == 200 and done.memory_max == 300
    assert done.power_avg == 150 and done.temperature_max == 70
    [rest] = aggregator.drain(None)
    assert rest.minute == M0 + timedelta(minutes=1) and rest.power_avg is None and rest.temperature_max is None


@pytest.mark.django_db
def test_a_second_partial_row_for_the_same_minute_is_merged_by_sample_weight():
    node, _credential = register_node("n1")
    import dataclasses

    from tests.fleet.conftest import hello

    ids = node_hello(node_id=node.pk, hello=dataclasses.asdict(hello("n1", devices=1)))
    first, second = MinuteAggregator(), MinuteAggregator()
    for utilization in (10, 20, 30):
        first.add(uuid="GPU-n1-0", sample=sample(utilization, 100), at=M0)
    second.add(uuid="GPU-n1-0", sample=sample(90, 500, temperature=80), at=M0 + timedelta(seconds=30))
    assert telemetry_minutes_write(aggregates=first.drain(None), device_ids=ids) == 1
    assert telemetry_minutes_write(aggregates=second.drain(None), device_ids=ids) == 1
    row = TelemetryMinute.objects.get()
    assert row.samples == 4
    assert row.utilization_avg_pct == pytest.approx(37.5) and row.utilization_max_pct == 90
    assert row.memory_used_avg_mib == pytest.approx(200) and row.memory_used_max_mib == 500
    assert row.temperature_max_c == 80


@pytest.mark.django_db
def test_two_connections_minutes_written_together_are_merged_not_overwritten():
    """What two sockets of one node finish in the same moment reaches the database in one group write."""
    node, _credential = register_node("n1")
    import dataclasses

    from tests.fleet.conftest import hello

    ids = node_hello(node_id=node.pk, hello=dataclasses.asdict(hello("n1", devices=1)))
    first, second = MinuteAggregator(), MinuteAggregator()
    for utilization in (10, 20, 30):
        first.add(uuid="GPU-n1-0", sample=sample(utilization, 100), at=M0)
    second.add(uuid="GPU-n1-0", sample=sample(90, 500, power=None, temperature=80), at=M0 + timedelta(seconds=30))
    assert telemetry_minutes_write(aggregates=first.drain(None) + second.drain(None), device_ids=ids) == 1
    row = TelemetryMinute.objects.get()
    assert row.samples == 4
    assert row.utilization_avg_pct == pytest.approx(37.5) and row.utilization_max_pct == 90
    assert row.memory_used_max_mib == 500 and row.temperature_max_c == 80
    assert row.power_avg_w == pytest.approx(100)


@pytest.mark.django_db(transaction=True)
async def test_the_agent_connection_writes_one_row_per_device_minute_not_one_per_sample(monkeypatch):
    clock = {"now": M0}
    monkeypatch.setattr(AgentConsumer, "clock", staticmethod(lambda: clock["now"]))
    _node, credential = await db(register_node)("n1")
    socket = await connect_agent(credential, "n1", devices=2)
    uuids = ["GPU-n1-0", "GPU-n1-1"]
    for second, utilization in [(0, 10.0), (1, 20.0), (2, 60.0)]:
        sent_at = protocol.format_time(M0 + timedelta(seconds=second))
        await socket.send_to(text_data=protocol.encode(telemetry(uuids, utilization=utilization, sent_at=sent_at)))
    await settle(socket)
    assert await db(TelemetryMinute.objects.count)() == 0  # still in memory: the minute is not over
    # The next minute is well under way: the first one is written (a buffered batch is stored too, though not
    # shown live).
    clock["now"] = M0 + timedelta(minutes=1, seconds=ROLLUP_SPREAD_S)
    later = protocol.format_time(M0 + timedelta(minutes=1, seconds=1))
    await socket.send_to(text_data=protocol.encode(telemetry(uuids, utilization=99.0, sent_at=later, buffered=True)))
    await settle(socket)
    rows = await db(lambda: list(TelemetryMinute.objects.filter(minute=M0).select_related("device")))()
    assert len(rows) == 2
    assert {row.device.uuid for row in rows} == set(uuids)
    assert all(row.samples == 3 and row.utilization_avg_pct == pytest.approx(30.0) for row in rows)
    assert all(row.utilization_max_pct == 60.0 and row.power_avg_w == 300.0 for row in rows)
    # Closing the socket flushes the minute in progress.
    await socket.disconnect()
    assert await db(TelemetryMinute.objects.filter(minute=M0 + timedelta(minutes=1)).count)() == 2


@pytest.mark.django_db(transaction=True)
async def test_telemetry_does_not_wait_for_the_minute_write(monkeypatch):
    """A thousand agents cross the minute together; their next frames must not queue behind that write."""
    clock = {"now": M0}
    monkeypatch.setattr(AgentConsumer, "clock", staticmethod(lambda: clock["now"]))
    release = threading.Event()
    write = telemetry_minutes_write

    def slow_write(**kwargs):
        release.wait(timeout=10)
        return write(**kwargs)

    monkeypatch.setattr("scheduler.fleet.services.rollups.telemetry_minutes_write", slow_write)
    _node, credential = await db(register_node)("n1")
    socket = await connect_agent(credential, "n1", devices=1)
    uuids = ["GPU-n1-0"]
    await socket.send_to(text_data=protocol.encode(telemetry(uuids, sent_at=protocol.format_time(M0))))
    clock["now"] = M0 + timedelta(minutes=1, seconds=ROLLUP_SPREAD_S)
    for utilization in (40.0, 50.0):
        sent_at = protocol.format_time(clock["now"])
        await socket.send_to(text_data=protocol.encode(telemetry(uuids, utilization=utilization, sent_at=sent_at)))
    # The socket answers a frame after those while the minute write is still blocked.
    await socket.send_to(text_data='{"v": 1, "type": "nope", "id": "probe"}')
    frame = json.loads(await socket.receive_from(timeout=5))
    assert frame["type"] == "error" and frame["ref_id"] == "probe"
    assert not release.is_set()
    release.set()
    await settle(socket)
    assert await db(TelemetryMinute.objects.filter(minute=M0).count)() == 1
    await socket.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_nodes_write_their_finished_minute_at_different_seconds(monkeypatch):
    """Spread over half a minute: a thousand nodes must not all write at :00."""
    clock = {"now": M0}
    monkeypatch.setattr(AgentConsumer, "clock", staticmethod(lambda: clock["now"]))
    node, credential = await db(register_node)("n1")
    delay_s = node.pk % ROLLUP_SPREAD_S
    socket = await connect_agent(credential, "n1", devices=1)
    await socket.send_to(text_data=protocol.encode(telemetry(["GPU-n1-0"], sent_at=protocol.format_time(M0))))
    clock["now"] = M0 + timedelta(minutes=1, seconds=delay_s) - timedelta(milliseconds=1)
    await socket.send_to(text_data=protocol.encode(telemetry(["GPU-n1-0"], sent_at=protocol.format_time(clock["now"]))))
    await settle(socket)
    assert await db(TelemetryMinute.objects.filter(minute=M0).count)() == 0
    clock["now"] = M0 + timedelta(minutes=1, seconds=delay_s)
    await socket.send_to(text_data=protocol.encode(telemetry(["GPU-n1-0"], sent_at=protocol.format_time(clock["now"]))))
    await settle(socket)
    assert await db(TelemetryMinute.objects.filter(minute=M0).count)() == 1
    await socket.disconnect()


@pytest.mark.django_db
def test_hourly_rows_are_built_from_minutes_and_rebuilding_is_idempotent():
    node, _credential = register_node("n1")
    device = Device.objects.create(node=node, index=0, uuid="GPU-x", vendor="nvidia", model="m", memory_mib=1000)
    hour = M0.replace(minute=0)
    for minute, (avg, peak, samples) in enumerate([(10, 20, 60), (50, 100, 60), (30, 40, 30)]):
        TelemetryMinute.objects.create(
            device=device,
            minute=hour + timedelta(minutes=minute),
            samples=samples,
            utilization_avg_pct=avg,
            utilization_max_pct=peak,
            memory_used_avg_mib=avg * 10,
            memory_used_max_mib=peak * 10,
            power_avg_w=100,
            temperature_max_c=60 + minute,
        )
    # The current hour is not rolled up yet.
    assert telemetry_hours_rollup(now=hour + timedelta(minutes=30)) == 0
    assert telemetry_hours_rollup(now=hour + timedelta(hours=1, minutes=5)) == 1
    assert telemetry_hours_rollup(now=hour + timedelta(hours=1, minutes=10)) == 1
    row = TelemetryHour.objects.get()
    assert row.hour == hour and row.samples == 150
    assert row.utilization_avg_pct == pytest.approx((10 * 60 + 50 * 60 + 30 * 30) / 150)
    assert row.utilization_max_pct == 100 and row.temperature_max_c == 62


@pytest.mark.django_db
def test_minutes_are_kept_30_days_and_hours_a_year():
    node, _credential = register_node("n1")
    device = Device.objects.create(node=node, index=0, uuid="GPU-x", vendor="nvidia", model="m", memory_mib=1000)
    now = datetime(2026, 6, 1, tzinfo=UTC)
    values = {
        "samples": 1,
        "utilization_avg_pct": 1,
        "utilization_max_pct": 1,
        "memory_used_avg_mib": 1,
        "memory_used_max_mib": 1,
    }
    TelemetryMinute.objects.create(device=device, minute=now - timedelta(days=31), **values)
    TelemetryMinute.objects.create(device=device, minute=now - timedelta(days=29), **values)
    TelemetryHour.objects.create(device=device, hour=now - timedelta(days=366), **values)
    TelemetryHour.objects.create(device=device, hour=now - timedelta(days=364), **values)
    assert telemetry_purge(now=now) == {"minutes": 1, "hours": 1, "agent_reports": 0}
    assert TelemetryMinute.objects.count() == 1 and TelemetryHour.objects.count() == 1
    assert tasks.telemetry_purge.apply().get() == {
        "minutes": 1,
        "hours": 1,
        "agent_reports": 0,
    }  # today is long after 2026-06
