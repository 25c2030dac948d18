"""No split brain: an agent cut off from the portal (its network link cut by a proxy; the agent process keeps
running and sees the portal unreachable) for longer than the grace period stops its job itself — SIGTERM, the
job checkpoints and exits — before the portal runs the job on another node, so at no moment does the job run in
two places. The new run resumes from the checkpoint; when the link comes back the agent's late reports change
nothing.

Settings: heartbeat 1 s, lease 5 s, requeue grace 15 s, fence grace 3 s: the portal tells the agent to fence
after 7 s without its answer (5 + 15 - 3 - a 10 s margin), and requeues 20 s after the last heartbeat.
"""

from __future__ import annotations

import time

import pytest

from nodeagent import protocol
from scheduler.fleet.models import AgentReport, Node, NodeStatus
from scheduler.models import Job, JobEvent, JobState
from tests.resilience.cluster import wait_until, workload_processes
from tests.resilience.invariants import check_invariants
from tests.resilience.scenarios import checkpointed_steps, node_of

pytestmark = [pytest.mark.services, pytest.mark.slow]

FENCE_SETTINGS = {"GPUPOOL_NODE_LOST_GRACE_S": "15", "GPUPOOL_FENCE_GRACE_S": "3"}


def test_an_agent_cut_off_past_the_grace_period_stops_its_job_before_the_job_runs_elsewhere(make_cluster):
    cluster = make_cluster(settings=FENCE_SETTINGS).start(agents=2, via_proxy=True)
    job_id = cluster.submit("fenced", steps=60, step_s=0.5)
    wait_until(
        lambda: (
            Job.objects.get(pk=job_id).state == JobState.RUNNING
            and Job.objects.get(pk=job_id).last_checkpoint_at is not None
            and checkpointed_steps(cluster, "fenced") >= 3
        ),
        timeout_s=60,
        what=f"job {job_id} running with a checkpoint the portal knows of",
        describe=cluster.describe,
    )
    name = node_of(job_id)
    agent = cluster.agents[name]
    cut_at = time.time()
    agent.proxy.cut()

    # Sample the processes until the job runs on the other node: never two copies at once.
    copies: list[tuple[float, int]] = []  # (when, how many process groups run the job)
    deadline = cut_at + 60
    while True:
        groups = {p.pgid for p in workload_processes(cluster.run_id) if p.job_id == job_id}
        copies.append((time.time(), len(groups)))
        assert len(groups) <= 1, f"job {job_id} runs twice {time.time() - cut_at:.1f} s after the cut: {groups}"
        if len(cluster.starts_of(job_id)) == 2:
            break
        assert time.time() < deadline, cluster.describe()
        time.sleep(0.1)
    assert agent.proc.alive(), "the cut-off agent itself must keep running"
    assert node_of(job_id) not in (None, name)

    # The cut-off copy got the checkpoint signal and was gone before the second run started; the second run
    # resumed from the step the first one had checkpointed.
    first, term, second = cluster.marks_of(job_id)
    assert (first["event"], term["event"], second["event"]) == ("start", "term", "start")
    assert term["pid"] == first["pid"] and term["at"] < second["at"]
    assert second["resumed_from"] == term["checkpointed"] >= 3, (term, second)
    gone_at = next(at for at, count in copies if count == 0)
    fenced_after_s = gone_at - cut_at
    assert 5 <= fenced_after_s < 20, fenced_after_s  # after the fence time (7 s less a heartbeat), before requeue
    events = list(JobEvent.objects.filter(job_id=job_id).order_by("pk").values_list("to_state", "reason"))
    assert (JobState.NODE_LOST, "node_lost") in events, events  # the portal's requeue, after the grace period

    # The link comes back: the agent reconnects and its late report of the fenced stop changes nothing.
    agent.proxy.restore()
    wait_until(lambda: Node.objects.get(name=name).status == NodeStatus.READY, timeout_s=45, what=f"{name} back")
    fenced_report = wait_until(
        lambda: AgentReport.objects.filter(node__name=name, job_id=job_id, state="stopped").first(),
        timeout_s=30,
        what="the fenced stop's report",
        describe=cluster.describe,
    )
    assert fenced_report.outcome == "not_allocated"
    (sent,) = [
        f.data for f in agent.proxy.frames_of("workload.status") if f.data["report_id"] == fenced_report.report_id
    ]
    assert (sent["state"], sent["reason"]) == ("stopped", protocol.FENCED)
    assert Job.objects.get(pk=job_id).state == JobState.RUNNING
    check_invariants(cluster)
    wait_until(
        lambda: Job.objects.get(pk=job_id).state == JobState.SUCCEEDED,
        timeout_s=60,
        what=f"job {job_id} to finish",
        describe=cluster.describe,
    )
    assert [mark["event"] for mark in cluster.marks_of(job_id)] == ["start", "term", "start", "done"]
    assert not JobEvent.objects.filter(job_id=job_id, to_state=JobState.FAILED).exists()
    check_invariants(cluster)
    print(
        f"cut at 0 s: copy stopped by its agent at {fenced_after_s:.1f} s, job running elsewhere at "
        f"{copies[-1][0] - cut_at:.1f} s (resumed at step {second['resumed_from']}); {len(copies)} samples, "
        "never two copies"
    )
