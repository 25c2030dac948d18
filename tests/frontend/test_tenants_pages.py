from __future__ import annotations

import pytest

from tenants.models import MembershipRole, PlatformRole
from tests.frontend.factories import make_member, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def tree():
    acme = make_tenant("acme")
    research = make_tenant("research", parent=acme)
    vision = make_tenant("vision", parent=research)
    other = make_tenant("globex")
    return {"acme": acme, "research": research, "vision": vision, "globex": other}


def test_system_admin_sees_the_whole_tree_nested(client, tree):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.get("/console/tenants/")
    roots = response.context["tree"]
    assert [n.tenant.slug for n in roots] == ["acme", "globex"]
    assert [n.tenant.slug for n in roots[0].children] == ["research"]
    assert [n.tenant.slug for n in roots[0].children[0].children] == ["vision"]


def test_tenant_admin_sees_only_their_subtree(client, tree):
    client.force_login(make_member(tree["research"], role=MembershipRole.TENANT_ADMIN))
    response = client.get("/console/tenants/")
    roots = response.context["tree"]
    assert [n.tenant.slug for n in roots] == ["research"]
    assert response.context["inbox_count"] == 0
    assert client.get(f"/console/tenants/{tree['vision'].pk}/").status_code == 200
    assert client.get(f"/console/tenants/{tree['globex'].pk}/").status_code == 404
    assert client.get(f"/console/tenants/{tree['acme'].pk}/").status_code == 404


def test_tenant_page_lists_members_and_sub_tenants(client, tree):
    bob = make_member(tree["research"], username="bob")
    client.force_login(bob)
    page = client.get(f"/console/tenants/{tree['research'].pk}/").content.decode()
    assert "bob" in page and "Vision" in page


def test_members_get_no_inbox_count(client, tree):
    client.force_login(make_member(tree["vision"]))
    assert client.get("/console/tenants/").context["inbox_count"] is None


def test_auditor_reads_tenant_pages_without_change_controls(client, tree):
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    assert client.get("/console/tenants/").status_code == 200
    page = client.get(f"/console/tenants/{tree['acme'].pk}/")
    assert page.status_code == 200
    assert page.context["can_request"] is False and page.context["can_set_quota"] is False


def test_tree_shows_each_tenants_quota_bars(client, tree):
    from tenants.services.quotas import quota_set
    from tests.frontend.factories import make_flavor

    flavor = make_flavor("nvidia-h100-80g")
    quota_set(actor=None, tenant=tree["acme"], flavor=flavor, values={"guaranteed_millis": 4000})
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.get("/console/tenants/")
    acme = response.context["tree"][0]
    assert [(q.flavor, q.guaranteed) for q in acme.quotas] == [("nvidia-h100-80g", 4000)]
    assert "nvidia-h100-80g: 0 / 4" in response.content.decode()
