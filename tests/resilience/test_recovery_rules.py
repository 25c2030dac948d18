"""The product fixes the fault tests led to, each pinned by a fast test (no services, no processes)."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from nodeagent import protocol
from scheduler import services
from scheduler.fleet.services import command_ack
from scheduler.models import AgentCommand, Allocation, Job, JobState, Node, NodeStatus
from tests.nodeagent.test_agent_loop import FakeClock, FakeConnector, _agent
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
    monkeypatch.setattr("scheduler.services.request_cycle", lambda: None)
    first, second = node_with_devices(1, name="node-a"), node_with_devices(1, name="node-b")
    member = UserFactory(username="rules-member")
    MembershipFactory(user=member, tenant=TenantFactory(slug="team-a"), role="member")
    job = services.job_submit(actor=member, spec=WHOLE)
    assert services.run_cycle().placed == [job.pk]
    node = Allocation.objects.active().get(job=job).node
    report(node, job, "running")
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    return job, node, second if node == first else first


def report(node: Node, job: Job, state: str) -> None:
    services.workload_status_report(
        node=node, job_id=job.pk, replica=0, state=state, exit_code=None, last_checkpoint_at=None
    )


def stops(node: Node, job: Job):
    return AgentCommand.objects.filter(node=node, job=job, command_type="workload.stop")


def test_requeueing_a_lost_nodes_jobs_also_tells_that_node_to_stop_them(running_job):
    job, node, _other = running_job
    assert services.node_jobs_requeue(node=node) == 1
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    # Delivered when the node is heard from again: a node declared lost may only have been cut off.
    assert stops(node, job).count() == 1


def test_reports_of_a_requeued_jobs_stale_copy_never_move_its_new_run(running_job):
    job, node, other = running_job
    services.node_jobs_requeue(node=node)
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.NOT_READY)
    assert services.run_cycle().placed == [job.pk]
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

    monkeypatch.setattr("scheduler.services.cache.add", unreachable)
    assert services.request_cycle() is False
