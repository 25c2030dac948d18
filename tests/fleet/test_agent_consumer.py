"""The agent socket: authentication, framing errors, inventory, heartbeats, outbox delivery."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from channels.db import database_sync_to_async

from audit.models import AuditRecord
from catalog.models import ResourceFlavor
from nodeagent import protocol
from scheduler.fleet.consumers import AgentConsumer
from scheduler.fleet.models import AgentCommand, Device, DeviceHealth, Node, NodeCredential, NodeStatus
from scheduler.fleet.runtime import fleet_process
from scheduler.fleet.services.enrolment import CLOSE_REPLACED, CLOSE_UNAUTHORIZED, node_credentials_revoke
from scheduler.fleet.services.notify import agent_group
from tests.fleet.conftest import agent_socket, connect_agent, hello, register_node, settle, telemetry

pytestmark = pytest.mark.django_db(transaction=True)

db = database_sync_to_async


async def expect_close(socket, code: int) -> None:
    output = await socket.receive_output(timeout=5)
    assert output == {"type": "websocket.close", "code": code}


async def test_a_registered_node_connects_and_gets_its_config():
    node, credential = await db(register_node)("gpu-a")
    socket = await connect_agent(credential)
    await socket.disconnect()
    row = await db(NodeCredential.objects.get)(node=node)
    assert row.last_seen_at is not None


@pytest.mark.parametrize("credential", [None, "", "gpn_0123456789abcdef_nope", "Basic abc"])
async def test_missing_or_unknown_credentials_are_closed_with_4401_and_audited(credential):
    await db(register_node)("gpu-a")
    socket = agent_socket(credential)
    connected, _ = await socket.connect()
    assert connected  # accepted, so the agent can read the close code
    await expect_close(socket, CLOSE_UNAUTHORIZED)
    assert await db(AuditRecord.objects.filter(action="node.auth_failed", outcome="failure").exists)()


async def test_a_forged_secret_for_a_real_key_is_refused():
    _node, credential = await db(register_node)("gpu-a")
    forged = credential[: credential.rindex("_") + 1] + "x" * 43
    socket = agent_socket(forged)
    await socket.connect()
    await expect_close(socket, CLOSE_UNAUTHORIZED)


async def test_revoking_disconnects_the_live_socket_and_refuses_reconnects():
    node, credential = await db(register_node)("gpu-a")
    socket = await connect_agent(credential, "gpu-a")
    await db(node_credentials_revoke)(actor=None, node=node)
    await expect_close(socket, CLOSE_UNAUTHORIZED)
    again = agent_socket(credential)
    await again.connect()
    await expect_close(again, CLOSE_UNAUTHORIZED)


async def test_a_second_connection_with_the_same_node_replaces_the_first():
    _node, credential = await db(register_node)("gpu-a")
    first = await connect_agent(credential, "gpu-a")
    second = await connect_agent(credential)
    await expect_close(first, CLOSE_REPLACED)
    await second.disconnect()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("this is not json", "malformed"),
        ('{"v": 2, "type": "heartbeat", "id": "x", "seq": 1}', "unsupported_version"),
        ('{"v": 1, "type": "teleport", "id": "x"}', "unknown_type"),
        ('{"v": 1, "type": "heartbeat", "id": "x", "seq": "one"}', "invalid_field"),
        ('{"v": 1, "type": "config", "id": "x"}', "unknown_type"),
    ],
)
async def test_a_bad_frame_gets_an_error_frame_and_the_connection_survives(frame, code):
    _node, credential = await db(register_node)("gpu-a")
    socket = await connect_agent(credential)
    await socket.send_to(text_data=frame)
    error = json.loads(await socket.receive_from())
    assert error["type"] == "error" and error["code"] == code and error["detail"]
    # Still usable: the hello that follows is processed.
    await socket.send_to(text_data=protocol.encode(hello("gpu-a", devices=1)))
    await settle(socket)
    assert await db(Device.objects.filter(node__name="gpu-a").count)() == 1
    await socket.disconnect()


async def test_frames_before_hello_are_refused_politely():
    _node, credential = await db(register_node)("gpu-a")
    socket = await connect_agent(credential)
    await socket.send_to(text_data=protocol.encode(protocol.Heartbeat(seq=1)))
    error = json.loads(await socket.receive_from())
    assert error["code"] == "hello_required"
    await socket.disconnect()


async def test_hello_creates_devices_with_flavors_and_makes_the_node_ready():
    node, credential = await db(register_node)("gpu-a")
    await db(ResourceFlavor.objects.create)(
        name="nvidia-h100-80g", vendor="nvidia", model="NVIDIA H100 80GB HBM3", memory_mib=81559
    )
    socket = await connect_agent(credential, "gpu-a", devices=4)
    await socket.send_to(text_data=protocol.encode(hello("gpu-a", devices=2, model="Ascend 910B", prefix="NPU")))
    await settle(socket)
    await socket.disconnect()
    node = await db(Node.objects.get)(pk=node.pk)
    assert node.status == NodeStatus.READY and node.cpu_cores == 32 and node.last_heartbeat_at is not None
    devices = await db(lambda: list(Device.objects.filter(node=node).select_related("flavor").order_by("uuid")))()
    gpus = [device for device in devices if device.uuid.startswith("GPU-")]
    npus = [device for device in devices if device.uuid.startswith("NPU-")]
    # The first hello mapped onto the existing flavor; the second created one for the unknown model.
    assert {device.flavor.name for device in gpus} == {"nvidia-h100-80g"}
    assert {device.flavor.name for device in npus} == {"nvidia-ascend-910b-80g"}
    # The cards the second hello no longer reports are kept but unhealthy.
    assert {device.health for device in gpus} == {DeviceHealth.UNHEALTHY}
    assert sorted(device.index for device in npus) == [0, 1]


async def test_heartbeats_renew_the_lease_with_the_consumers_clock(monkeypatch):
    fake_now = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)
    monkeypatch.setattr(AgentConsumer, "clock", staticmethod(lambda: fake_now))
    node, credential = await db(register_node)("gpu-a")
    socket = await connect_agent(credential, "gpu-a")
    fake_now = datetime(2026, 1, 5, 12, 0, 7, tzinfo=UTC)
    await socket.send_to(text_data=protocol.encode(protocol.Heartbeat(seq=1)))
    await settle(socket)
    # Heartbeats are batched and written about once a second; write this batch now.
    await fleet_process().flush()
    await socket.disconnect()
    node = await db(Node.objects.get)(pk=node.pk)
    assert node.last_heartbeat_at == fake_now


async def test_unacked_commands_are_sent_after_hello_and_acks_are_recorded():
    node, credential = await db(register_node)("gpu-a")

    def make_command(job_id: int) -> AgentCommand:
        row = AgentCommand.objects.create(node=node, command_type="workload.stop", payload={})
        row.payload = protocol.to_dict(protocol.WorkloadStop(command_id=row.pk, job_id=job_id, replica=0))
        row.save(update_fields=["payload"])
        return row

    first = await db(make_command)(1)
    socket = await connect_agent(credential)
    await socket.send_to(text_data=protocol.encode(hello("gpu-a")))
    frame = json.loads(await socket.receive_from())
    assert frame["type"] == "workload.stop" and frame["command_id"] == first.pk
    await settle(socket)
    # A command written while connected is announced through the node's group (the outbox contract).
    second = await db(make_command)(2)
    await socket.send_to(text_data=protocol.encode(protocol.Ack(command_id=first.pk)))
    from channels.layers import get_channel_layer

    await get_channel_layer().group_send(agent_group(node.pk), {"type": "agent.command", "command_id": second.pk})
    frame = json.loads(await socket.receive_from())
    assert frame["command_id"] == second.pk
    await socket.send_to(text_data=protocol.encode(protocol.Ack(command_id=second.pk, ok=False, error="no such job")))
    await settle(socket)
    await socket.disconnect()
    first = await db(AgentCommand.objects.get)(pk=first.pk)
    second = await db(AgentCommand.objects.get)(pk=second.pk)
    assert first.sent_at and first.acked_at and first.ack_ok is True
    assert second.acked_at and second.ack_ok is False and second.error == "no such job"


async def test_sent_but_unacked_commands_are_sent_again_on_reconnect():
    node, credential = await db(register_node)("gpu-a")
    row = await db(AgentCommand.objects.create)(
        node=node, command_type="config", payload={"v": 1, "type": "config", "id": "c1", "command_id": 0}
    )
    for _attempt in range(2):
        socket = await connect_agent(credential)
        await socket.send_to(text_data=protocol.encode(hello("gpu-a")))
        assert json.loads(await socket.receive_from())["id"] == "c1"
        await socket.disconnect()
    row = await db(AgentCommand.objects.get)(pk=row.pk)
    assert row.attempts == 2 and row.acked_at is None


async def test_workload_status_goes_to_the_scheduler(monkeypatch):
    reports = []
    monkeypatch.setattr(
        "scheduler.fleet.services.agent_commands.workload_status_report", lambda **kwargs: reports.append(kwargs)
    )
    node, credential = await db(register_node)("gpu-a")
    socket = await connect_agent(credential, "gpu-a")
    status = protocol.WorkloadStatus(
        job_id=7, replica=1, state="failed", exit_code=3, last_checkpoint_at="2026-01-05T11:00:00+00:00"
    )
    await socket.send_to(text_data=protocol.encode(status))
    await settle(socket)
    await socket.disconnect()
    [report] = reports
    assert report["node"].pk == node.pk and report["job_id"] == 7 and report["replica"] == 1
    assert report["state"] == "failed" and report["exit_code"] == 3
    assert report["last_checkpoint_at"] == datetime(2026, 1, 5, 11, 0, tzinfo=UTC)


async def test_telemetry_for_devices_not_in_the_hello_is_ignored():
    node, credential = await db(register_node)("gpu-a")
    socket = await connect_agent(credential, "gpu-a", devices=1)
    await socket.send_to(text_data=protocol.encode(telemetry(["GPU-gpu-a-0", "GPU-someone-else"])))
    await settle(socket)
    await socket.disconnect()
    from scheduler.fleet.telemetry import latest_store

    assert set(latest_store().get_nodes([node.pk])[node.pk]) == {"GPU-gpu-a-0"}


async def test_telemetry_frames_do_not_each_wait_for_a_database_connection_sweep(monkeypatch):
    """channels would run close_old_connections on the database thread before every frame; at 1,000 agents
    that queue is where the agent-to-browser latency went."""
    import channels.consumer

    _node, credential = await db(register_node)("gpu-sweep")
    sweeps = []

    async def sweep() -> None:
        sweeps.append(1)

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", sweep)
    socket = await connect_agent(credential, "gpu-sweep", devices=2)
    for utilization in (10.0, 20.0, 30.0):
        await socket.send_to(text_data=protocol.encode(telemetry(["GPU-gpu-sweep-0"], utilization=utilization)))
    await settle(socket)
    assert sweeps == []
    await socket.disconnect()
