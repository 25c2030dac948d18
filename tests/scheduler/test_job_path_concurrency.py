"""The whole job path under concurrent load on PostgreSQL: submits and cancels from many API clients, agents'
reports and scheduling cycles, all at once — no deadlock, no server error, every report applied, every job ends.

This is the regression test for the deadlocks found under ordinary load (a job row locked with its tenant row
FOR UPDATE, then a wait for the one global audit lock, while a submit holding that lock needed FOR KEY SHARE on
the same tenant row at COMMIT). See docs/locking.md for the lock order that rules it out.
"""

from __future__ import annotations

import functools
import random
import time

import pytest
from django.test import Client

from audit.services import checkpoint_all
from audit.trail_verifier import verify_trail
from scheduler.models import Allocation, Job, JobEvent, JobState
from tests.factories import bearer
from tests.patching import patch_request_cycle
from tests.scheduler.concurrency import FINAL, Race, deadlocks, member_tokens
from tests.scheduler.factories import FlavorFactory, TenantFactory, node_with_devices

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CLIENTS = 8
SUBMITS_PER_CLIENT = 25  # 200 submits


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
    tokens = member_tokens(CLIENTS, tenants)
    node_ids = [node_with_devices(4, name=f"busy-{n}").pk for n in range(2)]
    deadlocks_before = deadlocks()

    statuses: list[tuple[str, int]] = []
    reports: list[tuple[int, str]] = []
    race = Race()

    def client(index: int) -> None:
        token, slug = tokens[index]
        http = Client(raise_request_exception=False)
        rng = random.Random(index)
        mine: list[int] = []
        for n in range(SUBMITS_PER_CLIENT):
            answer = http.post("/api/v1/jobs/", _spec(slug, n), content_type="application/json", headers=bearer(token))
            statuses.append(("submit", answer.status_code))
            if answer.status_code == 201:
                mine.append(answer.json()["id"])
            if mine and rng.random() < 0.2:
                victim = mine.pop(rng.randrange(len(mine)))
                answer = http.post(
                    f"/api/v1/jobs/{victim}/cancel/", {}, content_type="application/json", headers=bearer(token)
                )
                statuses.append(("cancel", answer.status_code))

    race.run(
        [functools.partial(client, index) for index in range(CLIENTS)],
        [race.agent(pk, report_running=True, reports=reports) for pk in node_ids] + [race.cycles(0.02)],
        settled=lambda: not Job.objects.exclude(state__in=FINAL).exists(),
        timeout_s=180,
    )

    failures = race.failures
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
    assert deadlocks() == deadlocks_before
    checkpoint_all()  # what beat does every few seconds: the heads signed into this test's witness file
    report = verify_trail(record_result=False)
    assert report.ok, report.findings
