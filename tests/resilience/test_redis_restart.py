"""Redis (Celery broker and results, Channels layer, cache) is restarted: a private ``redis-server`` that this
test's processes use, never the shared one. It keeps nothing (``--save ""``): queued tasks, channel groups
and cached values are gone after the restart, as after a crash of an in-memory Redis.

Settings: heartbeat 1 s, lease 5 s, requeue grace 24 s.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from scheduler.fleet.models import AgentCommand, Node
from scheduler.models import Job, JobEvent, JobState
from tests.resilience.cluster import wait_until
from tests.resilience.invariants import check_invariants

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_restarting_redis_loses_no_job_and_runs_none_twice(make_cluster, private_redis):
    cluster = make_cluster(redis=private_redis.url).start(agents=2)
    before = cluster.submit("before", steps=24, step_s=0.5)
    wait_until(
        lambda: Job.objects.get(pk=before).state == JobState.RUNNING,
        timeout_s=60,
        what="the first job running",
        describe=cluster.describe,
    )

    private_redis.stop()
    # A job submitted while Redis is down is still taken: it is in the database, and a cycle places it later.
    status, during = cluster.api("/api/v1/jobs/", cluster.job_spec("during", steps=4, step_s=0.5))
    assert status == 201, (status, during)
    private_redis.start()
    restarted_at = timezone.now()
    after = cluster.submit("after", steps=4, step_s=0.5)
    # Every agent is heard from again (the portal closed their sockets when Redis went; they reconnect).
    wait_until(
        lambda: not Node.objects.filter(last_heartbeat_at__lt=restarted_at).exists(),
        timeout_s=30,
        what="every node's heartbeat after the restart",
        describe=cluster.describe,
    )

    jobs = [before, during["id"], after]
    wait_until(
        lambda: Job.objects.filter(pk__in=jobs, state=JobState.SUCCEEDED).count() == len(jobs),
        timeout_s=90,
        what="every job to finish",
        describe=cluster.describe,
    )
    for job_id in jobs:
        assert [mark["event"] for mark in cluster.marks_of(job_id)] == ["start", "done"], job_id
        assert AgentCommand.objects.filter(job_id=job_id, command_type="workload.start").count() == 1
    assert not JobEvent.objects.filter(to_state=JobState.NODE_LOST).exists()
    # The worker had tasks in hand when Redis went away (a countdown cycle, the periodic ones): before the fix
    # in portal/celery.py that killed it, and nothing was scheduled any more.
    assert all(worker.alive() for worker in cluster.workers), cluster.workers[0].log_tail(40)
    check_invariants(cluster)
