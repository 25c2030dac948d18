"""A hostile or compromised node agent on ``/ws/agent/``.

Already covered elsewhere (not repeated here): unknown/forged/missing credentials and a revoked credential on a
live socket (tests/fleet/test_agent_consumer.py), non-JSON, unknown-type, wrong-version and wrongly typed frames
answered with an error frame (same file), used/expired bootstrap tokens and re-registration revoking the old
credential at the service level (tests/fleet/test_registration.py), the protocol's size limit
(tests/nodeagent/test_protocol.py), an oversized frame on the real daphne server (test_load_smoke.py).

Here: an oversized frame at the consumer, frames about *another node's* devices, commands and jobs (which
must change nothing), and credentials of the wrong kind or from the past (a bootstrap token used as a node
credential, a user's API token, a node credential on the REST API, the old credential after re-registering).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from channels.db import database_sync_to_async
from rest_framework.test import APIClient

from audit.models import AuditRecord
from catalog.models import ResourceFlavor
from nodeagent import protocol
from scheduler.fleet.models import AgentCommand
from scheduler.fleet.services.enrolment import CLOSE_UNAUTHORIZED, agent_register, bootstrap_token_create
from scheduler.fleet.telemetry import latest_store
from scheduler.models import Allocation, Job, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tenants.services.quotas import quota_set
from tests.factories import ApiTokenFactory, MembershipFactory, TenantFactory, UserFactory
from tests.fleet.conftest import agent_socket, connect_agent, hello, register_node, settle, telemetry
from tests.security.conftest import assert_unchanged, state_fingerprint

pytestmark = pytest.mark.django_db(transaction=True)
db = database_sync_to_async


def without_audit(fingerprint: dict) -> dict:
    return {label: rows for label, rows in fingerprint.items() if not label.startswith("audit.")}


async def expect_close(socket, code: int) -> None:
    output = await socket.receive_output(timeout=5)
    assert output == {"type": "websocket.close", "code": code}


async def test_an_oversized_frame_gets_too_large_and_changes_nothing():
    _node, credential = await db(register_node)("gpu-a")
    socket = await connect_agent(credential, "gpu-a", devices=2)
    before = await db(state_fingerprint)()
    huge = hello("gpu-a", devices=2)
    huge.devices[0].model = "x" * protocol.MAX_FRAME_BYTES
    await socket.send_to(text_data=json.dumps({"v": 1, "type": "hello", "id": "big", **_hello_fields(huge)}))
    error = json.loads(await socket.receive_from())
    assert (error["type"], error["code"], error["ref_id"]) == ("error", protocol.ErrorCode.TOO_LARGE, "big")
    await settle(socket)  # the connection survives and keeps processing frames
    assert await db(state_fingerprint)() == before
    await socket.disconnect()


def _hello_fields(message: protocol.Hello) -> dict:
    import dataclasses

    fields = dataclasses.asdict(message)
    return {key: value for key, value in fields.items() if key not in ("v", "type", "id")}


async def test_telemetry_for_another_nodes_devices_is_not_recorded():
    _node_a, credential_a = await db(register_node)("gpu-a")
    node_b, credential_b = await db(register_node)("gpu-b")
    socket_b = await connect_agent(credential_b, "gpu-b", devices=2)
    await socket_b.disconnect()
    socket_a = await connect_agent(credential_a, "gpu-a", devices=2)
    before = await db(state_fingerprint)()
    # Node a claims readings for node b's cards.
    await socket_a.send_to(text_data=protocol.encode(telemetry(["GPU-gpu-b-0", "GPU-gpu-b-1"], utilization=99.0)))
    await settle(socket_a)
    latest = await latest_store().aget_nodes([node_b.pk])
    assert not latest.get(node_b.pk), latest
    assert without_audit(await db(state_fingerprint)()) == without_audit(before)
    await socket_a.disconnect()


async def test_an_ack_for_another_nodes_command_changes_nothing():
    _node_a, credential_a = await db(register_node)("gpu-a")
    node_b, _credential_b = await db(register_node)("gpu-b")
    command = await db(AgentCommand.objects.create)(node=node_b, command_type="workload.stop", payload={"job_id": 1})
    socket = await connect_agent(credential_a, "gpu-a")
    before = await db(state_fingerprint)()
    await socket.send_to(text_data=protocol.encode(protocol.Ack(command_id=command.pk, ok=False, error="forged")))
    await settle(socket)
    command = await db(AgentCommand.objects.get)(pk=command.pk)
    assert command.acked_at is None and command.error == ""
    assert without_audit(await db(state_fingerprint)()) == without_audit(before)
    await socket.disconnect()


def _job_running_on(node_name: str):
    """A member's job placed (by the real cycle) on ``node_name``, the only node with a card of its flavor."""
    tenant = TenantFactory(slug="victim-team")
    flavor = ResourceFlavor.objects.get(name="nvidia-h100-80g")
    quota_set(actor=None, tenant=tenant, flavor=flavor, values={"guaranteed_millis": 1000, "limit_millis": 1000})
    member = UserFactory(username="victim")
    MembershipFactory(user=member, tenant=tenant, role="member")
    spec = {
        "name": "victim-job",
        "tenant": "victim-team",
        "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
        "command": ["python", "train.py"],
    }
    job = job_submit(actor=member, spec=spec)
    result = run_cycle()
    job.refresh_from_db()
    assert result.placed == [job.pk], job.pending_message
    assert Allocation.objects.active().get(job=job).node.name == node_name
    return job


