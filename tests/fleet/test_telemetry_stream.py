"""Live telemetry to browsers: who sees what (tenant isolation), batching, throttling, snapshots."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from nodeagent import protocol
from scheduler.fleet.consumers import TelemetryConsumer
from scheduler.fleet.models import Device
from scheduler.fleet.telemetry import Throttle
from scheduler.models import Allocation, Job, JobState
from tests.factories import AuditorFactory, MembershipFactory, SystemAdminFactory, TenantFactory, UserFactory
from tests.fleet.conftest import browser_socket, connect_agent, hello, register_node, settle, telemetry

db = database_sync_to_async


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the throttle unit -----------------------------------------------------------------------------------------


def test_throttle_lets_the_first_message_through_and_holds_the_rest_of_its_second():
    clock = FakeClock()  # at 1000.0, the start of a slot
    throttle = Throttle(interval_s=1.0, clock=clock)
    assert throttle.delay() == 0
    clock.now += 0.25
    throttle.sent()
    assert throttle.delay() == pytest.approx(0.75)
    clock.now += 0.75
    assert throttle.delay() == 0
    throttle.sent()
    clock.now += 5
    assert throttle.delay() == 0


def test_throttle_never_sends_two_messages_in_one_second():
    clock = FakeClock()
    throttle = Throttle(interval_s=1.0, clock=clock)
    sent_at = []
    for _step in range(1000):  # offers every 10 ms for 10 s
        if throttle.delay() == 0:
            throttle.sent()
            sent_at.append(clock.now)
        clock.now += 0.01
    assert len(sent_at) == 10
    assert len({int(moment) for moment in sent_at}) == len(sent_at)  # one per second, never two
    # And over any window of one second, at most two (one at each side of a boundary).
    assert all(sum(start <= moment < start + 1 for moment in sent_at) <= 2 for start in sent_at)


def test_a_one_off_delay_does_not_hold_back_every_later_frame():
    """A viewer of one node (1 Hz): after one frame was held, the next ones go out as they arrive."""
    clock = FakeClock()
    throttle = Throttle(interval_s=1.0, clock=clock)
    waits = []
    for arrival in [1000.10, 1000.95, 1002.10, 1003.10, 1004.10]:  # the second came early (a server stall)
        clock.now = arrival
        wait = throttle.delay()
        waits.append(round(wait, 2))
        clock.now += wait
        throttle.sent()
    assert waits == [0, 0.05, 0, 0, 0]


# --- fan-out -----------------------------------------------------------------------------------------------------


def allocate(device: Device, tenant) -> Allocation:
    flavor = device.flavor
    job = Job.objects.create(
        tenant=tenant,
        name=f"job-{device.uuid}",
        millis_per_replica=500,
        memory_mib_per_replica=1000,
        flavors=[flavor.name],
        state=JobState.RUNNING,
    )
    return Allocation.objects.create(
        job=job,
        replica=0,
        tenant=tenant,
        flavor=flavor,
        device=device,
        node=device.node,
        millis=500,
        memory_mib=1000,
        started_at=timezone.now(),
    )


async def receive_json(socket, timeout: float = 5) -> dict:
    return json.loads(await socket.receive_from(timeout=timeout))


async def welcome(socket) -> dict:
    connected, _ = await socket.connect()
    assert connected
    frame = await receive_json(socket)
    while frame["type"] != "welcome":
        frame = await receive_json(socket)
    return frame


def devices_in(frame: dict) -> set[str]:
    return {uuid for node in frame["nodes"] for uuid in node["devices"]}


@pytest.fixture
def two_tenants():
    """Tenants A and B sharing node n1 (card 0 for A, card 1 for B); node n2 only B's. Users a (member of
    A's parent, so A is in its subtree) and b (member of B)."""
    parent = TenantFactory(slug="org-a")
    tenant_a = TenantFactory(slug="team-a", parent=parent)
    tenant_b = TenantFactory(slug="team-b")
    user_a, user_b = UserFactory(username="alice-a"), UserFactory(username="bob-b")
    MembershipFactory(user=user_a, tenant=parent)
    MembershipFactory(user=user_b, tenant=tenant_b)
    return {"a": user_a, "b": user_b, "tenant_a": tenant_a, "tenant_b": tenant_b}


