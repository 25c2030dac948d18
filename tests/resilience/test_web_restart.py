"""The web server (daphne: the API and every agent's WebSocket) is killed and started again.

Settings: heartbeat 1 s, lease 5 s, requeue grace 24 s (the defaults scaled by 1/5; the lease is 5 heartbeats
rather than 3 so that a recorded heartbeat lagging up to 2 s never reads as a lost node).
"""

from __future__ import annotations

import signal

import pytest

from scheduler.fleet.models import AgentCommand
from scheduler.models import Job, JobEvent, JobState
from tests.resilience.cluster import wait_until, workload_processes
from tests.resilience.invariants import check_invariants

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_killing_and_restarting_the_web_server_loses_no_job_and_runs_none_twice(make_cluster):
    cluster = make_cluster().start(agents=2)
    jobs = [cluster.submit(f"web-{index}", steps=24, step_s=0.5) for index in range(3)]
    wait_until(
        lambda: Job.objects.filter(pk__in=jobs, state=JobState.RUNNING).count() == len(jobs),
        timeout_s=60,
        what="three jobs running",
        describe=cluster.describe,
    )

    cluster.web.kill(signal.SIGKILL)
    # The agents and their workloads do not depend on the web server being up. (An agent reports "running" as it
    # starts the sandbox; the job's own process, which /proc shows with the job's env, may come a moment later.)
    wait_until(
        lambda: {p.job_id for p in workload_processes(cluster.run_id)} == set(jobs),
        timeout_s=10,
        what="the three jobs' processes while the web server is down",
    )
    cluster.start_web()
    cluster.wait_web()
    cluster.wait_nodes_ready(list(cluster.agents), timeout_s=60)
    later = cluster.submit("after-restart", steps=2, step_s=0.5)

    wait_until(
        lambda: Job.objects.filter(pk__in=[*jobs, later], state=JobState.SUCCEEDED).count() == len(jobs) + 1,
        timeout_s=90,
        what="every job to finish",
        describe=cluster.describe,
    )
    for job_id in [*jobs, later]:
        assert [mark["event"] for mark in cluster.marks_of(job_id)] == ["start", "done"], job_id
        assert AgentCommand.objects.filter(job_id=job_id, command_type="workload.start").count() == 1
    assert not JobEvent.objects.filter(to_state=JobState.NODE_LOST).exists()
    check_invariants(cluster)
