"""A node disappears — its agent and its workloads SIGKILLed, no goodbye — and its job resumes elsewhere from
its checkpoint.

Settings: heartbeat 1 s, lease 5 missed heartbeats (5 s), lease check every 1 s, requeue grace 3 s (the
defaults are 5 s, 3 x 5 = 15 s, 5 s and 45 s: the same sequence, faster).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.fleet.models import Node
from scheduler.models import Allocation, Job, JobState
from tests.resilience.cluster import wait_until
from tests.resilience.invariants import check_invariants
from tests.resilience.scenarios import lose_node_and_recover

pytestmark = [pytest.mark.services, pytest.mark.slow]

NODE_LOST_SETTINGS = {"GPUPOOL_NODE_LOST_GRACE_S": "3"}


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
