"""Every console page against every role: 200 where the role may use it, 404 (not 403: nothing to discover)
everywhere else, and the navigation offers exactly the pages that answer 200. One page answers 403 on purpose:
the submit page tells a platform account that reads jobs (system admin, auditor) why they cannot submit (the
API's 403), instead of pretending not to exist. The sections follow the access policy (kernel/access_rules.py): the
auditor reads what the API lets them read (tenants, jobs, usage) and changes nothing; every tenant role reads
its tenants' usage."""

from __future__ import annotations

import pytest

from audit.services import audit_record
from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole, PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db

ROLES = ["system_admin", "security_admin", "auditor", "tenant_admin", "member", "no_tenant"]
# page → roles that get 200
ALLOWED = {
    "overview": {"system_admin", "security_admin", "auditor", "tenant_admin", "member", "no_tenant"},
    "nodes": {"system_admin"},
    "node": {"system_admin"},
    "tenants": {"system_admin", "auditor", "tenant_admin", "member"},
    "tenant": {"system_admin", "auditor", "tenant_admin", "member"},
    "approvals": {"system_admin", "tenant_admin"},
    "jobs": {"system_admin", "auditor", "tenant_admin", "member"},
    "job": {"system_admin", "auditor", "tenant_admin", "member"},
    "submit": {"tenant_admin", "member"},
    "tokens": set(ROLES),
    "users": {"security_admin"},
    "user": {"security_admin"},
    "user_new": {"security_admin"},
    "lockouts": {"security_admin"},
    "tenant_new": {"system_admin", "tenant_admin"},
    "tenant_edit": {"system_admin", "tenant_admin"},
    "tenant_quotas": {"system_admin"},
    "reports": {"system_admin", "auditor", "tenant_admin", "member"},
    "whatif": {"system_admin"},
    "audit": {"auditor"},
    "audit_record": {"auditor"},
    "alerts": {"system_admin", "security_admin", "auditor"},
    "prices": {"system_admin"},
    "node_enrol": {"system_admin"},
}
# (page, role) → a status other than 200/404, on purpose.
EXPLAINED = {("submit", "system_admin"): 403, ("submit", "auditor"): 403}
NAV = {
    "overview": "/console/overview/",
    "nodes": "/console/nodes/",
    "tenants": "/console/tenants/",
    "approvals": "/console/approvals/",
    "jobs": "/console/jobs/",
    "reports": "/console/reports/",
    "whatif": "/console/whatif/",
    "audit": "/console/audit/",
    "alerts": "/console/alerts/",
    "users": "/console/users/",
    "lockouts": "/console/lockouts/",
    "tokens": "/console/account/tokens/",
}


@pytest.fixture
def world():
    flavor = make_flavor()
    node = make_node("n1", devices=1, flavor=flavor)
    tenant = make_tenant("acme")
    users = {
        "system_admin": make_user(platform_role=PlatformRole.SYSTEM_ADMIN),
        "security_admin": make_user(platform_role=PlatformRole.SECURITY_ADMIN),
        "auditor": make_user(platform_role=PlatformRole.AUDITOR),
        "tenant_admin": make_member(tenant, role=MembershipRole.TENANT_ADMIN),
        "member": make_member(tenant),
        "no_tenant": make_user(),
    }
    job = job_submit(
        actor=users["member"],
        spec={"name": "j", "tenant": "acme", "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]},
    )
    record = audit_record(action="console.matrix", actor=None)
    urls = {
        **NAV,
        "node": f"/console/nodes/{node.pk}/",
        "tenant": f"/console/tenants/{tenant.pk}/",
        "job": f"/console/jobs/{job.pk}/",
        "submit": "/console/jobs/submit/",
        "audit_record": f"/console/audit/{record.pk}/",
        "user": f"/console/users/{users['member'].pk}/",
        "user_new": "/console/users/new/",
        "tenant_new": "/console/tenants/new/",
        "tenant_edit": f"/console/tenants/{tenant.pk}/edit/",
        "tenant_quotas": f"/console/tenants/{tenant.pk}/quotas/",
        "prices": "/console/reports/prices/",
        "node_enrol": "/console/nodes/enrol/",
    }
    return users, urls


@pytest.mark.parametrize("role", ROLES)
def test_each_role_reaches_exactly_its_pages(client, world, role):
    users, urls = world
    client.force_login(users[role])
    got = {page: client.get(url).status_code for page, url in urls.items()}
    expected = {page: EXPLAINED.get((page, role), 200 if role in ALLOWED[page] else 404) for page in urls}
    assert got == expected
    page = client.get("/console/audit/" if role == "auditor" else "/console/overview/").content.decode()
    offered = {name for name, url in NAV.items() if f'href="{url}"' in page}
    assert offered == {name for name in NAV if role in ALLOWED[name]}
