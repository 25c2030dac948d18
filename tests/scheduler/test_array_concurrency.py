"""Arrays as one record under concurrent load on PostgreSQL: clients submit arrays, cancel some of their indices or
all of them, and ask for tasks by index, while scheduling cycles make jobs of the tasks they place and agents finish
them — no deadlock, no server error, no task made a job twice or lost, every task ends."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
from django.db import connection
from django.test import Client

from scheduler.fleet.models import Node
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Allocation, Job, JobArray, JobState
from scheduler.services.cycle import run_cycle
from tests.factories import ApiTokenFactory, bearer
from tests.patching import patch_request_cycle
from tests.scheduler.factories import FlavorFactory, MembershipFactory, TenantFactory, UserFactory, node_with_devices
from tests.scheduler.test_job_path_concurrency import FINAL, _deadlocks

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
    tokens = []
    for index in range(CLIENTS):
        user = UserFactory(username=f"client-{index}")
        MembershipFactory(user=user, tenant=tenants[index % 2], role="member")
        tokens.append((ApiTokenFactory(user=user), tenants[index % 2].slug))
    node_ids = [node_with_devices(2, name=f"busy-{n}").pk for n in range(2)]
    deadlocks_before = _deadlocks()

    statuses: list[tuple[str, int]] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def client(index: int) -> None:
        token, slug = tokens[index]
        http = Client(raise_request_exception=False)
        rng = random.Random(index)
        mine: list[tuple[str, int]] = []
        try:
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
                    answer = http.get(
                        f"/api/v1/jobs/arrays/{array_id}/tasks/{rng.randrange(count)}/", headers=bearer(token)
                    )
                    statuses.append(("task", answer.status_code))
                else:
                    answer = http.post(
                        f"/api/v1/jobs/arrays/{array_id}/cancel/",
                        {},
                        content_type="application/json",
                        headers=bearer(token),
                    )
                    statuses.append(("cancel_all", answer.status_code))
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    def agent(node_pk: int) -> None:
        node = Node.objects.get(pk=node_pk)
        try:
            while not stop.is_set():
                held = set(
                    Allocation.objects.active().filter(node_id=node_pk).values_list("job_id", "replica").distinct()
                )
                for job_id, replica in sorted(held):
                    workload_status_report(
                        node=node,
                        job_id=job_id,
                        replica=replica,
                        state="succeeded",
                        exit_code=0,
                        last_checkpoint_at=None,
                    )
                time.sleep(0.01)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    def cycles() -> None:
        try:
            while not stop.is_set():
                run_cycle()
                time.sleep(0.01)
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
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not failures:
        if not Job.objects.exclude(state__in=FINAL).exists() and not JobArray.objects.filter(waiting__gt=0).exists():
            break
        time.sleep(0.2)
    stop.set()
    for thread in workers[CLIENTS:]:
        thread.join()

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
    assert _deadlocks() == deadlocks_before
