"""Job arrays: ``POST /api/v1/jobs/`` with ``"array": {"count": N}`` creates N independent jobs in one transaction."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from audit.models import AuditRecord
from audit.services import record_details
from audit.trail_verifier import verify_trail
from scheduler.core import types as core
from scheduler.fleet.models import AgentCommand
from scheduler.models import Allocation, Job, JobEvent, JobState
from scheduler.persist import persist_plan
from scheduler.services.cycle import run_cycle
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory, node_with_devices

SPEC = {
    "name": "sweep",
    "tenant": "team-a",
    "resources": {"flavors": ["sim-80g"], "millis": 100, "memory_mib": 1024},
    "command": ["python", "sweep.py"],
    "env": {"LR": "0.1"},
}


@pytest.fixture
def api(member, no_cycle_requests) -> APIClient:
    client = APIClient()
    client.force_authenticate(member)
    return client


@pytest.fixture(autouse=True)
def witness_in_tmp(settings, tmp_path):
    settings.GPUPOOL_AUDIT_WITNESS_PATH = str(tmp_path / "witness.jsonl")


def submit_array(client: APIClient, count: int, **overrides) -> dict:
    response = client.post("/api/v1/jobs/", {**SPEC, **overrides, "array": {"count": count}}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_an_array_of_1000_is_queued_then_placed_by_one_cycle(
    api, flavor, no_cycle_requests, django_capture_on_commit_callbacks
):
    # 13 nodes x 8 cards = 104 cards, 10 tenth-of-a-card jobs each: room for all 1,000.
    nodes = [node_with_devices(8, name=f"n{index:02d}") for index in range(13)]
    with django_capture_on_commit_callbacks(execute=True):
        body = submit_array(api, 1000)
    assert body["count"] == 1000 and body["state"] == "queued" and len(body["job_ids"]) == 1000
    assert no_cycle_requests == [1]  # one cycle request for the batch
    assert Job.objects.filter(array_id=body["array_id"], state=JobState.QUEUED).count() == 1000

    result = run_cycle()

    assert result.ran and sorted(result.placed) == sorted(body["job_ids"])
    assert Job.objects.filter(array_id=body["array_id"], state=JobState.ADMITTED).count() == 1000
    assert Allocation.objects.active().count() == 1000
    assert {a.node_id for a in Allocation.objects.all()} == {node.pk for node in nodes}
    # Each replica is told its index.
    starts = AgentCommand.objects.filter(command_type="workload.start")
    indexes = sorted(int(command.payload["env"]["GPUPOOL_ARRAY_INDEX"]) for command in starts)
    assert indexes == list(range(1000))
    assert {command.payload["env"]["LR"] for command in starts} == {"0.1"}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_array_of_10000_in_one_request_with_one_audit_record_that_verifies(member, node, no_cycle_requests):
    client = APIClient()
    client.force_authenticate(member)
    started = time.perf_counter()
    body = submit_array(client, 10_000)
    elapsed = time.perf_counter() - started
    print(f"\narray of 10,000 jobs: {elapsed:.2f} s for the request ({10_000 / elapsed:.0f} jobs/s)")

    jobs = Job.objects.filter(array_id=body["array_id"])
    assert jobs.count() == 10_000 and body["count"] == 10_000
    assert sorted(jobs.values_list("array_index", flat=True)) == list(range(10_000))
    assert set(jobs.values_list("state", flat=True)) == {JobState.QUEUED}
    by_index = dict(jobs.values_list("array_index", "pk"))
    assert body["job_ids"] == [by_index[index] for index in range(10_000)]
    assert (body["first_job_id"], body["last_job_id"]) == (body["job_ids"][0], body["job_ids"][-1])
    job = jobs.get(array_index=9_999)
    assert job.env == {
        "LR": "0.1",
        "GPUPOOL_ARRAY_INDEX": "9999",
        "GPUPOOL_ARRAY_ID": body["array_id"],
        "GPUPOOL_ARRAY_COUNT": "10000",
    }
    assert JobEvent.objects.filter(job__array_id=body["array_id"]).count() == 20_000

    # One audit record for the whole batch; none per job. The trail verifies.
    [record] = AuditRecord.objects.filter(action="job.array.submit")
    assert record.target == f"job_array:{body['array_id']}"
    details = record_details(record)
    assert details["array"]["count"] == 10_000 and details["after"]["state"] == "queued"
    assert not AuditRecord.objects.filter(action__in=["job.submit", "job.transition"]).exists()
    assert verify_trail(record_result=False).ok


@pytest.mark.django_db(transaction=True)
def test_an_array_costs_the_same_statements_whatever_its_count(postgres, member, node, no_cycle_requests):
    # PostgreSQL copies job 0 inside the database; elsewhere bulk_create batches by the driver's parameter limit.
    client = APIClient()
    client.force_authenticate(member)
    submit_array(client, 1)  # the tenant's audit data key is made once
    counts = []
    for count in (2, 500):
        with CaptureQueriesContext(connection) as queries:
            submit_array(client, count)
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize(
    ("array", "field", "says"),
    [
        ({"count": 0}, "array.count", "between 1 and 10000"),
        ({"count": 10_001}, "array.count", "between 1 and 10000"),
        ({"count": "10"}, "array.count", "whole number"),
        ({"count": True}, "array.count", "whole number"),
        ({"count": 2.5}, "array.count", "whole number"),
        ({}, "array.count", "is required"),
        ({"count": 3, "size": 2}, "array.size", "not a known field"),
        (5, "array", "must be an object"),
        ([1, 2], "array", "must be an object"),
    ],
)
def test_a_bad_array_is_refused_with_a_clear_400(api, node, array, field, says):
    response = api.post("/api/v1/jobs/", {**SPEC, "array": array}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_job_spec" and field in body["errors"], body
    assert says in body["detail"]
    assert not Job.objects.exists()


def test_an_array_whose_jobs_would_need_approval_is_refused(api, node):
    response = api.post("/api/v1/jobs/", {**SPEC, "priority_class": "critical", "array": {"count": 3}}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "array_needs_approval"
    assert not Job.objects.exists()


def test_an_array_follows_the_single_submit_rules_for_tenants_and_env(tenant, node, no_cycle_requests):
    client = APIClient()
    viewer = UserFactory()
    MembershipFactory(user=viewer, tenant=tenant, role="viewer")
    client.force_authenticate(viewer)
    assert client.post("/api/v1/jobs/", {**SPEC, "array": {"count": 2}}, format="json").status_code == 403
    outsider = UserFactory()
    MembershipFactory(user=outsider, tenant=TenantFactory(slug="team-b"), role="member")
    client.force_authenticate(outsider)
    assert client.post("/api/v1/jobs/", {**SPEC, "array": {"count": 2}}, format="json").status_code == 404
    member = UserFactory()
    MembershipFactory(user=member, tenant=tenant, role="member")
    client.force_authenticate(member)
    bad_env = client.post("/api/v1/jobs/", {**SPEC, "env": {"A=B": "1"}, "array": {"count": 2}}, format="json")
    assert bad_env.status_code == 400 and "'A=B'" in bad_env.json()["detail"]
    assert not Job.objects.exists()


def test_the_jobs_list_filters_by_array_and_hides_other_tenants_arrays(api, node, no_cycle_requests):
    first = submit_array(api, 3)
    submit_array(api, 2)
    api.post("/api/v1/jobs/", {k: v for k, v in SPEC.items()}, format="json")
    rows = api.get("/api/v1/jobs/", {"array": first["array_id"]}).json()["results"]
    assert sorted(row["id"] for row in rows) == sorted(first["job_ids"])
    assert sorted(row["array_index"] for row in rows) == [0, 1, 2]
    assert {row["array_id"] for row in rows} == {first["array_id"]}
    assert first["jobs_url"].endswith(f"/api/v1/jobs/?array={first['array_id']}")

    outsider = UserFactory()
    MembershipFactory(user=outsider, tenant=TenantFactory(slug="team-b"), role="member")
    other = APIClient()
    other.force_authenticate(outsider)
    assert other.get("/api/v1/jobs/", {"array": first["array_id"]}).json()["results"] == []
    assert other.post(first["cancel_url"], {}, format="json").status_code == 404
    assert api.get("/api/v1/jobs/", {"array": "not-a-uuid"}).status_code == 400


def test_cancelling_an_array_cancels_waiting_and_placed_jobs_in_one_call(api, node, no_cycle_requests):
    body = submit_array(api, 4)
    placed = Job.objects.get(pk=body["job_ids"][0])
    device = node.devices.get(index=0)
    persist_plan(
        core.Plan(
            places=(
                core.Place(
                    job_id=str(placed.pk),
                    tenant="team-a",
                    flavor="sim-80g",
                    assignments=(core.Assignment(0, node.name, device.uuid, 100, 1024),),
                ),
            )
        )
    )
    response = api.post(body["cancel_url"], {"reason": "sweep done"}, format="json")
    assert response.status_code == 200, response.json()
    result = response.json()
    assert result["cancelled"] == 4 and result["already_finished"] == 0
    assert sorted(result["cancelled_job_ids"]) == sorted(body["job_ids"])
    assert set(Job.objects.filter(array_id=body["array_id"]).values_list("state", flat=True)) == {"cancelled"}
    assert not Allocation.objects.active().exists()
    assert AgentCommand.objects.filter(job=placed, command_type="workload.stop").count() == 1
    waiting = Job.objects.get(pk=body["job_ids"][1])
    assert waiting.state_message == "sweep done" and waiting.finished_at is not None
    assert list(waiting.events.values_list("from_state", "to_state")) == [
        ("", "submitted"),
        ("submitted", "queued"),
        ("queued", "cancelled"),
    ]
    assert AuditRecord.objects.filter(action="job.array.cancel", target=f"job_array:{body['array_id']}").count() == 1
    again = api.post(body["cancel_url"], {}, format="json").json()
    assert (again["cancelled"], again["already_finished"]) == (0, 4)


def test_only_the_submitter_or_an_admin_cancels_an_array(api, tenant, node, no_cycle_requests):
    body = submit_array(api, 2)
    colleague = UserFactory()
    MembershipFactory(user=colleague, tenant=tenant, role="member")
    client = APIClient()
    client.force_authenticate(colleague)
    assert client.post(body["cancel_url"], {}, format="json").status_code == 403
    admin = UserFactory()
    MembershipFactory(user=admin, tenant=tenant, role="tenant_admin")
    client.force_authenticate(admin)
    assert client.post(body["cancel_url"], {}, format="json").json()["cancelled"] == 2


def test_the_openapi_schema_documents_the_array_answer(api):
    schema = api.get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/v1/jobs/"]["post"]
    answer = operation["responses"]["201"]["content"]["application/json"]
    assert any(example["summary"].startswith("The array created") for example in answer["examples"].values())
    result = schema["components"]["schemas"][answer["schema"]["$ref"].rsplit("/", 1)[-1]]
    assert {option["$ref"].rsplit("/", 1)[-1] for option in result["oneOf"]} == {"JobDetail", "JobArray"}
    assert {"array_id", "count", "job_ids", "jobs_url"} <= set(
        schema["components"]["schemas"]["JobArray"]["properties"]
    )
    assert "/api/v1/jobs/arrays/{array_id}/cancel/" in schema["paths"]
