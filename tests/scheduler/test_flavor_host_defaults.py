"""Issue 18: a flavor may set host CPU and memory per card, which a job that states none gets at submit."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from audit.models import AuditRecord
from catalog.models import ResourceFlavor
from scheduler.models import Job
from tests.factories import client_for
from tests.scheduler.factories import FlavorFactory, SystemAdminFactory

SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 2}, "command": ["python"]}


@pytest.fixture
def api(member, node, no_cycle_requests):
    ResourceFlavor.objects.filter(name="sim-80g").update(cpu_millicores_per_card=8000, host_memory_mib_per_card=65536)
    return client_for(member)


def submit(api: APIClient, resources: dict, **extra) -> Job:
    response = api.post("/api/v1/jobs/", {**SPEC, "resources": resources, **extra}, format="json")
    assert response.status_code == 201, response.json()
    return Job.objects.get(pk=response.json()["id"])


def test_a_system_admin_sets_host_defaults_per_card_on_a_new_flavor_and_everyone_reads_them(api):
    payload = {
        "name": "ascend-910b",
        "vendor": "ascend",
        "model": "Ascend 910B",
        "memory_mib": 65536,
        "cpu_millicores_per_card": 24000,
        "host_memory_mib_per_card": 196608,
    }
    created = client_for(SystemAdminFactory()).post("/api/v1/flavors/", payload, format="json")
    assert created.status_code == 201, created.json()

    row = next(f for f in api.get("/api/v1/flavors/").json()["results"] if f["name"] == "ascend-910b")
    assert (row["cpu_millicores_per_card"], row["host_memory_mib_per_card"]) == (24000, 196608)
    record = AuditRecord.objects.filter(action="flavor.create").latest("pk")
    assert record.target == f"flavor:{row['id']}"
    negative = client_for(SystemAdminFactory()).post(
        "/api/v1/flavors/", {**payload, "name": "bad", "cpu_millicores_per_card": -1}, format="json"
    )
    assert negative.status_code == 400 and "cpu_millicores_per_card" in str(negative.json())


def test_a_job_that_states_no_host_resources_gets_its_flavors_defaults_per_card(api):
    job = submit(api, {"flavors": ["sim-80g"], "gpus": 2})

    assert (job.cpu_millicores_per_replica, job.host_memory_mib_per_replica) == (16000, 131072)


def test_what_a_job_states_wins_over_the_flavors_defaults(api):
    job = submit(api, {"flavors": ["sim-80g"], "gpus": 2, "cpu_cores": 3})

    assert job.cpu_millicores_per_replica == 3000  # stated
    assert job.host_memory_mib_per_replica == 131072  # not stated: the default for 2 cards


def test_a_fraction_gets_its_share_and_a_job_naming_two_flavors_the_larger_default(api):
    half = submit(api, {"flavors": ["sim-80g"], "millis": 500, "memory_mib": 8192})
    assert (half.cpu_millicores_per_replica, half.host_memory_mib_per_replica) == (4000, 32768)

    FlavorFactory(name="sim-40g", cpu_millicores_per_card=12000, host_memory_mib_per_card=16384)
    either = submit(api, {"flavors": ["sim-80g", "sim-40g"], "gpus": 1})
    assert (either.cpu_millicores_per_replica, either.host_memory_mib_per_replica) == (12000, 65536)


def test_every_job_of_an_array_gets_the_defaults(api):
    response = api.post("/api/v1/jobs/", {**SPEC, "array": {"count": 3}}, format="json")
    assert response.status_code == 201, response.json()

    api.get(f"{response.json()['array_url']}tasks/2/")  # a task made a job later has them too
    assert Job.objects.count() == 2
    rows = Job.objects.values_list("cpu_millicores_per_replica", "host_memory_mib_per_replica")
    assert set(rows) == {(16000, 131072)}
