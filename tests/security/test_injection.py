"""SQL and HTML injection through names, job specs and filters: stored verbatim, returned verbatim by the JSON
API, rendered escaped by the console, never an error; tables are intact afterwards.

Formula injection in CSV/XLSX downloads is test_csv_injection.py.
"""

from __future__ import annotations

import html

import pytest
from rest_framework.test import APIClient

from scheduler.models import Job
from tenants.models import MembershipRole, PlatformRole, Tenant, TokenScope
from tenants.services.tokens import api_token_create
from tests.frontend.factories import make_flavor, make_node, make_tenant
from tests.security.conftest import assert_unchanged, state_fingerprint
from tests.security.conftest import fast_member as make_member
from tests.security.conftest import fast_user as make_user

pytestmark = pytest.mark.django_db

SQL = "x'); DROP TABLE scheduler_job; -- \" OR 1=1 /*"
XSS = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
PAYLOADS = [SQL, XSS, "${7*7}{{7*7}}{% debug %}", "\u202eevil\u0000"[:-1], "名前 ✓ <b>bold</b>"]


def api(user, scope: str = TokenScope.WRITE) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_create(actor=user, name='t', scope=scope)[1]}")
    return client


@pytest.fixture
def world():
    make_flavor()
    node = make_node("inj-node")
    tenant = make_tenant("inj-co")
    member = make_member(tenant, username="inj-member")
    admin = make_member(tenant, role=MembershipRole.TENANT_ADMIN, username="inj-admin")
    system = make_user("inj-system", platform_role=PlatformRole.SYSTEM_ADMIN)
    return {"node": node, "tenant": tenant, "member": member, "admin": admin, "system": system}


def job_spec(payload: str) -> dict:
    return {
        "name": payload,
        "tenant": "inj-co",
        "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
        "command": ["sh", "-c", payload],
        "env": {"PAYLOAD": payload},
        "node_selector": {"team": payload},
    }


@pytest.mark.parametrize("payload", PAYLOADS)
def test_job_specs_are_stored_verbatim_and_rendered_escaped(world, client, payload):
    response = api(world["member"]).post("/api/v1/jobs/", job_spec(payload), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["command"][2], body["env"]["PAYLOAD"]) == (payload, payload, payload)
    job = Job.objects.get(pk=body["id"])
    assert (job.name, job.command, job.env, job.node_selector) == (
        payload,
        ["sh", "-c", payload],
        {"PAYLOAD": payload},
        {"team": payload},
    )
    client.force_login(world["member"])
    for url in (f"/console/jobs/{job.pk}/", "/console/jobs/"):
        page = client.get(url)
        assert page.status_code == 200, url
        text = page.content.decode()
        if payload != html.escape(payload):
            assert payload not in text, f"{url} renders the payload unescaped"
        assert html.escape(payload) in text or html.escape(payload, quote=False) in text, url
    assert Job.objects.count() == 1


@pytest.mark.parametrize("payload", [SQL, XSS])
def test_tenant_and_user_names_are_stored_verbatim_and_rendered_escaped(world, client, payload):
    response = api(world["system"], scope=TokenScope.ADMIN).post(
        "/api/v1/tenants/", {"name": payload, "slug": "inj-team", "kind": "team", "parent": world["tenant"].pk}
    )
    assert response.status_code == 201, response.content
    team = Tenant.objects.get(slug="inj-team")
    assert team.name == payload and response.json()["name"] == payload
    security = make_user("inj-security", platform_role=PlatformRole.SECURITY_ADMIN)
    response = api(security, scope=TokenScope.ADMIN).patch(
        f"/api/v1/users/{world['member'].pk}/", {"first_name": payload[:150], "last_name": payload[:150]}
    )
    assert response.status_code == 200, response.content
    client.force_login(world["admin"])
    for url in ("/console/tenants/", f"/console/tenants/{team.pk}/", f"/console/tenants/{world['tenant'].pk}/"):
        page = client.get(url)
        assert page.status_code == 200, url
        assert payload not in page.content.decode(), f"{url} renders the payload unescaped"
    assert Tenant.objects.filter(slug__in=["inj-co", "inj-team"]).count() == 2


@pytest.mark.parametrize(
    "query",
    [
        {"name": SQL},
        {"state": SQL},
        {"tenant": SQL},
        {"submitter": "' OR '1'='1"},
        {"priority_class": "1 OR 1=1"},
        {"submitted_after": "2026-01-01' OR '1'='1"},
        {"ordering": "-id; DROP TABLE scheduler_job"},
        {"limit": "1; DROP TABLE scheduler_job", "offset": "-1"},
    ],
)
def test_filters_with_sql_are_refused_or_match_nothing(world, query):
    client = api(world["member"])
    assert client.post("/api/v1/jobs/", job_spec("plain"), format="json").status_code == 201
    before = state_fingerprint()
    response = client.get("/api/v1/jobs/", query)
    assert response.status_code in (200, 400), response.content
    if response.status_code == 400:
        assert {"code", "detail"} <= set(response.json())
    elif set(query) & {"name", "tenant", "submitter"}:
        assert response.json()["results"] == []  # the quote is data, not SQL: nothing matches
    for path in ("/api/v1/tenants/", "/api/v1/nodes/", "/api/v1/memberships/"):
        assert client.get(path, {"name": SQL, "username": SQL, "status": SQL}).status_code in (200, 400)
    for bad_id in ("1%20OR%201=1", "1'", "0x1", "-1"):
        assert client.get(f"/api/v1/jobs/{bad_id}/").status_code == 404
    assert_unchanged(before, state_fingerprint(), "filters with SQL")
    assert Job.objects.count() == 1


def test_node_names_and_labels_from_agents_are_rendered_escaped(world, client):
    node = world["node"]
    node.name = XSS
    node.labels = {"rack": XSS}
    node.save(update_fields=["name", "labels"])
    client.force_login(world["system"])
    for url in ("/console/nodes/", f"/console/nodes/{node.pk}/", "/console/overview/"):
        page = client.get(url)
        assert page.status_code == 200, url
        assert XSS not in page.content.decode(), f"{url} renders the node name unescaped"
    response = api(world["system"]).get(f"/api/v1/nodes/{node.pk}/")
    assert response.json()["name"] == XSS and response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("moment", ["2000-01-01T00:00:00+16:00", "2000-01-01T00:00:00-23:59", "0001-01-01T00:00+01:00"])
def test_date_filters_with_extreme_offsets_are_answered_not_500(world, moment):
    """Found by tests/security/test_api_fuzz.py: PostgreSQL refuses offsets past ±15:59 (was a 500)."""
    auditor = make_user("inj-auditor", platform_role=PlatformRole.AUDITOR)
    for client, path, name in (
        (api(world["member"]), "/api/v1/jobs/", "submitted_after"),
        (api(auditor, scope=TokenScope.READ), "/api/v1/audit/records/", "created_after"),
    ):
        response = client.get(path, {name: moment})
        assert response.status_code in (200, 400), (path, moment, response.status_code)
        if response.status_code == 400:
            assert response.json()["code"] == "invalid" and name in response.json()["detail"]
