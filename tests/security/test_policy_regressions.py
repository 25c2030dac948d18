"""The cases of issue 15's "What was found" that came from copies of the role rules disagreeing, each as a
regression test against the one access policy (the separation-of-duties invariants themselves are in
tests/tenants/test_separation_of_duties.py; every endpoint x role is in test_policy_matrix.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from scheduler.models import JobState
from scheduler.services.jobs import job_submit
from tenants.models import ApprovalStatus, MembershipRole
from tenants.services.approvals import quota_change_request_create
from tenants.services.quotas import quota_set
from tests.factories import (
    AuditorFactory,
    MembershipFactory,
    SecurityAdminFactory,
    TenantFactory,
    UserFactory,
)
from tests.scheduler.factories import FlavorFactory

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pool():
    parent = TenantFactory(slug="acme")
    tenant = TenantFactory(slug="acme-vision", parent=parent)
    admin = UserFactory(username="vadmin")
    member = UserFactory(username="vmember")
    MembershipFactory(user=admin, tenant=tenant, role=MembershipRole.TENANT_ADMIN)
    MembershipFactory(user=member, tenant=tenant, role=MembershipRole.MEMBER)
    flavor = FlavorFactory()
    quota_set(actor=None, tenant=parent, flavor=flavor, values={"guaranteed_millis": 4000})
    quota_set(actor=None, tenant=tenant, flavor=flavor, values={"guaranteed_millis": 2000})
    job = job_submit(actor=member, spec=_spec(tenant, flavor))
    return {"tenant": tenant, "admin": admin, "member": member, "flavor": flavor, "job": job}


def _spec(tenant, flavor) -> dict:
    return {"name": "j", "tenant": tenant.slug, "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]}


def _session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_a_security_admin_neither_submits_work_nor_decides_a_quota_step(pool):
    approval = quota_change_request_create(
        actor=pool["admin"], tenant=pool["tenant"], flavor=pool["flavor"], values={"guaranteed_millis": 3000}
    )
    api = _session(SecurityAdminFactory())
    assert api.post("/api/v1/jobs/", _spec(pool["tenant"], pool["flavor"]), format="json").status_code == 403
    assert api.post(f"/api/v1/approvals/{approval.pk}/approve/", {"comment": "ok"}, format="json").status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_an_auditor_session_neither_submits_nor_cancels_by_any_route(pool, client):
    auditor = AuditorFactory()
    api = _session(auditor)
    job = pool["job"]
    assert api.post("/api/v1/jobs/", _spec(pool["tenant"], pool["flavor"]), format="json").status_code == 403
    assert api.post(f"/api/v1/jobs/{job.pk}/cancel/", {"reason": "x"}, format="json").status_code == 403
    client.force_login(auditor)
    assert client.post(f"/console/jobs/{job.pk}/cancel/", {"reason": "x"}).status_code == 404
    assert client.post("/console/jobs/submit/", {}).status_code == 403
    job.refresh_from_db()
    assert job.state != JobState.CANCELLED


def test_an_auditor_sees_the_same_jobs_in_the_api_and_the_console(pool, client):
    auditor = AuditorFactory()
    listed = _session(auditor).get("/api/v1/jobs/").json()["results"]
    assert [row["id"] for row in listed] == [pool["job"].pk]
    client.force_login(auditor)
    assert client.get("/console/jobs/").status_code == 200
    assert client.get(f"/console/jobs/{pool['job'].pk}/").status_code == 200


def test_a_security_admin_sees_no_tenants_work_in_the_api_or_the_console(pool, client):
    security = SecurityAdminFactory()
    assert _session(security).get("/api/v1/jobs/").json()["count"] == 0
    assert _session(security).get(f"/api/v1/jobs/{pool['job'].pk}/").status_code == 404
    client.force_login(security)
    assert client.get("/console/jobs/").status_code == 404


ROLE_RULE = re.compile(
    r"def (is_system_admin|is_security_admin|is_auditor)\b|platform_role\s*(==|!=)\s*(PlatformRole\.|\")"
)


def test_role_predicates_are_defined_once_and_nobody_compares_platform_roles():
    """``is_system_admin`` was defined three times and the copies disagreed: now tenants.permissions says who
    an account is, tenants.access evaluates the table, and no other module compares platform roles."""
    found = []
    for app in ("portal", "tenants", "scheduler", "audit", "frontend"):
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if ROLE_RULE.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}")
    assert found == [
        "tenants/permissions.py:" + str(_line("tenants/permissions.py", "def is_system_admin")),
        "tenants/permissions.py:" + str(_line("tenants/permissions.py", "def is_security_admin")),
        "tenants/permissions.py:" + str(_line("tenants/permissions.py", "def is_auditor")),
    ]


def _line(relative: str, text: str) -> int:
    lines = (ROOT / relative).read_text(encoding="utf-8").splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.startswith(text))
