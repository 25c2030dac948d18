"""Single submit: the statement budget of ``POST /api/v1/jobs/``, its answer, who may submit, env validation."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from audit.models import AuditRecord
from scheduler.models import Job, JobEvent, JobState
from tests.factories import ApiTokenFactory, bearer
from tests.scheduler.factories import MembershipFactory, SystemAdminFactory, TenantFactory, UserFactory

SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["python"]}

# Statements one ``POST /api/v1/jobs/`` by a token-authenticated member may issue, everything counted:
#   1 token lookup (with its user; ``last_used_at`` is written at most once a minute, not here)
#   1 BEGIN
#   1 tenant + ancestors + the member's role + the flavors exist (one SELECT)
#   1 INSERT of the job, already queued, and of its two events (submitted, queued): one statement on PostgreSQL
#     (the job's INSERT in a WITH), two on SQLite
#   2 audit flush at COMMIT (lock the chain head — sent with SET CONSTRAINTS ALL IMMEDIATE in one execute —;
#     insert the record and move the head in one statement on PostgreSQL, two on SQLite)
#   1 COMMIT
# The job is not read back for the answer. Before issue 14 this was 26 (19 with the per-commit audit flush alone).
SUBMIT_STATEMENT_BUDGET = 7 if connection.vendor == "postgresql" else 9


def client_with_token(user) -> tuple[APIClient, dict[str, str]]:
    return APIClient(), bearer(ApiTokenFactory(user=user, scope="write"))


def count_submit(client: APIClient, headers: dict[str, str], spec: dict) -> tuple[int, list[str], dict]:
    with CaptureQueriesContext(connection) as queries:
        response = client.post("/api/v1/jobs/", spec, format="json", headers=headers)
    assert response.status_code == 201, response.json()
    return len(queries.captured_queries), [q["sql"] for q in queries.captured_queries], response.json()


@pytest.mark.django_db(transaction=True)
def test_single_submit_stays_within_its_statement_budget(member, node, no_cycle_requests):
    # transaction=True: the request's own COMMIT (and the audit flush before it) really happens and is counted.
    client, headers = client_with_token(member)
    count_submit(client, headers, SPEC)  # first use: the token's last_used_at and the tenant's audit data key
    count, statements, body = count_submit(client, headers, SPEC)
    assert count <= SUBMIT_STATEMENT_BUDGET, "\n".join(statements)
    assert body["state"] == "queued"
    assert AuditRecord.objects.filter(action="job.submit", target=f"job:{body['id']}").count() == 1


@pytest.mark.django_db(transaction=True)
def test_submit_to_a_nested_tenant_costs_no_more_statements(node, no_cycle_requests):
    # The role is held on the root two levels up, and the approval threshold is inherited from there too:
    # both are read in the same query as the tenant (its ancestors come with it).
    root = TenantFactory(slug="root", job_approval_threshold_millis=1000)
    middle = TenantFactory(slug="middle", parent=root, depth=2)
    TenantFactory(slug="leaf", parent=middle, depth=3)
    user = UserFactory()
    MembershipFactory(user=user, tenant=root, role="member")
    client, headers = client_with_token(user)
    count_submit(client, headers, {**SPEC, "tenant": "leaf"})
    count, statements, body = count_submit(client, headers, {**SPEC, "tenant": "leaf"})
    assert count <= SUBMIT_STATEMENT_BUDGET, "\n".join(statements)
    assert body["tenant"] == "leaf" and body["state"] == "queued"
    # Above the root's threshold (1 card), within the pool's 2 cards: held for approval, as before.
    held = client.post(
        "/api/v1/jobs/", {**SPEC, "tenant": "leaf", "replicas": 2}, format="json", headers=headers
    ).json()
    assert held["state"] == "pending_approval"
    assert [e["to_state"] for e in held["events"]] == ["submitted", "pending_approval"]


def test_the_answer_is_the_job_as_a_later_read_shows_it(member, node, no_cycle_requests):
    client = APIClient()
    client.force_authenticate(member)
    created = client.post("/api/v1/jobs/", {**SPEC, "env": {"EPOCHS": "3"}}, format="json")
    assert created.status_code == 201
    body = created.json()
    assert body == client.get(f"/api/v1/jobs/{body['id']}/").json()
    assert [(e["from_state"], e["to_state"], e["actor"]) for e in body["events"]] == [
        ("", "submitted", "member-a"),
        ("submitted", "queued", "member-a"),
    ]
    assert body["array_id"] is None and body["array_index"] is None


def test_a_critical_job_enters_pending_approval_with_the_same_history(member, node, no_cycle_requests):
    client = APIClient()
    client.force_authenticate(member)
    body = client.post("/api/v1/jobs/", {**SPEC, "priority_class": "critical"}, format="json").json()
    assert body["state"] == "pending_approval"
    assert body["pending_reason"] == "Waiting for approval by an administrator."
    job = Job.objects.get(pk=body["id"])
    assert job.queued_at is None
    assert list(JobEvent.objects.filter(job=job).values_list("to_state", "reason")) == [
        ("submitted", "submitted"),
        ("pending_approval", "approval_required"),
    ]


def test_who_may_submit_is_decided_as_before(tenant, node, no_cycle_requests):
    client = APIClient()
    viewer = UserFactory()
    MembershipFactory(user=viewer, tenant=tenant, role="viewer")
    client.force_authenticate(viewer)
    assert client.post("/api/v1/jobs/", SPEC, format="json").status_code == 403
    outsider = UserFactory()
    MembershipFactory(user=outsider, tenant=TenantFactory(slug="team-b"), role="member")
    client.force_authenticate(outsider)
    missing = client.post("/api/v1/jobs/", SPEC, format="json")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert client.post("/api/v1/jobs/", {**SPEC, "tenant": "no-such"}, format="json").status_code == 404
    # Platform roles see every tenant but submit nowhere without a membership: 403, not 404.
    client.force_authenticate(SystemAdminFactory())
    assert client.post("/api/v1/jobs/", SPEC, format="json").status_code == 403
    # Without "tenant", a member's only tenant is used.
    client.force_authenticate(outsider)
    body = client.post("/api/v1/jobs/", {k: v for k, v in SPEC.items() if k != "tenant"}, format="json").json()
    assert body["tenant"] == "team-b"


def test_an_anonymous_or_deactivated_actor_sees_no_tenant(member, node, no_cycle_requests):
    from django.contrib.auth.models import AnonymousUser

    from kernel.api import NotFoundError
    from scheduler.services.jobs import job_submit

    with pytest.raises(NotFoundError):
        job_submit(actor=AnonymousUser(), spec=SPEC)
    member.is_active = False
    with pytest.raises(NotFoundError):
        job_submit(actor=member, spec=SPEC)
    assert not Job.objects.exists()


def test_an_unknown_flavor_is_a_spec_error_even_for_a_tenant_you_cannot_see(member, node, no_cycle_requests):
    client = APIClient()
    client.force_authenticate(member)
    spec = {**SPEC, "tenant": "no-such", "resources": {"flavors": ["nope"], "gpus": 1}}
    response = client.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400 and response.json()["code"] == "invalid_job_spec"
    assert "known flavors: sim-80g" in response.json()["detail"]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"A=B": "x"}, "'A=B'"),
        ({"1ABC": "x"}, "'1ABC'"),
        ({"MY-VAR": "x"}, "'MY-VAR'"),
        ({"": "x"}, "''"),
        ({"OK": 1}, "env.OK"),
        ({"OK": None}, "env.OK"),
        ({"GPUPOOL_ARRAY_INDEX": "3"}, "env.GPUPOOL_ARRAY_INDEX"),
    ],
)
def test_bad_env_is_refused_with_a_400_naming_the_variable(member, node, no_cycle_requests, env, named):
    client = APIClient()
    client.force_authenticate(member)
    response = client.post("/api/v1/jobs/", {**SPEC, "env": env}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "invalid_job_spec"
    assert named in body["detail"], body["detail"]
    assert not Job.objects.exists()


@pytest.mark.parametrize("env", [{"A\x00B": "x"}, {"OK": "a\x00b"}])
def test_a_nul_in_env_is_refused_before_the_spec_is_read(member, node, no_cycle_requests, env):
    # A NUL anywhere in a request is bad input (kernel/request_limits.py): PostgreSQL cannot store it.
    client = APIClient()
    client.force_authenticate(member)
    response = client.post("/api/v1/jobs/", {**SPEC, "env": env}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "nul_byte"
    assert "env" in response.json()["detail"]
    assert not Job.objects.exists()


def test_posix_env_names_are_accepted(member, node, no_cycle_requests):
    client = APIClient()
    client.force_authenticate(member)
    env = {"_PRIVATE": "", "lower_case": "x=y", "A1": "spaces and = signs are fine in values"}
    response = client.post("/api/v1/jobs/", {**SPEC, "env": env}, format="json")
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).env == env
    assert response.json()["state"] == JobState.QUEUED
