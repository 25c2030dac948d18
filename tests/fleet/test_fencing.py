"""The portal's side of fencing: it tells each agent when to fence (before the grace period moves its jobs), and
a job its agent stopped by fencing is requeued to resume from its checkpoint — never failed, never run twice."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from nodeagent import protocol
from scheduler.fleet.fencing import FENCE_MARGIN_S, check_fence_timing, lease_timing
from scheduler.fleet.models import AgentCommand, Node, NodeStatus
from scheduler.fleet.services.workload_reports import node_jobs_requeue, workload_status_report
from scheduler.models import Allocation, Job, JobEvent, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tests.fleet.conftest import agent_socket, register_node
from tests.patching import patch_request_cycle
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory, node_with_devices

WHOLE = {"name": "w", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["true"]}
GANG = {**WHOLE, "name": "g", "replicas": 2}


def test_the_shipped_settings_fence_at_40_s_so_that_stops_end_before_the_requeue_at_60_s(settings):
    settings.GPUPOOL_HEARTBEAT_INTERVAL_S, settings.GPUPOOL_LEASE_MISSES = 5, 3
    settings.GPUPOOL_NODE_LOST_GRACE_S, settings.GPUPOOL_FENCE_GRACE_S = 45, 10
    timing = lease_timing()
    assert (timing.lease_s, timing.requeue_after_s, timing.fence_after_s) == (15, 60, 40)
    assert timing.fence_after_s + timing.fence_grace_s + FENCE_MARGIN_S <= timing.requeue_after_s
    assert timing.fence_in_time and check_fence_timing(None) == []


def test_a_grace_period_too_short_to_fence_in_time_is_a_system_check_warning(settings, capsys):
    settings.GPUPOOL_NODE_LOST_GRACE_S = 5
    (warning,) = check_fence_timing(None)
    assert warning.id == "fleet.W001"
    assert "may run in two places" in warning.msg and "GPUPOOL_NODE_LOST_GRACE_S to 20 s" in warning.hint
    assert lease_timing().fence_after_s == lease_timing().lease_s  # still fences, at the lease
    call_command("check")
    assert "fleet.W001" in capsys.readouterr().err
    settings.GPUPOOL_FENCING = False
    assert lease_timing().fence_after_s == 0 and check_fence_timing(None) == []


@pytest.mark.django_db(transaction=True)
async def test_the_config_frame_tells_the_agent_when_to_fence(settings):
    from channels.db import database_sync_to_async

    settings.GPUPOOL_NODE_LOST_GRACE_S = 45
    _node, credential = await database_sync_to_async(register_node)("gpu-fence")
    socket = agent_socket(credential)
    connected, _ = await socket.connect()
    assert connected
    config = protocol.from_dict(json.loads(await socket.receive_from()))
    await socket.disconnect()
    timing = await database_sync_to_async(lease_timing)()
    assert isinstance(config, protocol.Config)
    assert (config.fence_after_s, config.fence_grace_s, config.requeue_after_s) == (
        timing.fence_after_s,
        timing.fence_grace_s,
        timing.requeue_after_s,
    )
    assert config.fence_after_s > 0


@pytest.fixture
def placed(db, settings, monkeypatch):
    """Places a spec on two one-card nodes and reports it running: (job, nodes it runs on)."""
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: None)
    nodes = [node_with_devices(1, name=f"fence-{index}") for index in range(3)]
    member = UserFactory(username="fence-member")
    MembershipFactory(user=member, tenant=TenantFactory(slug="team-a"), role="member")

    def place(spec: dict) -> tuple[Job, list[Node]]:
        job = job_submit(actor=member, spec=spec)
        assert job.pk in run_cycle().placed
        held = list(Allocation.objects.active().filter(job=job).order_by("replica"))
        for allocation in held:
            report(allocation.node, job, "running", replica=allocation.replica)
        assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
        return job, [allocation.node for allocation in held]

    del nodes
    return place


def report(node: Node, job: Job, state: str, *, replica: int = 0, reason: str = "") -> str:
    return workload_status_report(
        node=node,
        job_id=job.pk,
        replica=replica,
        state=state,
        exit_code=None if state != "stopped" else -15,
        last_checkpoint_at=timezone.now() - timedelta(seconds=5),
        reason=reason,
    )


def test_a_job_its_agent_stopped_by_fencing_is_requeued_to_resume_not_failed(placed):
    job, (node,) = placed(WHOLE)
    # The node was cut off past the fence time but less than the grace period: its agent reports on reconnect.
    assert report(node, job, "stopped", reason=protocol.FENCED) == "applied"
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    events = list(JobEvent.objects.filter(job=job).order_by("pk").values_list("to_state", "reason"))
    assert events[-2:] == [(JobState.NODE_LOST, "fenced"), (JobState.QUEUED, "fenced")]
    assert "resumes from its last checkpoint" in job.state_message
    assert not Allocation.objects.active().filter(job=job).exists()
    # A plain "stopped" still fails a job nobody asked to stop; the fence's reason is what makes the difference.
    other, (other_node,) = placed({**WHOLE, "name": "plain"})
    report(other_node, other, "stopped")
    assert Job.objects.get(pk=other.pk).state == JobState.FAILED


def test_a_fenced_gang_member_stops_the_others_and_requeues_the_gang(placed):
    job, nodes = placed(GANG)
    assert len({node.pk for node in nodes}) == 2
    report(nodes[0], job, "stopped", replica=0, reason=protocol.FENCED)
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    stop = AgentCommand.objects.get(node=nodes[1], job=job, command_type="workload.stop")
    assert stop.payload["replica"] == 1 and stop.payload["reason"] == "gang_member_fenced"


def test_a_fenced_report_after_the_grace_period_moved_the_job_changes_nothing(placed):
    job, (node,) = placed(WHOLE)
    node_jobs_requeue(node=node)
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.NOT_READY)
    assert run_cycle().placed == [job.pk]
    new_node = Allocation.objects.active().get(job=job).node
    report(new_node, job, "running")

    assert report(node, job, "stopped", reason=protocol.FENCED) == "not_allocated"
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert list(Allocation.objects.active().filter(job=job).values_list("node", flat=True)) == [new_node.pk]
    assert JobEvent.objects.filter(job=job, reason="fenced").count() == 0


@pytest.mark.django_db(transaction=True)
async def test_the_portal_answers_the_heartbeats_of_agents_that_ask_and_only_theirs():
    import dataclasses

    from channels.db import database_sync_to_async

    from tests.fleet.conftest import hello

    answers = {}
    for asks in (True, False):
        name = f"gpu-acks-{asks}".lower()
        _node, credential = await database_sync_to_async(register_node)(name)
        socket = agent_socket(credential)
        assert (await socket.connect())[0]
        config = json.loads(await socket.receive_from())
        assert config["heartbeat_acks"] is True  # this portal answers heartbeats (when asked)
        greeting = dataclasses.replace(hello(name, prefix=f"GPU-{name}"), heartbeat_acks=asks)
        await socket.send_to(text_data=protocol.encode(greeting))
        await socket.send_to(text_data=protocol.encode(protocol.Heartbeat(seq=7)))
        frames = []
        await socket.send_to(text_data='{"v": 1, "type": "settle", "id": "settle"}')
        while not frames or frames[-1].get("ref_id") != "settle":
            frames.append(json.loads(await socket.receive_from(timeout=10)))
        answers[asks] = [frame for frame in frames if frame["type"] == "heartbeat.ack"]
        await socket.disconnect()
    assert [frame["seq"] for frame in answers[True]] == [7]
    assert answers[False] == []
