"""The console must keep working under a Content-Security-Policy without 'unsafe-inline': no inline scripts,
no event-handler attributes, no style attributes — on every page, for every role."""

from __future__ import annotations

import re

import pytest

from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole, PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db

SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S | re.I)
HANDLER = re.compile(r"\son[a-z]+\s*=", re.I)
STYLE_ATTR = re.compile(r"\sstyle\s*=", re.I)


def assert_csp_clean(html: str, url: str) -> None:
    for attrs, body in SCRIPT.findall(html):
        if 'type="application/json"' in attrs:
            continue  # data (json_script), never executed
        assert "src=" in attrs and not body.strip(), f"inline script on {url}"
    assert not HANDLER.search(html), f"event handler attribute on {url}"
    assert not STYLE_ATTR.search(html), f"style attribute on {url}"


def test_every_page_is_free_of_inline_script_and_style(client):
    flavor = make_flavor()
    node = make_node("n1", devices=1, flavor=flavor)
    tenant = make_tenant("acme")
    admin_of_tenant = make_member(tenant, role=MembershipRole.TENANT_ADMIN)
    member = make_member(tenant)
    job = job_submit(
        actor=member,
        spec={"name": "j", "tenant": "acme", "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]},
    )
    pages = {
        make_user(platform_role=PlatformRole.SYSTEM_ADMIN): [
            "/console/overview/",
            "/console/nodes/",
            f"/console/nodes/{node.pk}/",
            "/console/tenants/",
            f"/console/tenants/{tenant.pk}/",
            "/console/approvals/",
            "/console/jobs/",
            f"/console/jobs/{job.pk}/",
            "/console/reports/",
            "/console/tenants/new/",
            f"/console/tenants/{tenant.pk}/edit/",
            f"/console/tenants/{tenant.pk}/quotas/",
        ],
        member: [
            "/console/overview/",
            "/console/jobs/submit/",
            f"/console/jobs/{job.pk}/",
            "/console/account/tokens/",
        ],
        admin_of_tenant: [f"/console/tenants/{tenant.pk}/", "/console/reports/"],
        make_user(platform_role=PlatformRole.AUDITOR): ["/console/audit/"],
        make_user(platform_role=PlatformRole.SECURITY_ADMIN): [
            "/console/users/",
            "/console/users/new/",
            f"/console/users/{member.pk}/",
            "/console/lockouts/",
        ],
    }
    for user, urls in pages.items():
        client.force_login(user)
        for url in urls:
            response = client.get(url)
            assert response.status_code == 200, url
            assert_csp_clean(response.content.decode(), url)
    client.logout()
    assert_csp_clean(client.get("/accounts/login/").content.decode(), "/accounts/login/")
