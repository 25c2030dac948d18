"""A small chaos run (``tests/resilience/chaos.py``; ``benchmarks/chaos.py`` is the big one): jobs of every shape
on three simulated nodes through a Celery worker kill, a Redis restart, a web server restart, an agent kill and
network cuts — one of them past the grace period, so the agent fences and the portal moves its jobs.

Settings: the harness's (heartbeat 1 s, lease 5 s, grace 24 s, fence after 16 s with a 3 s fence grace).
"""

from __future__ import annotations

import pytest

from scheduler.models import Job, JobState
from tests.resilience.chaos import FAULT_KINDS, ChaosPlan, run_chaos
from tests.resilience.invariants import check_invariants

pytestmark = [pytest.mark.services, pytest.mark.slow]

PLAN = ChaosPlan(
    jobs=48,
    window_s=50,
    faults={"worker_kill": 1, "redis_restart": 1, "web_restart": 1, "agent_kill": 1, "short_cut": 2, "long_cut": 1},
    seed=16,
    long_share=0.15,
    drain_timeout_s=150,
)


def test_jobs_of_every_shape_end_exactly_once_through_process_kills_restarts_and_network_cuts(
    make_cluster, private_redis
):
    cluster = make_cluster(redis=private_redis.url).start(agents=0)
    names = [f"chaos-{index}-{cluster.run_id[:6]}" for index in range(3)]
    for name in names:
        cluster.add_agent(name, cards=4, via_proxy=True)
    cluster.wait_nodes_ready(names)

    result = run_chaos(cluster, private_redis, PLAN)
    print("\n" + "\n".join(result.lines()))

    assert {fault.kind for _at, fault in result.faults} == set(FAULT_KINDS), result.faults
    assert result.samples >= PLAN.window_s / PLAN.sample_s / 2
    assert not result.violations, "\n".join(result.violations)
    assert result.max_copies <= 1 and result.max_card_millis <= 1000
    # Every job submitted is there once (idempotent retries), and each ended once: none lost, none twice.
    assert result.jobs == sum(result.submitted.values()) >= PLAN.jobs
    assert Job.objects.count() == result.jobs
    assert not result.lost and not result.ended_more_than_once
    assert result.finals == {JobState.SUCCEEDED: result.jobs}, result.finals
    assert result.open_allocations == 0
    assert result.deadlocks == 0 and result.deadlock_log_lines == 0
    assert result.audit_ok
    # The long cut (past the grace period) hit a node that had just started a long job: its agent fenced it, and
    # the portal requeued what the node held.
    assert result.fenced_stops >= 1 and result.requeues["node_lost"] >= 1, (result.fenced_stops, result.requeues)
    check_invariants(cluster)
