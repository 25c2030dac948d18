"""/api/v1/audit/: auditors only — system admins, security admins, tenant admins and superusers are refused."""

from __future__ import annotations

import datetime as dt
import io
import zipfile

import pytest
from django.test import TestCase
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditRecord
from audit.selectors import records_for
from audit.services import audit_record
from tenants.models import MembershipRole
from tests.factories import (
    AuditorFactory,
    MembershipFactory,
    SecurityAdminFactory,
    SystemAdminFactory,
    TenantFactory,
    UserFactory,
    client_for,
)

pytestmark = pytest.mark.django_db
RECORDS = "/api/v1/audit/records/"


def tenant_admin():
    membership = MembershipFactory(role=MembershipRole.TENANT_ADMIN)
    return membership.user


@pytest.mark.parametrize(
    "make_user",
    [SystemAdminFactory, SecurityAdminFactory, tenant_admin, UserFactory],
    ids=["system_admin", "security_admin", "tenant_admin", "member"],
)
@pytest.mark.parametrize("url", [RECORDS, f"{RECORDS}1/", "/api/v1/audit/verify/", "/api/v1/audit/export/"])
def test_non_auditors_are_refused_and_the_attempt_is_audited(make_user, url):
    audit_record(action="user.create", actor=None, target="user:1")
    user = make_user()
    response = client_for(user).get(url)
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    denied = AuditRecord.objects.get(action="audit.access_denied", actor_id=user.pk)
    assert denied.outcome == "denied" and denied.target == url


def test_anonymous_is_refused():
    assert APIClient().get(RECORDS).status_code in (401, 403)


def test_auditor_searches_by_action_prefix_tenant_and_outcome():
    tenant = TenantFactory()
    audit_record(action="job.submit", actor=None, tenant=tenant, target="job:1", details={"gpus": 2})
    audit_record(action="job.cancel", actor=None, tenant=tenant, target="job:1", outcome="failure")
    audit_record(action="node.cordon", actor=None, target="node:1")
    client = client_for(AuditorFactory())
    rows = client.get(RECORDS, {"action": "job.", "tenant": tenant.pk}).json()["results"]
    assert [r["action"] for r in rows] == ["job.cancel", "job.submit"]
    assert rows[1]["details"] == {"gpus": 2}
    rows = client.get(RECORDS, {"outcome": "failure"}).json()["results"]
    assert [r["action"] for r in rows] == ["job.cancel"]


def test_auditor_filters_by_time_range_and_actor():
    actor = UserFactory(username="mallory")
    audit_record(action="token.create", actor=actor, target="token:1")
    audit_record(action="token.create", actor=None, target="token:2")
    client = client_for(AuditorFactory())
    assert [r["target"] for r in client.get(RECORDS, {"actor": "mallory"}).json()["results"]] == ["token:1"]
    future = (timezone.now() + dt.timedelta(hours=1)).isoformat()
    assert client.get(RECORDS, {"created_after": future}).json()["results"] == []


def test_searching_and_reading_are_audited_with_the_request_id():
    record = audit_record(action="user.create", actor=None, target="user:7")
    auditor = AuditorFactory()
    client = client_for(auditor)
    client.get(RECORDS, HTTP_X_REQUEST_ID="trace-42")
    response = client.get(f"{RECORDS}{record.pk}/")
    assert response.status_code == 200 and response.json()["target"] == "user:7"
    assert response.headers["X-Request-ID"]
    search = AuditRecord.objects.get(action="audit.search", actor_id=auditor.pk)
    assert search.request_id == "trace-42" and search.actor_ip == "127.0.0.1"
    assert AuditRecord.objects.filter(action="audit.read", target=f"audit:{record.pk}").exists()


def test_list_uses_a_fixed_number_of_queries(django_assert_max_num_queries):
    for index in range(30):
        audit_record(action="job.submit", actor=None, tenant=TenantFactory(), target=f"job:{index}")
    client = client_for(AuditorFactory())
    with django_assert_max_num_queries(16):
        assert len(client.get(RECORDS).json()["results"]) == 30


def test_verify_endpoint_reports_ok():
    audit_record(action="user.create", actor=None)
    body = client_for(AuditorFactory()).get("/api/v1/audit/verify/").json()
    assert body["ok"] is True and body["findings"] == []


def test_export_endpoint_downloads_a_signed_bundle():
    audit_record(action="user.create", actor=None)
    start = (timezone.now() - dt.timedelta(hours=1)).isoformat()
    end = (timezone.now() + dt.timedelta(hours=1)).isoformat()
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client_for(AuditorFactory()).get("/api/v1/audit/export/", {"start": start, "end": end})
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    names = set(zipfile.ZipFile(io.BytesIO(response.content)).namelist())
    assert {"manifest.json", "manifest.sig", "records.jsonl", "records.csv"} <= names
    assert AuditRecord.objects.filter(action="audit.export").exists()


def test_export_endpoint_rejects_an_empty_range():
    now = timezone.now().isoformat()
    response = client_for(AuditorFactory()).get("/api/v1/audit/export/", {"start": now, "end": now})
    assert response.status_code == 400


def test_selector_gives_non_auditors_nothing():
    audit_record(action="user.create", actor=None)
    assert records_for(SystemAdminFactory()).count() == 0
    assert records_for(AuditorFactory(), action="user.").count() == 1


def test_even_a_superuser_system_admin_cannot_see_audit_records_in_the_django_admin(client):
    admin = SystemAdminFactory(is_staff=True, is_superuser=True)
    audit_record(action="user.create", actor=None)
    client.force_login(admin)
    assert client.get("/admin/audit/auditrecord/").status_code == 404
    assert b"auditrecord" not in client.get("/admin/").content.lower()
