"""End to end through the real agent socket: a job is placed, its ``workload.start`` reaches the agent after
commit, and the agent's acks and status reports drive the job to ``succeeded``."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async

from catalog.models import ResourceFlavor
from nodeagent import protocol
from scheduler.fleet.models import AgentCommand
from scheduler.models import Allocation, Job, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tests.fleet.conftest import connect_agent, register_node, settle
from tests.patching import patch_imported, patch_request_cycle
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)
db = database_sync_to_async


def member_of_team_a():
    user = UserFactory(username="agent-flow")
    MembershipFactory(user=user, tenant=TenantFactory(slug="team-a"), role="member")
    return user


async def test_a_placed_job_reaches_the_agent_and_its_reports_finish_it(monkeypatch):
    patch_request_cycle(monkeypatch, lambda: None)
    patch_imported(monkeypatch, "scheduler.fleet.services.notify.cycle_request_after_commit", lambda: None)
    await db(ResourceFlavor.objects.create)(
        name="nvidia-h100-80g", vendor="nvidia", model="NVIDIA H100 80GB HBM3", memory_mib=81559
    )
    _node, credential = await db(register_node)("gpu-flow")
    socket = await connect_agent(credential, "gpu-flow", devices=2)
    member = await db(member_of_team_a)()
    spec = {
        "name": "e2e",
        "tenant": "team-a",
        "resources": {"flavors": ["nvidia-h100-80g"], "millis": 300, "memory_mib": 10000},
        "command": ["python", "serve.py"],
        "env": {"MODE": "test"},
    }
    job = await db(job_submit)(actor=member, spec=spec)
    result = await db(run_cycle)()
    assert result.placed == [job.pk]

    frame = json.loads(await socket.receive_from(timeout=10))
    assert frame["type"] == "workload.start" and frame["job_id"] == job.pk and frame["replica"] == 0
    assert frame["command"] == ["python", "serve.py"] and frame["env"]["MODE"] == "test"
    [device] = frame["devices"]
    assert (device["millis"], device["memory_mib"]) == (300, 10000)
    assert device["uuid"].startswith("GPU-gpu-flow-")

    await socket.send_to(text_data=protocol.encode(protocol.Ack(command_id=frame["command_id"])))
    running = protocol.WorkloadStatus(job_id=job.pk, replica=0, state="running", exit_code=None)
    await socket.send_to(text_data=protocol.encode(running))
    await settle(socket)
    assert (await db(Job.objects.get)(pk=job.pk)).state == JobState.RUNNING
    command = await db(AgentCommand.objects.get)(pk=frame["command_id"])
    assert command.sent_at and command.acked_at and command.ack_ok is True

    done = protocol.WorkloadStatus(job_id=job.pk, replica=0, state="succeeded", exit_code=0)
    await socket.send_to(text_data=protocol.encode(done))
    await settle(socket)
    await socket.disconnect()
    finished = await db(Job.objects.get)(pk=job.pk)
    assert (finished.state, finished.exit_code) == (JobState.SUCCEEDED, 0)
    assert not await db(Allocation.objects.active().filter(job_id=job.pk).exists)()
