"""The whole job path under concurrent load on PostgreSQL: submits and cancels from many API clients, agents'
reports and scheduling cycles, all at once — no deadlock, no server error, every report applied, every job ends.

This is the regression test for the deadlocks found under ordinary load (a job row locked with its tenant row
FOR UPDATE, then a wait for the one global audit lock, while a submit holding that lock needed FOR KEY SHARE on
the same tenant row at COMMIT). See docs/locking.md for the lock order that rules it out.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connection
from django.test import Client

from audit.services import checkpoint_all
from audit.trail_verifier import verify_trail
from scheduler.fleet.models import Node
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Allocation, Job, JobEvent, JobState
from scheduler.services.cycle import run_cycle
from tests.factories import ApiTokenFactory, bearer
from tests.patching import patch_request_cycle
from tests.scheduler.factories import FlavorFactory, MembershipFactory, TenantFactory, UserFactory, node_with_devices

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CLIENTS = 8
SUBMITS_PER_CLIENT = 25  # 200 submits
FINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}


def _deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _spec(slug: str, n: int) -> dict:
    return {
        "name": f"tiny-{n}",
        "tenant": slug,
        "resources": {"flavors": ["sim-80g"], "millis": 100, "memory_mib": 1024},
        "command": ["true"],
    }


def test_concurrent_submits_cancels_reports_and_cycles_never_deadlock_and_every_job_ends(
    postgres, monkeypatch, settings, tmp_path
):
    settings.GPUPOOL_AUDIT_WITNESS_PATH = str(tmp_path / "witness.jsonl")
    patch_request_cycle(monkeypatch, lambda: None)  # cycles run in their own thread here
    FlavorFactory()
    tenants = [TenantFactory(slug="team-a"), TenantFactory(slug="team-b")]
    tokens = []
    for index in range(CLIENTS):
        user = UserFactory(username=f"client-{index}")
        MembershipFactory(user=user, tenant=tenants[index % 2], role="member")
        tokens.append((ApiTokenFactory(user=user), tenants[index % 2].slug))
    nodes = [node_with_devices(4, name=f"busy-{n}") for n in range(2)]
    node_ids = [node.pk for node in nodes]
    deadlocks_before = _deadlocks()

    statuses: list[tuple[str, int]] = []
    failures: list[BaseException] = []
    reports: list[tuple[int, str]] = []
    clients_done = threading.Event()
    stop = threading.Event()

    def client(index: int) -> None:
        token, slug = tokens[index]
        http = Client(raise_request_exception=False)
        rng = random.Random(index)
        mine: list[int] = []
        try:
            for n in range(SUBMITS_PER_CLIENT):
                answer = http.post(
                    "/api/v1/jobs/", _spec(slug, n), content_type="application/json", headers=bearer(token)
                )
                statuses.append(("submit", answer.status_code))
                if answer.status_code == 201:
                    mine.append(answer.json()["id"])
                if mine and rng.random() < 0.2:
                    victim = mine.pop(rng.randrange(len(mine)))
                    answer = http.post(
                        f"/api/v1/jobs/{victim}/cancel/", {}, content_type="application/json", headers=bearer(token)
                    )
                    statuses.append(("cancel", answer.status_code))
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    def agent(node_pk: int) -> None:
        """Reports as an agent would: running once placed, succeeded a moment later (each at least once)."""
        node = Node.objects.get(pk=node_pk)
        running: set[tuple[int, int]] = set()
        try:
            while not stop.is_set():
                held = set(
                    Allocation.objects.active().filter(node_id=node_pk).values_list("job_id", "replica").distinct()
                )
                for job_id, replica in sorted(held - running):
                    workload_status_report(
                        node=node,
                        job_id=job_id,
                        replica=replica,
                        state="running",
                        exit_code=None,
                        last_checkpoint_at=None,
                    )
                    reports.append((job_id, "running"))
                    running.add((job_id, replica))
                for job_id, replica in sorted(running & held):
                    workload_status_report(
                        node=node,
                        job_id=job_id,
                        replica=replica,
                        state="succeeded",
                        exit_code=0,
                        last_checkpoint_at=None,
                    )
                    reports.append((job_id, "succeeded"))
                running &= held
                time.sleep(0.01)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    def cycles() -> None:
        try:
            while not stop.is_set():
                run_cycle()
                time.sleep(0.02)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    workers += [threading.Thread(target=agent, args=(pk,)) for pk in node_ids]
    workers.append(threading.Thread(target=cycles))
    for thread in workers:
        thread.start()
    for thread in workers[:CLIENTS]:
        thread.join()
    clients_done.set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not failures:
        if not Job.objects.exclude(state__in=FINAL).exists():
            break
        time.sleep(0.2)
    stop.set()
    for thread in workers[CLIENTS:]:
        thread.join()

    assert not failures, failures
    server_errors = [entry for entry in statuses if entry[1] >= 500]
    assert not server_errors, server_errors
    submits = [code for kind, code in statuses if kind == "submit"]
    assert len(submits) == CLIENTS * SUBMITS_PER_CLIENT and set(submits) == {201}
    assert {code for kind, code in statuses if kind == "cancel"} <= {200, 409}
    assert Job.objects.count() == CLIENTS * SUBMITS_PER_CLIENT
    unfinished = list(Job.objects.exclude(state__in=FINAL).values_list("pk", "state"))
    assert not unfinished, unfinished
    assert not Allocation.objects.active().exists()
    # Every succeeded report about a job that was not cancelled first was applied, exactly once.
    reported_done = {job_id for job_id, state in reports if state == "succeeded"}
    for job in Job.objects.filter(pk__in=reported_done):
        finals = JobEvent.objects.filter(job=job, to_state__in=FINAL).count()
        assert finals == 1, (job.pk, finals)
        assert job.state in (JobState.SUCCEEDED, JobState.CANCELLED), (job.pk, job.state)
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() > 0
    time.sleep(1.1)  # PostgreSQL flushes a backend's statistics at most once a second
    assert _deadlocks() == deadlocks_before
    checkpoint_all()  # what beat does every few seconds: the heads signed into this test's witness file
    report = verify_trail(record_result=False)
    assert report.ok, report.findings
