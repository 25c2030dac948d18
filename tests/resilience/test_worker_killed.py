"""A Celery worker is SIGKILLed in the middle of a scheduling cycle, while it holds the cycle lock.

To hit that moment deterministically the test holds the tenant's audit chain head (the row a transaction locks
last, just before its COMMIT, to link its audit records): the worker's cycle takes the cycle lock, writes the
job's allocations, state and event, and then waits for that row at its commit. The test sees that in
``pg_locks`` and ``pg_stat_activity`` (the cycle lock granted to the worker's backend, the backend waiting on a
row lock, the allocation table written), kills the worker there, and lets go.
"""

from __future__ import annotations

import signal

import psycopg
import pytest
from django.db import connection

from scheduler.fleet.models import AgentCommand
from scheduler.locks import CYCLE_LOCK_KEY
from scheduler.models import Allocation, Job, JobEvent, JobState
from tests.resilience.cluster import wait_until
from tests.resilience.invariants import check_invariants

pytestmark = [pytest.mark.services, pytest.mark.slow]

ADVISORY = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND classid = %s AND objid = %s AND objsubid = 1 AND granted = %s"
)


def _key(key: int) -> tuple[int, int]:
    return key >> 32, key & 0xFFFFFFFF


def backends(cursor, key: int, *, granted: bool) -> set[int]:
    cursor.execute(ADVISORY, [*_key(key), granted])
    return {row[0] for row in cursor.fetchall()}


def test_a_worker_killed_while_holding_the_cycle_lock_leaves_nothing_half_written(make_cluster):
    cluster = make_cluster()
    cluster.seed()
    cluster.start_web()
    cluster.start_beat()
    cluster.wait_web()
    for index in range(2):
        cluster.add_agent(f"node-{index}-{cluster.run_id[:6]}")
    cluster.wait_nodes_ready(list(cluster.agents))
    job_id = cluster.submit("survivor", steps=6, step_s=0.5)  # no worker yet: it waits in the queue

    settings = connection.settings_dict
    dsn = {"host": settings["HOST"] or "127.0.0.1", "port": settings["PORT"] or 5432, "dbname": settings["NAME"]}
    dsn["user"] = settings["USER"] or "postgres"
    if settings.get("PASSWORD"):
        dsn["password"] = settings["PASSWORD"]
    with psycopg.connect(**dsn, autocommit=True) as watcher, psycopg.connect(**dsn) as holder:
        look = watcher.cursor()
        stream = f"tenant:{Job.objects.get(pk=job_id).tenant_id}"
        # held until holder commits
        held = holder.execute("SELECT stream FROM audit_chainhead WHERE stream = %s FOR UPDATE", [stream]).fetchall()
        assert held, f"no chain head for {stream}"
        doomed = cluster.start_worker("doomed")

        def cycle_stuck_on_audit() -> int | None:
            look.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            waiting = {row[0] for row in look.fetchall()}
            stuck = backends(look, CYCLE_LOCK_KEY, granted=True) & waiting
            return next(iter(stuck), None)

        backend = wait_until(
            cycle_stuck_on_audit,
            timeout_s=60,
            what="the worker's cycle holding the cycle lock and waiting for the audit chain head",
            describe=cluster.describe,
        )
        look.execute(
            "SELECT relation::regclass::text FROM pg_locks WHERE pid = %s AND mode = 'RowExclusiveLock'", [backend]
        )
        written = {row[0] for row in look.fetchall()}
        assert {"scheduler_allocation", "scheduler_job", "scheduler_jobevent"} <= written, written

        doomed.kill(signal.SIGKILL)
        holder.commit()  # the dead worker's backend gets the lock, cannot answer its client and rolls back
        wait_until(
            lambda: not backends(look, CYCLE_LOCK_KEY, granted=True),
            timeout_s=30,
            what="the dead worker's cycle lock to be released",
        )

    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.QUEUED, job.state
    assert not Allocation.objects.filter(job=job).exists()
    assert not JobEvent.objects.filter(job=job, to_state=JobState.ADMITTED).exists()
    assert not AgentCommand.objects.filter(job=job).exists()
    check_invariants(cluster, settle_timeout_s=5)

    cluster.start_worker("next")
    wait_until(
        lambda: Job.objects.get(pk=job_id).state == JobState.SUCCEEDED,
        timeout_s=60,
        what=f"job {job_id} placed by the next worker and finished",
        describe=cluster.describe,
    )
    assert JobEvent.objects.filter(job_id=job_id, to_state=JobState.ADMITTED).count() == 1
    assert [mark["event"] for mark in cluster.marks_of(job_id)] == ["start", "done"]
    check_invariants(cluster)
