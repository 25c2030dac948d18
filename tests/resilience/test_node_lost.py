"""A node disappears — its agent and its workloads SIGKILLed, no goodbye — and its job resumes elsewhere from
its checkpoint.

Settings: heartbeat 1 s, lease 5 missed heartbeats (5 s), lease check every 1 s, requeue grace 3 s (the
defaults are 5 s, 3 x 5 = 15 s, 5 s and 120 s: the same sequence, faster).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from scheduler.models import Allocation, Job, JobEvent, JobState, Node, NodeStatus
from tests.resilience.cluster import Cluster, wait_until
from tests.resilience.invariants import check_invariants

pytestmark = [pytest.mark.services, pytest.mark.slow]

NODE_LOST_SETTINGS = {"GPUPOOL_NODE_LOST_GRACE_S": "3"}


def checkpointed_steps(cluster: Cluster, name: str) -> int:
    try:
        return int((cluster.storage / name / "step").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def node_of(job_id: int) -> str | None:
    names = set(Allocation.objects.active().filter(job_id=job_id).values_list("node__name", flat=True))
    return names.pop() if len(names) == 1 else None


def lose_node_and_recover(cluster: Cluster, *, name: str, steps: int = 40, step_s: float = 0.25) -> dict:
    """Run a checkpointing job, kill its node once the portal knows of a checkpoint, and wait until the job
    runs again on another node. Returns the timings (seconds after the kill) and what the runs saw."""
    job_id = cluster.submit(name, steps=steps, step_s=step_s)
    wait_until(
        lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING,
        timeout_s=60,
        what=f"job {job_id} running",
        describe=cluster.describe,
    )
    first_node = node_of(job_id)
    assert first_node is not None
    # The portal must hold a checkpoint pointer before the node dies: that is what the requeue carries.
    wait_until(
        lambda: Job.objects.get(pk=job_id).last_checkpoint_at is not None and checkpointed_steps(cluster, name) >= 3,
        timeout_s=30,
        what=f"job {job_id} to report a checkpoint",
        describe=cluster.describe,
    )
    killed_at = timezone.now()
    killed = cluster.kill_node(cluster.agents[first_node])
    steps_at_kill = checkpointed_steps(cluster, name)
    assert killed, "the node ran no workload to kill"

    wait_until(
        lambda: Node.objects.get(name=first_node).status == NodeStatus.NOT_READY,
        timeout_s=30,
        what=f"{first_node} not_ready",
        describe=cluster.describe,
    )
    not_ready_at = timezone.now()
    wait_until(
        lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING and node_of(job_id) not in (None, first_node),
        timeout_s=60,
        what=f"job {job_id} running again on another node",
        describe=cluster.describe,
    )
    events = list(JobEvent.objects.filter(job_id=job_id, created_at__gt=killed_at).order_by("pk"))
    moments = {}
    for event in events:
        moments.setdefault(event.to_state, event.created_at)
    return {
        "job_id": job_id,
        "first_node": first_node,
        "second_node": node_of(job_id),
        "steps_at_kill": steps_at_kill,
        "events": events,
        "not_ready_s": (not_ready_at - killed_at).total_seconds(),
        "requeued_s": (moments[JobState.QUEUED] - killed_at).total_seconds(),
        "placed_s": (moments[JobState.ADMITTED] - killed_at).total_seconds(),
        "running_s": (moments[JobState.RUNNING] - killed_at).total_seconds(),
    }


def test_a_lost_nodes_job_is_requeued_and_resumes_from_its_checkpoint_on_another_node(make_cluster):
    cluster = make_cluster(settings=NODE_LOST_SETTINGS).start(agents=2)
    outcome = lose_node_and_recover(cluster, name="resume")
    job_id = outcome["job_id"]
    print(
        f"node lost → not_ready {outcome['not_ready_s']:.1f} s, requeued {outcome['requeued_s']:.1f} s, "
        f"placed {outcome['placed_s']:.1f} s, running again {outcome['running_s']:.1f} s"
    )

    transitions = [(e.from_state, e.to_state, e.reason) for e in outcome["events"]]
    assert transitions[:2] == [
        (JobState.RUNNING, JobState.NODE_LOST, "node_lost"),
        (JobState.NODE_LOST, JobState.QUEUED, "node_lost"),
    ], transitions
    assert "resumes from its last checkpoint" in outcome["events"][1].message
    # Nothing was requeued early: the lease (5 s, less the up to 2 s a recorded heartbeat may lag) and the
    # grace period (3 s) come first.
    assert outcome["requeued_s"] >= 5 - 2 + 3, outcome

    starts = cluster.starts_of(job_id)
    assert len(starts) == 2, starts
    first, second = starts
    assert first["resumed_from"] == 0 and first["last_checkpoint_at"] is None
    # The second run found the first run's checkpoint on the shared storage and was told when it was taken.
    assert second["resumed_from"] >= outcome["steps_at_kill"] >= 3, (second, outcome["steps_at_kill"])
    assert second["last_checkpoint_at"], second
    assert Path(first["devices"]) != Path(second["devices"])

    wait_until(
        lambda: Job.objects.get(pk=job_id).state == JobState.SUCCEEDED,
        timeout_s=60,
        what=f"job {job_id} to finish",
        describe=cluster.describe,
    )
    assert [mark["event"] for mark in cluster.marks_of(job_id)] == ["start", "start", "done"]
    # The lost node's allocation ended when the job was requeued; only the second node's was ever active since.
    lost_node = Node.objects.get(name=outcome["first_node"])
    assert not Allocation.objects.active().filter(node=lost_node).exists()
    check_invariants(cluster)
