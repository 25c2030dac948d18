"""A node speaks only for its own devices.

Regression of the device hijack found in issue 17: with a stolen node credential, a ``hello`` listing another
node's device UUID (every tenant could read the UUIDs at ``/api/v1/devices/``) moved the card to the attacker's
node, and the real node's next hello failed with ``IntegrityError device_unique_node_index`` for ever. Now the
claim is refused with an ``error`` frame and an audit record, nothing moves, the owner is unaffected; a system
admin re-homes a card that really moved; tenant users see only the UUIDs of the cards their jobs hold.
"""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditRecord
from kernel.api import DomainError
from nodeagent import protocol
from scheduler.fleet.models import Device, DeviceHealth, Node, NodeAgent, NodeStatus
from scheduler.fleet.services.inventory import device_rehome
from scheduler.models import Allocation
from tests.factories import MembershipFactory, SystemAdminFactory, TenantFactory, UserFactory
from tests.fleet.conftest import connect_agent, hello, register_node, settle

pytestmark = pytest.mark.django_db(transaction=True)

db = database_sync_to_async
MODEL = "NVIDIA H100 80GB HBM3"


def devices_of(node_name: str) -> list[tuple[str, int, str]]:
    return sorted(Device.objects.filter(node__name=node_name).values_list("uuid", "index", "health"))


async def test_a_hello_claiming_another_nodes_device_is_refused_and_nothing_moves():
    owner, owner_credential = await db(register_node)("gpu-owner")
    thief, thief_credential = await db(register_node)("gpu-thief")
    owner_socket = await connect_agent(owner_credential, "gpu-owner", devices=2)
    before = await db(devices_of)("gpu-owner")

    # The thief's hello lists one card of its own and the owner's card 1, read from the devices API.
    socket = await connect_agent(thief_credential)
    stolen = protocol.Hello(
        node_name="gpu-thief",
        agent_version="1.0",
        hostname="thief",
        cpu_cores=8,
        memory_mib=1000,
        devices=[
            protocol.DeviceInfo(index=0, uuid="GPU-thief-0", vendor="nvidia", model=MODEL, memory_mib=1),
            protocol.DeviceInfo(index=1, uuid="GPU-gpu-owner-1", vendor="nvidia", model=MODEL, memory_mib=1),
        ],
    )
    await socket.send_to(text_data=protocol.encode(stolen))
    error = json.loads(await socket.receive_from(timeout=10))
    assert error["type"] == "error" and error["code"] == "device_claimed" and error["ref_id"] == stolen.id
    assert "GPU-gpu-owner-1" in error["detail"] and "gpu-owner" in error["detail"]
    # Still not through: every other frame is answered hello_required.
    await socket.send_to(text_data=protocol.encode(protocol.Heartbeat(seq=1)))
    assert json.loads(await socket.receive_from(timeout=10))["code"] == "hello_required"
    await socket.disconnect()

    assert await db(devices_of)("gpu-owner") == before  # nothing moved
    assert await db(devices_of)("gpu-thief") == []  # not even the thief's own card: the hello was refused whole
    thief_node = await db(Node.objects.get)(pk=thief.pk)
    assert thief_node.status == NodeStatus.NOT_READY
    record = await db(AuditRecord.objects.get)(action="node.device_claim_refused")
    assert record.target == f"node:{thief.pk}"

    # The owner is unaffected: its next hello goes through as before (no IntegrityError, ready).
    await owner_socket.send_to(text_data=protocol.encode(hello("gpu-owner", devices=2)))
    await settle(owner_socket)
    await owner_socket.disconnect()
    assert await db(devices_of)("gpu-owner") == before
    assert (await db(Node.objects.get)(pk=owner.pk)).status == NodeStatus.READY