@pytest.mark.django_db(transaction=True)
async def test_a_tenant_socket_never_receives_another_tenants_devices(two_tenants, monkeypatch):
    monkeypatch.setattr(TelemetryConsumer, "throttle_interval_s", 0.0)  # every batch its own message
    node1, cred1 = await db(register_node)("n1")
    _node2, cred2 = await db(register_node)("n2")
    agent1 = await connect_agent(cred1, "n1", devices=3)
    agent2 = await connect_agent(cred2, "n2", devices=1)

    def allocate_all():
        allocate(Device.objects.get(uuid="GPU-n1-0"), two_tenants["tenant_a"])
        allocate(Device.objects.get(uuid="GPU-n1-1"), two_tenants["tenant_b"])
        allocate(Device.objects.get(uuid="GPU-n2-0"), two_tenants["tenant_b"])

    await db(allocate_all)()
    # The agents re-read who holds their cards on hello; say hello again instead of waiting for the refresh.
    for agent, name, count in [(agent1, "n1", 3), (agent2, "n2", 1)]:
        await agent.send_to(text_data=protocol.encode(hello(name, devices=count)))
        await settle(agent)

    browser_a = await browser_socket(two_tenants["a"])
    browser_b = await browser_socket(two_tenants["b"])
    assert (await welcome(browser_a))["tenants"]
    await welcome(browser_b)
    for tick in range(3):
        await agent1.send_to(text_data=protocol.encode(telemetry([f"GPU-n1-{i}" for i in range(3)], utilization=tick)))
        await agent2.send_to(text_data=protocol.encode(telemetry(["GPU-n2-0"], utilization=tick)))
    await settle(agent1)
    await settle(agent2)
    seen_a, seen_b = set(), set()
    while not await browser_a.receive_nothing(timeout=0.3):
        seen_a |= devices_in(await receive_json(browser_a))
    while not await browser_b.receive_nothing(timeout=0.3):
        seen_b |= devices_in(await receive_json(browser_b))
    assert seen_a == {"GPU-n1-0"}
    assert seen_b == {"GPU-n1-1", "GPU-n2-0"}
    # A tenant user cannot widen its view by subscribing to a node.
    await browser_a.send_json_to({"subscribe": {"node": node1.pk}})
    assert (await receive_json(browser_a))["code"] == "forbidden"
    for socket in (browser_a, browser_b, agent1, agent2):
        await socket.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_reconnecting_tenant_viewer_gets_a_snapshot_of_only_its_devices_first(two_tenants):
    _node, credential = await db(register_node)("n1")
    agent = await connect_agent(credential, "n1", devices=2)
    await agent.send_to(text_data=protocol.encode(telemetry(["GPU-n1-0", "GPU-n1-1"], utilization=42.0)))
    await settle(agent)
    await db(lambda: allocate(Device.objects.get(uuid="GPU-n1-1"), two_tenants["tenant_b"]))()
    browser = await browser_socket(two_tenants["b"])
    connected, _ = await browser.connect()
    assert connected
    snapshot = await receive_json(browser)
    assert snapshot["type"] == "telemetry"
    [entry] = snapshot["nodes"]
    assert entry["snapshot"] is True and set(entry["devices"]) == {"GPU-n1-1"}
    assert entry["devices"]["GPU-n1-1"]["utilization_pct"] == 42.0
    await browser.disconnect()
    await agent.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_an_admin_subscribes_to_a_node_and_gets_one_frame_per_node_per_tick():
    admin = await db(SystemAdminFactory)()
    node, credential = await db(register_node)("n1")
    agent = await connect_agent(credential, "n1", devices=8)
    browser = await browser_socket(admin)
    assert (await welcome(browser))["admin"] is True
    await browser.send_json_to({"subscribe": {"node": node.pk}})
    assert await receive_json(browser) == {"type": "subscribed", "node": node.pk}
    await agent.send_to(text_data=protocol.encode(telemetry([f"GPU-n1-{i}" for i in range(8)])))
    frame = await receive_json(browser)
    assert frame["type"] == "telemetry"
    [entry] = frame["nodes"]  # eight cards, one entry for the node
    assert entry["node"] == node.pk and entry["name"] == "n1" and len(entry["devices"]) == 8
    assert entry["sent_at"]
    await browser.send_json_to({"subscribe": {"node": 999999}})
    assert (await receive_json(browser))["code"] == "not_found"
    await browser.disconnect()
    await agent.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_batches_within_the_interval_are_coalesced_into_the_next_message(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(TelemetryConsumer, "monotonic", staticmethod(clock))
    admin = await db(SystemAdminFactory)()
    node, credential = await db(register_node)("n1")
    agent = await connect_agent(credential, "n1", devices=2)
    browser = await browser_socket(admin)
    await welcome(browser)
    await browser.send_json_to({"subscribe": {"node": node.pk}})
    assert (await receive_json(browser))["type"] == "subscribed"
    await agent.send_to(text_data=protocol.encode(telemetry(["GPU-n1-0"], utilization=1.0)))
    first = await receive_json(browser)
    assert first["nodes"][0]["devices"]["GPU-n1-0"]["utilization_pct"] == 1.0
    # Within the same second (the fake clock stands still): held back.
    await agent.send_to(text_data=protocol.encode(telemetry(["GPU-n1-0"], utilization=2.0)))
    await agent.send_to(text_data=protocol.encode(telemetry(["GPU-n1-1"], utilization=3.0)))
    await settle(agent)
    assert await browser.receive_nothing(timeout=0.2)
    clock.now += 1.0
    await agent.send_to(text_data=protocol.encode(telemetry(["GPU-n1-0"], utilization=4.0)))
    second = await receive_json(browser)
    [entry] = second["nodes"]
    assert entry["coalesced"] == 2
    assert entry["devices"]["GPU-n1-0"]["utilization_pct"] == 4.0  # latest wins
    assert entry["devices"]["GPU-n1-1"]["utilization_pct"] == 3.0  # nothing lost
    await browser.disconnect()
    await agent.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_anonymous_sockets_and_auditors_are_refused():
    from channels.testing import WebsocketCommunicator

    from portal.asgi import application

    anonymous = WebsocketCommunicator(
        application, "/ws/telemetry/", headers=[(b"host", b"testserver"), (b"origin", b"http://testserver")]
    )
    await anonymous.connect()
    assert (await anonymous.receive_output(timeout=5))["code"] == 4401
    auditor = await browser_socket(await db(AuditorFactory)())
    await auditor.connect()
    assert (await receive_json(auditor))["code"] == "forbidden"
    assert (await auditor.receive_output(timeout=5))["code"] == 4403


@pytest.mark.django_db(transaction=True)
async def test_a_browser_socket_from_another_origin_is_refused():
    user = await db(UserFactory)()
    socket = await browser_socket(user)
    socket.scope["headers"] = [(k, v) for k, v in socket.scope["headers"] if k != b"origin"] + [
        (b"origin", b"http://evil.example")
    ]
    connected, _ = await socket.connect()
    assert not connected


@pytest.mark.django_db(transaction=True)
async def test_nodes_nobody_watches_cost_no_group_send(monkeypatch):
    from channels.layers import get_channel_layer

    from scheduler.fleet.consumers import TELEMETRY_LAYER

    layer = get_channel_layer(TELEMETRY_LAYER)
    sent_to: list[str] = []
    original = layer.group_send

    async def counting_group_send(group, message):
        sent_to.append(group)
        await original(group, message)

    monkeypatch.setattr(layer, "group_send", counting_group_send)
    admin = await db(SystemAdminFactory)()
    node, credential = await db(register_node)("n1")
    agent = await connect_agent(credential, "n1", devices=1)
    await agent.send_to(text_data=protocol.encode(telemetry(["GPU-n1-0"])))
    await settle(agent)
    assert f"node.{node.pk}" not in sent_to
    browser = await browser_socket(admin)
    await welcome(browser)
    await browser.send_json_to({"subscribe": {"node": node.pk}})
    assert (await receive_json(browser))["type"] == "subscribed"
    await receive_json(browser)  # the snapshot
    await agent.send_to(text_data=protocol.encode(telemetry(["GPU-n1-0"])))
    await settle(agent)
    assert sent_to.count(f"node.{node.pk}") == 1
    await browser.disconnect()
    await agent.disconnect()
