"""Job arrays: ``POST /api/v1/jobs/`` with ``"array": {"count": N}`` submits N independent tasks as one record; a
cycle makes jobs of the tasks it may place, a user of one by index."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from audit.models import AuditRecord
from audit.services import record_details
from audit.trail_verifier import verify_trail
from frontend.summaries import job_counts
from scheduler.fleet.models import AgentCommand
from scheduler.models import Allocation, Job, JobArray, JobState
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


def _array(body: dict) -> JobArray:
    return JobArray.objects.get(pk=body["array_id"])


def test_an_array_of_1000_is_one_record_until_a_cycle_makes_jobs_of_what_it_places(
    api, flavor, no_cycle_requests, django_capture_on_commit_callbacks
):
    # 13 nodes x 8 cards = 104 cards, 10 tenth-of-a-card tasks each: room for all 1,000.
    nodes = [node_with_devices(8, name=f"n{index:02d}") for index in range(13)]
    with django_capture_on_commit_callbacks(execute=True):
        body = submit_array(api, 1000)
    assert body["count"] == 1000 and body["state"] == "queued"
    assert no_cycle_requests == [1]  # one cycle request for the batch
    # Task 0 is a job; the other 999 are one range of the array's record.
    assert list(Job.objects.filter(array_id=body["array_id"]).values_list("pk", flat=True)) == [body["first_job_id"]]
    array = _array(body)
    assert (array.waiting, array.unmaterialized) == (999, [[1, 1000]])

    result = run_cycle()

    assert result.ran and result.stats["array_rows_made"] == 999
    assert Job.objects.filter(array_id=body["array_id"], state=JobState.ADMITTED).count() == 1000
    assert sorted(result.placed) == sorted(Job.objects.filter(array_id=body["array_id"]).values_list("pk", flat=True))
    assert Allocation.objects.active().count() == 1000
    assert {a.node_id for a in Allocation.objects.all()} == {node.pk for node in nodes}
    assert _array(body).waiting == 0
    # Each replica is told its index; a task is a copy of task 0 with its own life.
    starts = AgentCommand.objects.filter(command_type="workload.start")
    indexes = sorted(int(command.payload["env"]["GPUPOOL_ARRAY_INDEX"]) for command in starts)
    assert indexes == list(range(1000))
    assert {command.payload["env"]["LR"] for command in starts} == {"0.1"}
    head = Job.objects.get(pk=body["first_job_id"])
    task = Job.objects.get(array_id=body["array_id"], array_index=999)
    assert task.submitted_at == head.submitted_at and task.queued_at == head.queued_at
    assert (task.spec, task.command, task.tenant_id, task.millis_per_replica) == (
        head.spec,
        head.command,
        head.tenant_id,
        head.millis_per_replica,
    )
    assert task.env == {**head.env, "GPUPOOL_ARRAY_INDEX": "999"}
    assert list(task.events.values_list("from_state", "to_state")) == [
        ("", "submitted"),
        ("submitted", "queued"),
        ("queued", "admitted"),
    ]


def test_a_cycle_makes_jobs_of_no_more_tasks_than_the_free_cards_take_and_the_state_counts_every_task(
    api, node, no_cycle_requests
):
    # One node of 2 cards: 20 tenth-of-a-card tasks fit; the window keeps 64 queued jobs all the same (to be
    # explained, estimated, and preempted for).
    assert node.devices.count() == 2
    body = submit_array(api, 1000)
    first = run_cycle()
    assert len(first.placed) == 20 and first.stats["array_rows_made"] == 63
    assert _array(body).waiting == 936
    second = run_cycle()  # nothing freed: the window is filled up again with the next 20 tasks
    assert second.placed == [] and second.stats["array_rows_made"] == 20
    third = run_cycle()  # the window is full: nothing is made
    assert third.stats["array_rows_made"] == 0 and _array(body).waiting == 916

    state = api.get(body["array_url"]).json()
    assert state["count"] == 1000 and sum(state["states"].values()) == 1000
    assert state["states"] == {"admitted": 20, "queued": 980}
    assert state["not_yet_jobs"] == "84-999" and state["first_job_id"] == body["first_job_id"]
    waiting_job = Job.objects.get(array_id=body["array_id"], array_index=50)
    assert waiting_job.pending_reason_code  # a task that is a job is explained like any queued job
    # The queue's figures count the tasks that are not jobs yet.
    assert job_counts() == (980, 20)


def test_a_task_by_index_becomes_a_job_once_and_only_for_who_may_see_the_array(api, node, no_cycle_requests):
    body = submit_array(api, 50)
    task = api.get(f"{body['array_url']}tasks/7/")
    assert task.status_code == 200, task.json()
    assert (task.json()["array_index"], task.json()["state"]) == (7, "queued")
    assert api.get(f"{body['array_url']}tasks/7/").json()["id"] == task.json()["id"]  # the same job, not a second
    assert Job.objects.filter(array_id=body["array_id"]).count() == 2
    assert _array(body).unmaterialized == [[1, 7], [8, 50]]
    assert api.get(f"{body['array_url']}tasks/50/").status_code == 404
    assert api.get(f"{body['array_url']}tasks/0/").json()["id"] == body["first_job_id"]

    outsider = UserFactory()
    MembershipFactory(user=outsider, tenant=TenantFactory(slug="team-b"), role="member")
    other = APIClient()
    other.force_authenticate(outsider)
    assert other.get(f"{body['array_url']}tasks/8/").status_code == 404
    assert other.get(body["array_url"]).status_code == 404
    assert Job.objects.filter(array_id=body["array_id"]).count() == 2  # the outsider made nothing


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_array_of_100000_in_one_request_with_one_audit_record_that_verifies(member, node, no_cycle_requests):
    client = APIClient()
    client.force_authenticate(member)
    body = submit_array(client, 100_000)

    assert body["count"] == 100_000
    assert Job.objects.filter(array_id=body["array_id"]).count() == 1  # task 0; the rest is one range
    array = _array(body)
    assert (array.waiting, array.unmaterialized, array.count) == (99_999, [[1, 100_000]], 100_000)
    job = Job.objects.get(pk=body["first_job_id"])
    assert job.env == {
        "LR": "0.1",
        "GPUPOOL_ARRAY_INDEX": "0",
        "GPUPOOL_ARRAY_ID": body["array_id"],
        "GPUPOOL_ARRAY_COUNT": "100000",
    }
    task = client.get(f"{body['array_url']}tasks/99999/").json()
    assert task["env"]["GPUPOOL_ARRAY_INDEX"] == "99999" and task["state"] == "queued"

    # One audit record for the whole batch; none per task. The trail verifies.
    [record] = AuditRecord.objects.filter(action="job.array.submit")
    assert record.target == f"job_array:{body['array_id']}"
    details = record_details(record)
    assert details["array"]["count"] == 100_000 and details["after"]["state"] == "queued"
    assert not AuditRecord.objects.filter(action__in=["job.submit", "job.transition"]).exists()
    assert verify_trail(record_result=False).ok


@pytest.mark.django_db(transaction=True)
def test_an_array_costs_the_same_statements_whatever_its_count(postgres, member, node, no_cycle_requests):
    client = APIClient()
    client.force_authenticate(member)
    submit_array(client, 1)  # the tenant's audit data key is made once
    counts = []
    for count in (2, 500_000):
        with CaptureQueriesContext(connection) as queries:
            submit_array(client, count)
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize(
    ("array", "field", "says"),
    [
        ({"count": 0}, "array.count", "between 1 and 1000000"),
        ({"count": 1_000_001}, "array.count", "between 1 and 1000000"),
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
    run_cycle()  # the tasks become jobs (and are placed)
    rows = api.get("/api/v1/jobs/", {"array": first["array_id"]}).json()["results"]
    assert sorted(row["array_index"] for row in rows) == [0, 1, 2]
    assert {row["array_id"] for row in rows} == {first["array_id"]}
    assert first["first_job_id"] in {row["id"] for row in rows}
    assert first["jobs_url"].endswith(f"/api/v1/jobs/?array={first['array_id']}")

    outsider = UserFactory()
    MembershipFactory(user=outsider, tenant=TenantFactory(slug="team-b"), role="member")
    other = APIClient()
    other.force_authenticate(outsider)
    assert other.get("/api/v1/jobs/", {"array": first["array_id"]}).json()["results"] == []
    assert other.post(first["cancel_url"], {}, format="json").status_code == 404
    assert api.get("/api/v1/jobs/", {"array": "not-a-uuid"}).status_code == 400


def test_cancelling_an_array_cancels_waiting_tasks_jobs_and_placed_jobs_in_one_call(api, node, no_cycle_requests):
    body = submit_array(api, 400)
    run_cycle()  # 20 placed (2 cards), 44 more queued jobs; 336 tasks are not jobs yet
    placed = Job.objects.get(array_id=body["array_id"], array_index=5)
    assert placed.state == JobState.ADMITTED
    response = api.post(body["cancel_url"], {"reason": "sweep done"}, format="json")
    assert response.status_code == 200, response.json()
    result = response.json()
    assert result["cancelled"] == 400 and result["already_finished"] == 0
    assert result["cancelled_waiting"] == 336 and len(result["cancelled_job_ids"]) == 64
    assert set(Job.objects.filter(array_id=body["array_id"]).values_list("state", flat=True)) == {"cancelled"}
    assert not Allocation.objects.active().exists()
    assert AgentCommand.objects.filter(job=placed, command_type="workload.stop").count() == 1
    waiting = Job.objects.get(array_id=body["array_id"], array_index=50)
    assert waiting.state_message == "sweep done" and waiting.finished_at is not None
    assert list(waiting.events.values_list("from_state", "to_state")) == [
        ("", "submitted"),
        ("submitted", "queued"),
        ("queued", "cancelled"),
    ]
    assert AuditRecord.objects.filter(action="job.array.cancel", target=f"job_array:{body['array_id']}").count() == 1
    assert api.get(body["array_url"]).json()["states"] == {"cancelled": 400}
    assert run_cycle().stats["array_rows_made"] == 0  # nothing left to make jobs of
    again = api.post(body["cancel_url"], {}, format="json").json()
    assert (again["cancelled"], again["already_finished"]) == (0, 64)
    gone = api.get(f"{body['array_url']}tasks/300/")
    assert gone.status_code == 404 and "cancelled before it started" in gone.json()["detail"]


def test_cancelling_some_indices_leaves_the_other_tasks_waiting(api, node, no_cycle_requests):
    body = submit_array(api, 10)
    api.get(f"{body['array_url']}tasks/4/")  # task 4 is a job now, tasks 1-3 and 5-9 are not
    response = api.post(body["cancel_url"], {"indices": "2-4,9"}, format="json")
    assert response.status_code == 200, response.json()
    result = response.json()
    assert (result["cancelled"], result["cancelled_waiting"]) == (4, 3)
    assert _array(body).unmaterialized == [[1, 2], [5, 9]]
    assert api.get(body["array_url"]).json()["states"] == {"cancelled": 4, "queued": 6}
    for bad, says in (("7-3", "outside"), ("10", "outside"), ("x", "not an index"), ("", "at least one")):
        refused = api.post(body["cancel_url"], {"indices": bad}, format="json")
        assert refused.status_code == 400 and refused.json()["code"] == "invalid_indices", bad
        assert says in refused.json()["detail"], (bad, refused.json())
    assert api.get(body["array_url"]).json()["states"] == {"cancelled": 4, "queued": 6}


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
    assert {"array_id", "count", "first_job_id", "array_url", "jobs_url"} <= set(
        schema["components"]["schemas"]["JobArray"]["properties"]
    )
    assert "/api/v1/jobs/arrays/{array_id}/cancel/" in schema["paths"]
    assert "/api/v1/jobs/arrays/{array_id}/" in schema["paths"]
    assert "/api/v1/jobs/arrays/{array_id}/tasks/{index}/" in schema["paths"]
