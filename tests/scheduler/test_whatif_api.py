"""``POST /api/v1/whatif/`` and ``GET /api/v1/trace-export/``: system admins only, every other role 403."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from audit.models import AuditRecord
from tenants.models import MembershipRole, PlatformRole
from tests.factories import client_for
from tests.scheduler.factories import MembershipFactory, SystemAdminFactory, UserFactory
from tests.scheduler.history import job_history

pytestmark = pytest.mark.django_db
PROPOSAL = {"days": 1, "set": {"preemption": False, "min_runtime_before_preempt_s": 900}}


@pytest.fixture(autouse=True)
def _quiet(no_cycle_requests):
    return no_cycle_requests


@pytest.fixture
def roles(member, tenant):
    tenant_admin = UserFactory(username="tenant-admin")
    MembershipFactory(user=tenant_admin, tenant=tenant, role=MembershipRole.TENANT_ADMIN)
    return {
        "member": member,
        "tenant_admin": tenant_admin,
        "security_admin": UserFactory(username="sec", platform_role=PlatformRole.SECURITY_ADMIN),
        "auditor": UserFactory(username="aud", platform_role=PlatformRole.AUDITOR),
    }


@pytest.mark.parametrize("role", ["member", "tenant_admin", "security_admin", "auditor"])
def test_only_a_system_admin_runs_a_whatif_or_exports_the_history(roles, role, node):
    api = client_for(roles[role])

    assert api.post("/api/v1/whatif/", PROPOSAL, format="json").status_code == 403
    assert api.get("/api/v1/trace-export/?days=1").status_code == 403
    assert not AuditRecord.objects.filter(action="trace.export").exists()


def test_an_anonymous_caller_is_asked_to_sign_in():
    api = client_for(None)

    assert api.post("/api/v1/whatif/", PROPOSAL, format="json").status_code == 401
    assert api.get("/api/v1/trace-export/").status_code == 401


def test_a_system_admin_gets_both_sides_of_the_whatif(member, node):
    job_history(member, node)

    response = client_for(SystemAdminFactory()).post("/api/v1/whatif/", PROPOSAL, format="json")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["jobs"] == 3 and body["gpus"] == 2
    assert body["changes"] == {"preemption": False, "min_runtime_before_preempt_s": 900.0}
    assert body["current_policy"]["preemption"] is True and body["proposed_policy"]["preemption"] is False
    metrics = {row["key"]: row for row in body["metrics"]}
    assert metrics["finished"]["current"] == metrics["finished"]["proposed"] == 3
    assert {"jct_p99_s", "queued_p99_s", "within_guarantee", "starved_while_borrowed", "preemptions"} <= set(metrics)
    assert {row["tenant"] for row in body["tenants"]} == {"team-a"}
    assert body["allocated_share_hourly"]["current"]


def test_an_unknown_setting_is_a_400_that_lists_the_valid_ones(member, node):
    job_history(member, node)

    response = client_for(SystemAdminFactory()).post(
        "/api/v1/whatif/", {"days": 1, "set": {"preempt": False}}, format="json"
    )

    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_setting"
    assert "unknown setting 'preempt'; the settings are preemption, borrowing" in body["detail"]


def test_a_window_without_jobs_is_a_400_not_an_empty_comparison(node):
    response = client_for(SystemAdminFactory()).post("/api/v1/whatif/", PROPOSAL, format="json")

    assert response.status_code == 400 and response.json()["code"] == "empty_window"


def test_a_whatif_too_large_for_a_web_request_is_refused(member, node, monkeypatch):
    job_history(member, node)
    monkeypatch.setattr("scheduler.api.whatif.WEB_MAX_JOBS", 2)

    response = client_for(SystemAdminFactory()).post("/api/v1/whatif/", PROPOSAL, format="json")

    assert response.status_code == 400
    assert response.json()["code"] == "window_too_large" and "gpupool whatif" in response.json()["detail"]


def test_a_system_admin_downloads_the_history_as_a_zip_of_the_trace_files(member, node):
    job_history(member, node)

    response = client_for(SystemAdminFactory()).get("/api/v1/trace-export/?days=1&file_format=jsonl")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    bundle = zipfile.ZipFile(io.BytesIO(response.content))
    assert sorted(bundle.namelist()) == ["cluster.jsonl", "jobs.jsonl", "manifest.json", "tenants.jsonl"]
    assert len(bundle.read("jobs.jsonl").decode().splitlines()) == 3
    assert json.loads(bundle.read("manifest.json"))["never_ran"] == 1
    assert AuditRecord.objects.filter(action="trace.export").count() == 1


def test_a_bad_export_query_is_a_400(node):
    api = client_for(SystemAdminFactory())

    assert api.get("/api/v1/trace-export/?file_format=xml").status_code == 400
    assert api.get("/api/v1/trace-export/?days=0").status_code == 400


def test_a_window_reaching_before_the_year_one_is_a_400_not_a_crash(node):
    api = client_for(SystemAdminFactory())

    response = api.get("/api/v1/trace-export/?until=0001-01-02T00:00:00Z&days=30")

    assert response.status_code == 400 and response.json()["code"] == "invalid"