@pytest.mark.parametrize("state", ["failed", "succeeded", "stopped", "lost", "running"])
async def test_workload_status_for_a_job_on_another_node_changes_nothing(state):
    _node_a, credential_a = await db(register_node)("gpu-a")
    _node_b, credential_b = await db(register_node)("gpu-b")
    await db(ResourceFlavor.objects.create)(
        name="nvidia-h100-80g", vendor="nvidia", model="NVIDIA H100 80GB HBM3", memory_mib=81559
    )
    socket_b = await connect_agent(credential_b, "gpu-b", devices=1)
    job = await db(_job_running_on)("gpu-b")
    start = json.loads(await socket_b.receive_from(timeout=10))
    assert start["type"] == "workload.start"
    running = protocol.WorkloadStatus(job_id=job.pk, replica=0, state="running", exit_code=None)
    await socket_b.send_to(text_data=protocol.encode(running))
    await settle(socket_b)
    assert (await db(Job.objects.get)(pk=job.pk)).state == JobState.RUNNING

    # Node a holds no allocation of this job: it reports on node b's job anyway.
    socket_a = await connect_agent(credential_a, "gpu-a", devices=1, prefix="NPU-gpu-a", model="Ascend 910B")
    before = await db(state_fingerprint)()
    forged = protocol.WorkloadStatus(
        job_id=job.pk,
        replica=0,
        state=state,
        exit_code=137,
        last_checkpoint_at=datetime(2030, 1, 1, tzinfo=UTC).isoformat(),
        message="forged",
    )
    await socket_a.send_to(text_data=protocol.encode(forged))
    await settle(socket_a)
    after = await db(state_fingerprint)()
    if state == "running":
        # The one change allowed: node a is told to stop its copy (nothing runs where the portal did not place it).
        stops = await db(lambda: list(AgentCommand.objects.filter(node__name="gpu-a", job_id=job.pk)))()
        assert [command.command_type for command in stops] == ["workload.stop"]
        assert stops[0].payload["reason"] == "not_allocated"
        label = AgentCommand._meta.label
        after[label] = [row for row in after[label] if row[0] != stops[0].pk]
    assert after == before
    job = await db(Job.objects.get)(pk=job.pk)
    assert job.state == JobState.RUNNING and job.last_checkpoint_at is None
    await socket_a.disconnect()
    await socket_b.disconnect()


