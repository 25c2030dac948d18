"""The product fixes the fault tests led to, each pinned by a fast test (no services, no processes)."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from nodeagent import protocol
from scheduler.fleet.models import AgentCommand, Node, NodeStatus
from scheduler.fleet.outbox import START_WITHDRAWN
from scheduler.fleet.services.agent_commands import command_ack, commands_pending
from scheduler.fleet.services.nodes import node_drain
from scheduler.fleet.services.workload_reports import node_jobs_requeue, workload_status_report
from scheduler.models import Allocation, Job, JobState
from scheduler.services.cycle import request_cycle, run_cycle
from scheduler.services.jobs import job_submit
from tests.nodeagent.test_agent_loop import FakeClock, FakeConnector, _agent
from tests.patching import patch_request_cycle
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory, node_with_devices

WHOLE = {"name": "w", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["true"]}


async def test_a_shorter_heartbeat_interval_from_the_portal_applies_at_once(tmp_path):
    """The agent's first heartbeat scheduled the next one 10 s away (its own default); the portal's config asks
    for 1 s. Before the fix nothing was sent for 10 s, and a 5 s lease declared the new node lost."""
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock, heartbeat_interval_s=10.0)
    await agent.tick()
    connection = connector.connections[0]
    connection.inbox.append(protocol.encode(protocol.Config(telemetry_interval_s=1.0, heartbeat_interval_s=1.0)))
    for _ in range(4):
        clock.now += 1.0
        await agent.tick()
    assert connection.types().count("heartbeat") == 4  # at 0, then at 2, 3 and 4 s


@pytest.fixture
def running_job(db, settings, monkeypatch):
    """A job running on one of two one-card nodes: (job, its node, the other node)."""
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: None)
    first, second = node_with_devices(1, name="node-a"), node_with_devices(1, name="node-b")
    member = UserFactory(username="rules-member")
    MembershipFactory(user=member, tenant=TenantFactory(slug="team-a"), role="member")
    job = job_submit(actor=member, spec=WHOLE)
    assert run_cycle().placed == [job.pk]
    node = Allocation.objects.active().get(job=job).node
    report(node, job, "running")
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    return job, node, second if node == first else first


def report(node: Node, job: Job, state: str) -> None:
    workload_status_report(node=node, job_id=job.pk, replica=0, state=state, exit_code=None, last_checkpoint_at=None)


def stops(node: Node, job: Job):
    return AgentCommand.objects.filter(node=node, job=job, command_type="workload.stop")


def test_requeueing_a_lost_nodes_jobs_also_tells_that_node_to_stop_them(running_job):
    job, node, _other = running_job
    assert node_jobs_requeue(node=node) == 1
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    # Delivered when the node is heard from again: a node declared lost may only have been cut off.
    assert stops(node, job).count() == 1


def test_reports_of_a_requeued_jobs_stale_copy_never_move_its_new_run(running_job):
    job, node, other = running_job
    node_jobs_requeue(node=node)
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.NOT_READY)
    assert run_cycle().placed == [job.pk]
    report(other, job, "running")

    # The old node comes back and says its copy still runs: told to stop (once, while a stop is pending).
    report(node, job, "running")
    report(node, job, "running")
    assert stops(node, job).filter(acked_at__isnull=True).count() == 1
    command_ack(node_id=node.pk, command_id=stops(node, job).get().pk)
    report(node, job, "running")
    assert stops(node, job).count() == 2
    # Whatever the old copy reports next, the job keeps running where it runs now. (Before the fix a "lost"
    # requeued the job again and a "stopped" or "failed" failed it.)
    for state in ("lost", "stopped", "failed", "succeeded"):
        report(node, job, state)
        job.refresh_from_db()
        assert job.state == JobState.RUNNING, state
        assert list(Allocation.objects.active().filter(job=job).values_list("node", flat=True)) == [other.pk]


def test_asking_for_a_cycle_while_redis_is_down_does_not_fail_the_caller(monkeypatch):
    """``request_cycle`` runs after commit: raising there answered a committed submit with a 500."""

    def unreachable(*args, **kwargs):
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr("scheduler.services.cycle.cache.add", unreachable)
    assert request_cycle() is False


def test_a_start_the_lost_node_never_acknowledged_is_withdrawn_and_not_delivered_when_it_returns(running_job):
    """The chaos run found it: a job placed on a node just as its link was cut was requeued and ran elsewhere;
    when the node came back it got every unacknowledged command — the old start first — and ran a second copy."""
    job, node, other = running_job
    start = AgentCommand.objects.get(node=node, job=job, command_type="workload.start")
    assert start.acked_at is None  # the agent never acknowledged it (the link was cut)
    node_jobs_requeue(node=node)
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.NOT_READY)
    assert run_cycle().placed == [job.pk]

    # The node reconnects: only the stop goes out, never the old start.
    pending = [payload["type"] for _pk, payload in commands_pending(node_id=node.pk)]
    assert pending == ["workload.stop"]
    start.refresh_from_db()
    assert (start.ack_ok, start.error) == (False, START_WITHDRAWN)
    # The new run's start, on the other node, is untouched.
    new_start = AgentCommand.objects.get(node=other, job=job, command_type="workload.start")
    assert new_start.acked_at is None
    assert [payload["job_id"] for _pk, payload in commands_pending(node_id=other.pk)] == [job.pk]


def test_a_drained_jobs_unacknowledged_start_still_goes_out_so_the_agent_can_confirm_the_stop(running_job):
    """A drain (like a preemption) waits for the agent's ``stopped``: the allocations stay, the start is not
    withdrawn, and the agent gets the start and then the stop."""
    job, node, _other = running_job
    node_drain(node=node, actor=None)
    assert Job.objects.get(pk=job.pk).state == JobState.PREEMPTING
    pending = [payload["type"] for _pk, payload in commands_pending(node_id=node.pk)]
    assert pending == ["workload.start", "workload.stop"]


def test_a_late_report_on_an_earlier_run_never_fails_the_run_placed_on_the_same_node_since(running_job):
    """The chaos run found it: a node came back after its job was requeued and the job was placed on it again;
    the first run's ``stopped`` (a repeated report) was taken for the new run's and failed the job."""
    job, node, other = running_job
    first_start = AgentCommand.objects.get(node=node, job=job, command_type="workload.start").pk
    node_jobs_requeue(node=node)
    Node.objects.filter(pk=other.pk).update(status=NodeStatus.CORDONED)
    assert run_cycle().placed == [job.pk]
    second_start = AgentCommand.objects.filter(node=node, job=job, command_type="workload.start").latest("pk").pk
    assert second_start > first_start

    def status(state: str, command_id: int) -> str:
        return workload_status_report(
            node=node,
            job_id=job.pk,
            replica=0,
            state=state,
            exit_code=-15,
            last_checkpoint_at=None,
            command_id=command_id,
        )

    assert status("stopped", first_start) == "stale_run"
    assert Job.objects.get(pk=job.pk).state == JobState.ADMITTED  # not failed
    # The old copy says it still runs: the requeue's stop is on its way; once that is acknowledged, another.
    assert status("running", first_start) == "stale_run"
    assert stops(node, job).filter(acked_at__isnull=True).count() == 1
    command_ack(node_id=node.pk, command_id=stops(node, job).get().pk)
    assert status("running", first_start) == "stale_run"
    assert stops(node, job).filter(payload__reason="superseded", acked_at__isnull=True).count() == 1
    assert status("running", second_start) == "applied"
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
