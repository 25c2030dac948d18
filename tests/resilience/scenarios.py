"""Fault scenarios shared by the tests and ``benchmarks/recovery.py``."""

from __future__ import annotations

from django.utils import timezone

from scheduler.fleet.models import Node, NodeStatus
from scheduler.models import Allocation, Job, JobEvent, JobState
from tests.resilience.cluster import Cluster, wait_until


def checkpointed_steps(cluster: Cluster, name: str) -> int:
    try:
        return int((cluster.storage / name / "step").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def node_of(job_id: int) -> str | None:
    names = set(Allocation.objects.active().filter(job_id=job_id).values_list("node__name", flat=True))
    return names.pop() if len(names) == 1 else None


def lose_node_and_recover(
    cluster: Cluster, *, name: str, steps: int = 40, step_s: float = 0.25, lease_s: float = 5, grace_s: float = 3
) -> dict:
    """Run a checkpointing job, kill its node once the portal knows of a checkpoint, and wait until the job
    runs again on another node (``lease_s`` and ``grace_s`` only size the waits). Returns the timings (seconds
    after the kill) and what the runs saw."""
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
        timeout_s=lease_s + 25,
        what=f"{first_node} not_ready",
        describe=cluster.describe,
    )
    not_ready_at = timezone.now()
    wait_until(
        lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING and node_of(job_id) not in (None, first_node),
        timeout_s=lease_s + grace_s + 55,
        what=f"job {job_id} running again on another node",
        describe=cluster.describe,
    )
    # The agent reports "running" as it starts the process; the run writes its start mark a moment later.
    wait_until(lambda: len(cluster.starts_of(job_id)) >= 2, timeout_s=30, what=f"job {job_id}'s second run to start")
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
