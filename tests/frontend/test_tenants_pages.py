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
    assert client.get(f"/console/tenants/{tree['vision'].pk}/").status_code == 200
    assert client.get(f"/console/tenants/{tree['globex'].pk}/").status_code == 404
    assert client.get(f"/console/tenants/{tree['acme'].pk}/").status_code == 404


def test_tenant_page_lists_members_and_sub_tenants(client, tree):
    bob = make_member(tree["research"], username="bob")
    client.force_login(bob)
    page = client.get(f"/console/tenants/{tree['research'].pk}/").content.decode()
    assert "bob" in page and "Vision" in page


def test_auditor_has_no_tenant_pages(client, tree):
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    assert client.get("/console/tenants/").status_code == 404
