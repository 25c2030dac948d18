from __future__ import annotations

import pytest

from tenants.models import ApprovalStatus, MembershipRole, PlatformRole, Quota
from tenants.services.quotas import quota_set
from tests.frontend.factories import make_flavor, make_member, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    flavor = make_flavor("nvidia-h100-80g")
    acme = make_tenant("acme")
    research = make_tenant("research", parent=acme)
    vision = make_tenant("vision", parent=research)
    quota_set(actor=None, tenant=acme, flavor=flavor, values={"guaranteed_millis": 8000, "limit_millis": 8000})
    quota_set(actor=None, tenant=research, flavor=flavor, values={"guaranteed_millis": 4000, "limit_millis": 8000})
    return {
        "flavor": flavor,
        "acme": acme,
        "research": research,
        "vision": vision,
        "alice": make_member(research, role=MembershipRole.TENANT_ADMIN, username="alice"),
        "bob": make_member(vision, username="bob"),
        "admin": make_user("admin", platform_role=PlatformRole.SYSTEM_ADMIN),
        "boss": make_member(acme, role=MembershipRole.TENANT_ADMIN, username="boss"),
    }


def request_quota(client, tenant, **values):
    data = {"q-flavor": "nvidia-h100-80g", "q-guaranteed_cards": "2", "q-guaranteed_memory_gib": "0", **values}
    return client.post(f"/console/tenants/{tenant.pk}/quota-request/", data)


def test_tenant_page_draws_quota_bars(client, world):
    client.force_login(world["alice"])
    page = client.get(f"/console/tenants/{world['research'].pk}/").content.decode()
    assert 'data-testid="quota-table"' in page
    assert '<svg class="qbar"' in page
    rows = client.get(f"/console/tenants/{world['research'].pk}/").context["quotas"]
    assert [(r.flavor, r.guaranteed, r.limit, r.in_use) for r in rows] == [("nvidia-h100-80g", 4000, 8000, 0)]


def test_tenant_admin_requests_a_quota_change_and_two_approvers_apply_it(client, world):
    client.force_login(world["alice"])
    response = request_quota(client, world["vision"], **{"q-limit_cards": "3", "q-reason": "new project"})
    assert response.status_code == 302
    approval_url = response["Location"]
    assert "/console/approvals/" in approval_url
    # The chain is: a tenant admin of the parent (research), then a system admin. Nobody decides their own
    # request, so alice sees no decision form; another research admin takes the first step.
    assert "Your decision" not in client.get(approval_url).content.decode()

    second_admin = make_member(world["research"], role=MembershipRole.TENANT_ADMIN, username="dora")
    client.force_login(second_admin)
    inbox = client.get("/console/approvals/").content.decode()
    assert approval_url in inbox
    client.post(approval_url, {"decision": "approve", "comment": "fine"})
    client.force_login(world["admin"])
    response = client.post(approval_url, {"decision": "approve", "comment": ""}, follow=True)
    assert "Decision recorded" in response.content.decode()
    quota = Quota.objects.get(tenant=world["vision"], flavor=world["flavor"])
    assert (quota.guaranteed_millis, quota.limit_millis) == (2000, 3000)


def test_rejecting_needs_a_comment(client, world):
    client.force_login(world["alice"])
    approval_url = request_quota(client, world["vision"])["Location"]
    client.force_login(make_member(world["research"], role=MembershipRole.TENANT_ADMIN, username="dora"))
    page = client.post(approval_url, {"decision": "reject", "comment": ""}).content.decode()
    assert "Say why" in page
    client.post(approval_url, {"decision": "reject", "comment": "too much"})
    page = client.get(approval_url).content.decode()
    assert 'data-testid="approval-status">rejected' in page and "too much" in page


def test_impossible_quota_request_is_refused_with_the_reason(client, world):
    client.force_login(world["alice"])
    response = request_quota(client, world["vision"], **{"q-guaranteed_cards": "9"})
    assert response.status_code == 302 and response["Location"] == f"/console/tenants/{world['vision'].pk}/"
    page = client.get(response["Location"]).content.decode()
    assert 'class="msg error"' in page


def test_members_cannot_request_quota_or_open_the_inbox(client, world):
    client.force_login(world["bob"])
    assert "Request a quota change" not in client.get(f"/console/tenants/{world['vision'].pk}/").content.decode()
    assert request_quota(client, world["vision"]).status_code == 404
    assert client.get("/console/approvals/").status_code == 404


def test_approvals_of_other_tenants_are_404(client, world):
    client.force_login(world["alice"])
    approval_url = request_quota(client, world["vision"])["Location"]
    other = make_tenant("globex")
    client.force_login(make_member(other, role=MembershipRole.TENANT_ADMIN))
    assert client.get(approval_url).status_code == 404
    assert client.post(approval_url, {"decision": "approve"}).status_code == 404
    assert world["vision"].approval_requests.get().status == ApprovalStatus.PENDING
