"""Arrays as one record under concurrent load on PostgreSQL: clients submit arrays, cancel some of their indices or
all of them, and ask for tasks by index, while scheduling cycles make jobs of the tasks they place and agents finish
them — no deadlock, no server error, no task made a job twice or lost, every task ends."""

from __future__ import annotations

import functools
import random
import time
from collections import Counter

import pytest
from django.test import Client

from scheduler.models import Allocation, Job, JobArray, JobState
from tests.factories import bearer
from tests.patching import patch_request_cycle
from tests.scheduler.concurrency import FINAL, Race, deadlocks, member_tokens
from tests.scheduler.factories import FlavorFactory, TenantFactory, node_with_devices

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CLIENTS = 8
OPERATIONS_PER_CLIENT = 25  # 200 operations


def _spec(slug: str, n: int, count: int) -> dict:
    return {
        "name": f"sweep-{n}",
        "tenant": slug,
        "resources": {"flavors": ["sim-80g"], "millis": 100, "memory_mib": 1024},
        "command": ["true"],
        "array": {"count": count},
    }


def test_concurrent_array_submits_cancels_and_task_reads_with_cycles_lose_no_task_and_make_none_twice(
    postgres, monkeypatch, settings, tmp_path
):
    settings.GPUPOOL_AUDIT_WITNESS_PATH = str(tmp_path / "witness.jsonl")
    settings.GPUPOOL_ARRAY_WINDOW = 8  # small windows: many top-ups race the clients
    patch_request_cycle(monkeypatch, lambda: None)  # cycles run in their own thread here
    FlavorFactory()
    tenants = [TenantFactory(slug="team-a"), TenantFactory(slug="team-b")]
    tokens = member_tokens(CLIENTS, tenants)
    node_ids = [node_with_devices(2, name=f"busy-{n}").pk for n in range(2)]
    deadlocks_before = deadlocks()

    statuses: list[tuple[str, int]] = []
    race = Race()

    def client(index: int) -> None:
        token, slug = tokens[index]
        http = Client(raise_request_exception=False)
        rng = random.Random(index)
        mine: list[tuple[str, int]] = []
        for n in range(OPERATIONS_PER_CLIENT):
            roll = rng.random()
            if not mine or roll < 0.4:
                count = rng.randint(2, 40)
                answer = http.post(
                    "/api/v1/jobs/", _spec(slug, n, count), content_type="application/json", headers=bearer(token)
                )
                statuses.append(("submit", answer.status_code))
                if answer.status_code == 201:
                    mine.append((answer.json()["array_id"], count))
                continue
            array_id, count = rng.choice(mine)
            if roll < 0.65:
                start = rng.randrange(count)
                indices = f"{start}-{min(count - 1, start + rng.randint(0, 5))}"
                answer = http.post(
                    f"/api/v1/jobs/arrays/{array_id}/cancel/",
                    {"indices": indices},
                    content_type="application/json",
                    headers=bearer(token),
                )
                statuses.append(("cancel_indices", answer.status_code))
            elif roll < 0.9:
                task = f"/api/v1/jobs/arrays/{array_id}/tasks/{rng.randrange(count)}/"
                answer = http.get(task, headers=bearer(token))
                statuses.append(("task", answer.status_code))
            else:
                cancel = f"/api/v1/jobs/arrays/{array_id}/cancel/"
                answer = http.post(cancel, {}, content_type="application/json", headers=bearer(token))
                statuses.append(("cancel_all", answer.status_code))

    race.run(
        [functools.partial(client, index) for index in range(CLIENTS)],
        [race.agent(pk, report_running=False) for pk in node_ids] + [race.cycles(0.01)],
        settled=lambda: (
            not Job.objects.exclude(state__in=FINAL).exists() and not JobArray.objects.filter(waiting__gt=0).exists()
        ),
        timeout_s=240,
    )

    failures = race.failures
    assert not failures, failures
    assert not [entry for entry in statuses if entry[1] >= 500], statuses
    assert len(statuses) == CLIENTS * OPERATIONS_PER_CLIENT
    kinds = Counter(kind for kind, _ in statuses)
    assert min(kinds.values()) > 5, kinds  # every kind of operation raced the others
    assert {code for kind, code in statuses if kind == "submit"} == {201}
    assert {code for kind, code in statuses if kind == "task"} <= {200, 404}  # 404: cancelled before it started
    # Every task of every array ended, as a job or as cancelled before it was one, and none is a job twice.
    for array in JobArray.objects.all():
        rows = list(Job.objects.filter(array_id=array.array_id).values_list("array_index", "state"))
        indices = [index for index, _ in rows]
        assert len(indices) == len(set(indices)), array.array_id
        assert array.waiting == 0 and array.unmaterialized == []
        assert len(rows) + array.cancelled_unmaterialized == array.count, (array.array_id, len(rows), array.count)
        assert {state for _, state in rows} <= FINAL
    assert Job.objects.filter(state=JobState.SUCCEEDED).exists()
    assert not Allocation.objects.active().exists()
    time.sleep(1.1)  # PostgreSQL flushes a backend's statistics at most once a second
    assert deadlocks() == deadlocks_before