async def test_a_system_admin_rehomes_a_card_that_moved_and_the_new_node_may_then_report_it():
    _old, old_credential = await db(register_node)("gpu-old")
    _new, new_credential = await db(register_node)("gpu-new")
    socket = await connect_agent(old_credential, "gpu-old", devices=2)
    await socket.disconnect()
    card = await db(Device.objects.get)(uuid="GPU-gpu-old-1")

    def rehome() -> dict:
        admin = SystemAdminFactory()
        member = UserFactory()
        client = APIClient()
        client.force_authenticate(member)
        refused = client.post(f"/api/v1/agents/devices/{card.pk}/rehome/", {"node": "gpu-new"}, format="json")
        assert refused.status_code == 403
        client.force_authenticate(admin)
        answer = client.post(f"/api/v1/agents/devices/{card.pk}/rehome/", {"node": "gpu-new"}, format="json")
        assert answer.status_code == 200, answer.content
        return answer.json()

    answer = await db(rehome)()
    assert answer["node"] == "gpu-new" and answer["uuid"] == "GPU-gpu-old-1"
    moved = await db(Device.objects.select_related("node").get)(pk=card.pk)
    assert moved.node.name == "gpu-new" and moved.health == DeviceHealth.UNHEALTHY
    record = await db(AuditRecord.objects.get)(action="device.rehome")
    assert record.target == f"device:{card.pk}"

    # The new node's hello lists the card: accepted now, with its real index and health.
    new_hello = hello("gpu-new", devices=1, prefix="GPU-gpu-new")
    new_hello.devices.append(
        protocol.DeviceInfo(index=1, uuid="GPU-gpu-old-1", vendor="nvidia", model=MODEL, memory_mib=1)
    )
    socket = await connect_agent(new_credential)
    await socket.send_to(text_data=protocol.encode(new_hello))
    await settle(socket)
    await socket.disconnect()
    assert ("GPU-gpu-old-1", 1, DeviceHealth.HEALTHY) in await db(devices_of)("gpu-new")
    # And the old node claiming it again is refused.
    socket = await connect_agent(old_credential)
    await socket.send_to(text_data=protocol.encode(hello("gpu-old", devices=2)))
    assert json.loads(await socket.receive_from(timeout=10))["code"] == "device_claimed"
    await socket.disconnect()


async def test_a_busy_card_is_not_rehomed():
    _node, credential = await db(register_node)("gpu-busy")
    socket = await connect_agent(credential, "gpu-busy", devices=1)
    await socket.disconnect()

    def attempt() -> str:
        from tests.scheduler.factories import JobFactory

        card = Device.objects.get(uuid="GPU-gpu-busy-0")
        job = JobFactory()
        Allocation.objects.create(
            job=job,
            tenant=job.tenant,
            replica=0,
            node=card.node,
            device=card,
            flavor=card.flavor,
            millis=1000,
            started_at=timezone.now(),
        )
        target = Node.objects.create(name="elsewhere")
        with pytest.raises(DomainError) as refused:
            device_rehome(actor=SystemAdminFactory(), device=card, node=target)
        return refused.value.code

    assert await db(attempt)() == "device_busy"


async def test_the_nodes_sandbox_mode_from_its_hello_is_in_the_api():
    node, credential = await db(register_node)("gpu-mode")
    socket = await connect_agent(credential)
    frame = hello("gpu-mode", devices=1)
    frame.sandbox = "none"
    await socket.send_to(text_data=protocol.encode(frame))
    await settle(socket)
    await socket.disconnect()
    assert (await db(NodeAgent.objects.get)(node_id=node.pk)).sandbox == "none"

    def read() -> tuple[str, str]:
        client = APIClient()
        client.force_authenticate(SystemAdminFactory())
        detail = client.get(f"/api/v1/nodes/{node.pk}/").json()
        fleet = client.get("/api/v1/agents/nodes/").json()
        rows = fleet["results"] if isinstance(fleet, dict) else fleet
        return detail["sandbox"], next(row["sandbox"] for row in rows if row["id"] == node.pk)

    assert await db(read)() == ("none", "none")


def test_tenant_users_see_only_the_uuids_of_cards_their_jobs_hold():
    from tests.scheduler.factories import FlavorFactory, JobFactory

    flavor = FlavorFactory()
    node = Node.objects.create(name="gpu-uuid", status=NodeStatus.READY)
    cards = [
        Device.objects.create(
            node=node, index=i, uuid=f"GPU-secret-{i}", vendor="nvidia", model="m", memory_mib=1, flavor=flavor
        )
        for i in range(3)
    ]
    tenant, other = TenantFactory(), TenantFactory()
    member = UserFactory()
    MembershipFactory(user=member, tenant=tenant, role="member")
    for job, card in ((JobFactory(tenant=tenant), cards[0]), (JobFactory(tenant=other), cards[1])):
        Allocation.objects.create(
            job=job,
            tenant=job.tenant,
            replica=0,
            node=node,
            device=card,
            flavor=flavor,
            millis=1000,
            started_at=timezone.now(),
        )

    client = APIClient()
    client.force_authenticate(member)
    rows = client.get("/api/v1/devices/", {"node": "gpu-uuid"}).json()["results"]
    assert sorted((row["index"], row["uuid"]) for row in rows) == [(0, "GPU-secret-0"), (1, None), (2, None)]
    client.force_authenticate(SystemAdminFactory())
    rows = client.get("/api/v1/devices/", {"node": "gpu-uuid"}).json()["results"]
    assert sorted(row["uuid"] for row in rows) == ["GPU-secret-0", "GPU-secret-1", "GPU-secret-2"]
