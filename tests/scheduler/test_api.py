import pytest
from rest_framework.test import APIClient

from catalog.models import ResourceFlavor
from scheduler.core import types as core
from scheduler.fleet.models import Node
from scheduler.models import Job, JobState
from scheduler.persist import persist_plan
from tests.factories import client_for
from tests.scheduler.factories import (
    JobFactory,
    MembershipFactory,
    SystemAdminFactory,
    TenantFactory,
    UserFactory,
)

SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["python"]}


@pytest.fixture
def api(member, node, no_cycle_requests):
    return client_for(member)


def test_member_submits_a_job_and_reads_it_back_with_events(api):
    response = api.post("/api/v1/jobs/", SPEC, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "queued" and body["tenant"] == "team-a" and body["gpus_per_replica"] == 1.0
    assert [e["to_state"] for e in body["events"]] == ["submitted", "queued"]
    assert "Queued" in body["pending_reason"]
    detail = api.get(f"/api/v1/jobs/{body['id']}/").json()
    assert detail["command"] == ["python"] and detail["allocations"] == []


def test_a_bad_spec_answers_400_with_a_code_and_the_field(api):
    response = api.post("/api/v1/jobs/", {**SPEC, "resources": {"flavors": ["nope"], "gpus": 1}}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_job_spec"
    assert "resources.flavors" in body["errors"]
    assert "known flavors: sim-80g" in body["detail"]


def test_tenant_a_member_gets_404_for_tenant_b_jobs(api, tenant):
    other = JobFactory(tenant=TenantFactory(slug="team-b"))
    mine = JobFactory(tenant=tenant)
    assert api.get(f"/api/v1/jobs/{other.pk}/").status_code == 404
    assert api.post(f"/api/v1/jobs/{other.pk}/cancel/", {}, format="json").status_code == 404
    ids = [row["id"] for row in api.get("/api/v1/jobs/").json()["results"]]
    assert ids == [mine.pk]


def test_job_list_filters_by_state_and_tenant(api, tenant):
    queued = JobFactory(tenant=tenant, state=JobState.QUEUED)
    JobFactory(tenant=tenant, state=JobState.SUCCEEDED)
    rows = api.get("/api/v1/jobs/", {"state": "queued", "tenant": "team-a"}).json()["results"]
    assert [row["id"] for row in rows] == [queued.pk]


def test_job_list_query_count_does_not_grow_with_jobs(api, tenant, django_assert_max_num_queries):
    for _ in range(20):
        JobFactory(tenant=tenant)
    with django_assert_max_num_queries(8):
        assert len(api.get("/api/v1/jobs/").json()["results"]) == 20


def test_cancel_command_endpoint(api, node):
    job_id = api.post("/api/v1/jobs/", SPEC, format="json").json()["id"]
    job = Job.objects.get(pk=job_id)
    device = node.devices.get(index=0)
    persist_plan(
        core.Plan(
            places=(
                core.Place(
                    job_id=str(job.pk),
                    tenant="team-a",
                    flavor="sim-80g",
                    assignments=(core.Assignment(0, node.name, device.uuid, 1000, 0),),
                ),
            )
        )
    )
    assert len(api.get(f"/api/v1/jobs/{job_id}/").json()["allocations"]) == 1
    response = api.post(f"/api/v1/jobs/{job_id}/cancel/", {"reason": "done"}, format="json")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    again = api.post(f"/api/v1/jobs/{job_id}/cancel/", {}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "job_finished"


def test_pending_reason_sentence_carries_the_queue_positions(api, tenant):
    job = JobFactory(
        tenant=tenant,
        pending_reason_code="insufficient_capacity",
        pending_message="No node has 1 free sim-80g card.",
        position_in_tenant=2,
        position_overall=5,
    )
    body = api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["pending_reason"] == ("No node has 1 free sim-80g card. Position 2 in your tenant's queue, 5 overall.")
    assert (body["position_in_tenant"], body["position_overall"]) == (2, 5)


def test_viewer_cannot_submit(tenant, node):
    viewer = UserFactory(username="viewer-x")
    MembershipFactory(user=viewer, tenant=tenant, role="viewer")
    response = client_for(viewer).post("/api/v1/jobs/", SPEC, format="json")
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"


def test_admins_see_all_jobs(tenant, db):
    JobFactory(tenant=tenant)
    JobFactory(tenant=TenantFactory(slug="team-z"))
    rows = client_for(SystemAdminFactory()).get("/api/v1/jobs/").json()["results"]
    assert len(rows) == 2


def test_nodes_and_devices_are_readable_but_only_admins_cordon(api, node):
    rows = api.get("/api/v1/nodes/").json()["results"]
    assert [(row["name"], row["device_count"]) for row in rows] == [("node-a", 2)]
    devices = api.get("/api/v1/devices/", {"node": "node-a"}).json()["results"]
    assert {d["flavor"] for d in devices} == {"sim-80g"}
    assert api.post(f"/api/v1/nodes/{node.pk}/cordon/").status_code == 403
    admin = client_for(SystemAdminFactory())
    assert admin.post(f"/api/v1/nodes/{node.pk}/cordon/").json()["status"] == "cordoned"
    assert admin.post(f"/api/v1/nodes/{node.pk}/drain/", {"grace_s": 10}, format="json").json()["status"] == "draining"
    assert admin.post(f"/api/v1/nodes/{node.pk}/uncordon/").json()["status"] == "ready"
    assert Node.objects.get(pk=node.pk).status == "ready"


def test_only_system_admins_create_flavors(api):
    payload = {"name": "ascend-910b", "vendor": "ascend", "model": "Ascend 910B", "memory_mib": 65536}
    assert api.post("/api/v1/flavors/", payload, format="json").status_code == 403
    response = client_for(SystemAdminFactory()).post("/api/v1/flavors/", payload, format="json")
    assert response.status_code == 201
    assert ResourceFlavor.objects.filter(name="ascend-910b").exists()
    duplicate = client_for(SystemAdminFactory()).post("/api/v1/flavors/", payload, format="json")
    assert duplicate.status_code == 409


def test_anonymous_requests_are_refused(client, db):
    assert client.get("/api/v1/jobs/").status_code in (401, 403)


def test_api_root_links_the_scheduler_endpoints(api):
    links = api.get("/api/v1/").json()["links"]
    assert {"jobs", "nodes", "devices", "flavors"} <= set(links)


def test_api_token_scopes_apply_to_scheduler_endpoints(member, node, no_cycle_requests):
    from tests.factories import ApiTokenFactory, bearer

    client = APIClient()
    read = ApiTokenFactory(user=member, scope="read")
    assert client.get("/api/v1/jobs/", headers=bearer(read)).status_code == 200
    assert client.post("/api/v1/jobs/", SPEC, format="json", headers=bearer(read)).status_code == 403
    write = ApiTokenFactory(user=member, scope="write")
    assert client.post("/api/v1/jobs/", SPEC, format="json", headers=bearer(write)).status_code == 201
    admin_user = SystemAdminFactory()
    admin_write = ApiTokenFactory(user=admin_user, scope="write")
    assert client.post(f"/api/v1/nodes/{node.pk}/cordon/", headers=bearer(admin_write)).status_code == 403
    admin_token = ApiTokenFactory(user=admin_user, scope="admin")
    assert client.post(f"/api/v1/nodes/{node.pk}/cordon/", headers=bearer(admin_token)).status_code == 200


def test_pending_reason_does_not_repeat_a_position_the_engine_already_gave(api, tenant):
    message = "no node has 1 free sim-80g card (position 1 in the queue, 1 among team-a's jobs)"
    job = JobFactory(tenant=tenant, pending_message=message, position_in_tenant=1, position_overall=1)
    assert api.get(f"/api/v1/jobs/{job.pk}/").json()["pending_reason"] == message