async def test_a_hello_for_another_node_is_refused_and_changes_nothing():
    _node_a, credential_a = await db(register_node)("gpu-a")
    await db(register_node)("gpu-b")
    socket = await connect_agent(credential_a)
    before = await db(state_fingerprint)()
    await socket.send_to(text_data=protocol.encode(hello("gpu-b", devices=4)))
    error = json.loads(await socket.receive_from())
    assert error["code"] == "node_name_mismatch" and "gpu-a" in error["detail"]
    await settle(socket)
    assert await db(state_fingerprint)() == before
    await socket.disconnect()


def _wrong_credentials() -> dict[str, str]:
    _unused, unused_bootstrap = bootstrap_token_create(actor=None, ttl_s=600)
    _used, used_bootstrap = bootstrap_token_create(actor=None, ttl_s=600)
    _node, old = agent_register(token=used_bootstrap, node_name="gpu-a")
    _token, again = bootstrap_token_create(actor=None, ttl_s=600)
    agent_register(token=again, node_name="gpu-a")  # re-registered: the old credential is replaced
    api_token = ApiTokenFactory(user=UserFactory(username="someone"), scope="admin")
    return {
        "unused bootstrap token": unused_bootstrap,
        "used bootstrap token": used_bootstrap,
        "credential replaced by re-registering": old,
        "a user's API token": api_token.secret,
    }


async def test_credentials_of_the_wrong_kind_or_from_the_past_are_refused_and_audited():
    credentials = await db(_wrong_credentials)()
    before = await db(state_fingerprint)()
    failures_before = await db(AuditRecord.objects.filter(action="node.auth_failed").count)()
    for what, credential in credentials.items():
        socket = agent_socket(credential)
        connected, _ = await socket.connect()
        assert connected, what
        await expect_close(socket, CLOSE_UNAUTHORIZED)
    after = await db(state_fingerprint)()
    # Nothing changed but the audit trail, which recorded one failure per attempt.
    assert_unchanged(without_audit(before), without_audit(after), "refused agent credentials")
    failures = await db(AuditRecord.objects.filter(action="node.auth_failed").count)()
    assert failures - failures_before >= len(credentials)
    unexpected = await db(
        lambda: list(
            AuditRecord.objects.filter(pk__gt=max([0, *[row[0] for row in before["audit.AuditRecord"]]]))
            .exclude(action="node.auth_failed")
            .values_list("action", flat=True)
        )
    )()
    assert unexpected == []


def test_a_bootstrap_token_is_good_for_one_registration_only():
    _row, token = bootstrap_token_create(actor=None, ttl_s=600)
    client = APIClient()
    body = {"token": token, "node_name": "gpu-first", "hostname": "h", "agent_version": "1"}
    assert client.post("/api/v1/agents/register/", body, format="json").status_code == 201
    before = state_fingerprint()
    # Replayed, also for another node name: refused, and nothing but the audit trail changes.
    for name in ("gpu-first", "gpu-second"):
        response = client.post("/api/v1/agents/register/", {**body, "node_name": name}, format="json")
        assert response.status_code == 401 and response.json()["code"] == "token_used"
    assert_unchanged(without_audit(before), without_audit(state_fingerprint()), "replayed bootstrap token")


def test_a_node_credential_is_not_an_api_token():
    _node, credential = register_node("gpu-a")
    _row, bootstrap = bootstrap_token_create(actor=None, ttl_s=600)
    before = state_fingerprint()
    client = APIClient()
    for secret in (credential, bootstrap):
        for path in ("/api/v1/jobs/", "/api/v1/agents/nodes/", "/api/v1/me/"):
            response = client.get(path, HTTP_AUTHORIZATION=f"Bearer {secret}")
            assert response.status_code == 401, (path, response.content)
    assert_unchanged(without_audit(before), without_audit(state_fingerprint()), "node credential on the API")
