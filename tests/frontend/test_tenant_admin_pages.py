"""Changing the tenant tree and quotas in the console: create, rename, move, delete, set a quota — with the
API's rules (system admins everywhere, tenant admins inside their subtree) and the services' messages."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tenants.models import MembershipRole, PlatformRole, Quota, Tenant
from tenants.services.quotas import quota_set
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user
from tests.tenants.conftest import audited

pytestmark = pytest.mark.django_db


@pytest.fixture
def tree():
    acme = make_tenant("acme")
    research = make_tenant("research", parent=acme)
    vision = make_tenant("vision", parent=research)
    globex = make_tenant("globex")
    return {"acme": acme, "research": research, "vision": vision, "globex": globex}


@pytest.fixture
def sysadmin(client):
    client.force_login(make_user("root", platform_role=PlatformRole.SYSTEM_ADMIN))
    return client


def _parent_labels(response) -> dict[str, str]:
    return dict(response.context["form"].fields["parent"].choices)


def test_system_admin_creates_a_tenant_under_a_parent_chosen_by_name(sysadmin, tree):
    labels = _parent_labels(sysadmin.get("/console/tenants/new/"))
    assert labels[""] == "— top level —"
    assert labels[str(tree["vision"].pk)] == "Acme / Research / Vision (vision)"
    response = sysadmin.post(
        "/console/tenants/new/", {"name": "NLP", "slug": "nlp", "kind": "team", "parent": tree["research"].pk}
    )
    nlp = Tenant.objects.get(slug="nlp")
    assert response["Location"] == f"/console/tenants/{nlp.pk}/"
    assert nlp.parent == tree["research"] and nlp.depth == 3
    assert audited("tenant.create")[-1]["actor_username"] == "root"


def test_system_admin_creates_a_top_level_tenant(sysadmin, tree):
    sysadmin.post("/console/tenants/new/", {"name": "Initech", "slug": "initech", "kind": "company", "parent": ""})
    assert Tenant.objects.get(slug="initech").parent is None


def test_creation_refusals_appear_at_the_field(sysadmin, tree):
    taken = sysadmin.post("/console/tenants/new/", {"name": "Other", "slug": "acme", "kind": "team", "parent": ""})
    assert taken.context["form"].errors["slug"] == ["A tenant with slug 'acme' already exists."]
    sibling = sysadmin.post(
        "/console/tenants/new/", {"name": "vision", "slug": "v2", "kind": "team", "parent": tree["research"].pk}
    )
    assert "already exists under 'research'" in sibling.context["form"].errors["name"][0]
    deep = make_tenant("deep", parent=tree["vision"])
    too_deep = sysadmin.post(
        "/console/tenants/new/", {"name": "Deeper", "slug": "deeper", "kind": "team", "parent": deep.pk}
    )
    assert "the tree allows at most 4 levels" in too_deep.context["form"].errors["parent"][0]


def test_system_admin_moves_a_tenant_and_the_move_is_audited(sysadmin, tree):
    vision = tree["vision"]
    page = sysadmin.get(f"/console/tenants/{vision.pk}/edit/")
    # Its own subtree is not offered as a new parent (a cycle).
    assert str(vision.pk) not in _parent_labels(page)
    response = sysadmin.post(
        f"/console/tenants/{vision.pk}/edit/",
        {"name": "Vision", "kind": "team", "description": "", "parent": tree["globex"].pk},
    )
    vision.refresh_from_db()
    assert response.status_code == 302 and vision.parent == tree["globex"] and vision.depth == 2
    [event] = audited("tenant.move")
    assert event["details"]["before"]["parent"] == "research" and event["details"]["after"]["parent"] == "globex"


def test_moving_under_its_own_subtree_is_refused(sysadmin, tree):
    response = sysadmin.post(
        f"/console/tenants/{tree['acme'].pk}/edit/",
        {"name": "Acme", "kind": "company", "description": "", "parent": tree["vision"].pk},
    )
    assert response.context["form"].errors["parent"]
    tree["acme"].refresh_from_db()
    assert tree["acme"].parent is None


def test_tenant_admin_works_inside_their_subtree_only(client, tree):
    client.force_login(make_member(tree["research"], role=MembershipRole.TENANT_ADMIN))
    labels = _parent_labels(client.get("/console/tenants/new/"))
    assert set(labels) == {str(tree["research"].pk), str(tree["vision"].pk)}  # no top level, no globex
    client.post("/console/tenants/new/", {"name": "NLP", "slug": "nlp", "kind": "team", "parent": tree["research"].pk})
    assert Tenant.objects.get(slug="nlp").parent == tree["research"]
    outside = client.post("/console/tenants/new/", {"name": "X", "slug": "x", "kind": "team", "parent": ""})
    assert outside.context["form"].non_field_errors() == ["Only a system admin may create a top-level tenant."]
    assert not Tenant.objects.filter(slug="x").exists()

    # research itself may be renamed but not moved (that needs rights on acme); vision may be moved.
    own = client.get(f"/console/tenants/{tree['research'].pk}/edit/")
    assert own.status_code == 200 and "parent" not in own.context["form"].fields
    assert "Moving this tenant needs tenant admin rights on its parent tenant." in own.content.decode()
    assert "parent" in client.get(f"/console/tenants/{tree['vision'].pk}/edit/").context["form"].fields
    assert client.get(f"/console/tenants/{tree['globex'].pk}/edit/").status_code == 404
    assert client.get(f"/console/tenants/{tree['research'].pk}/quotas/").status_code == 404


def test_members_change_nothing_in_the_tree(client, tree):
    client.force_login(make_member(tree["research"]))
    assert client.get("/console/tenants/new/").status_code == 404
    assert client.get(f"/console/tenants/{tree['vision'].pk}/edit/").status_code == 404
    assert client.post(f"/console/tenants/{tree['vision'].pk}/delete/").status_code == 404
    page = client.get(f"/console/tenants/{tree['research'].pk}/").content.decode()
    assert "/edit/" not in page and "/console/tenants/new/" not in page


def test_an_empty_tenant_is_deleted_and_a_busy_one_is_refused_with_the_reason(sysadmin, tree):
    refused = sysadmin.post(f"/console/tenants/{tree['research'].pk}/delete/", follow=True).content.decode()
    assert "has child tenants; move or delete them first" in refused
    done = sysadmin.post(f"/console/tenants/{tree['vision'].pk}/delete/")
    assert done["Location"] == f"/console/tenants/{tree['research'].pk}/"
    assert not Tenant.objects.filter(slug="vision").exists()
    assert audited("tenant.delete")[-1]["actor_username"] == "root"


def test_system_admin_sets_a_quota_from_the_tenant_page(sysadmin, tree):
    flavor = make_flavor()
    make_node(devices=8, flavor=flavor)
    detail = sysadmin.get(f"/console/tenants/{tree['acme'].pk}/").content.decode()
    assert f'href="/console/tenants/{tree["acme"].pk}/quotas/"' in detail
    response = sysadmin.post(
        f"/console/tenants/{tree['acme'].pk}/quotas/",
        {"q-flavor": flavor.name, "q-guaranteed_cards": "4", "q-limit_cards": "6.5", "q-guaranteed_memory_gib": "0"},
    )
    assert response.status_code == 302
    quota = Quota.objects.get(tenant=tree["acme"], flavor=flavor)
    assert (quota.guaranteed_millis, quota.limit_millis, quota.lending_limit_millis) == (4000, 6500, None)
    assert audited("quota.create")[-1]["actor_username"] == "root"
    # The form opens on the values now in force.
    form = sysadmin.get(response["Location"]).context["form"]
    assert form.initial["guaranteed_cards"] == 4 and form.initial["limit_cards"] == 6.5


def test_a_bad_quota_shows_the_services_message_at_the_field(sysadmin, tree):
    flavor = make_flavor()
    make_node(devices=8, flavor=flavor)
    url = f"/console/tenants/{tree['acme'].pk}/quotas/"
    below = sysadmin.post(
        url, {"q-flavor": flavor.name, "q-guaranteed_cards": "4", "q-limit_cards": "2", "q-guaranteed_memory_gib": "0"}
    )
    assert below.status_code == 200
    [message] = below.context["form"].errors["limit_cards"]
    assert "limit_millis 2000 is below guaranteed_millis 4000" in message
    assert 'data-field-error="limit_cards"' in below.content.decode()

    quota_set(actor=None, tenant=tree["acme"], flavor=flavor, values={"guaranteed_millis": 2000})
    over_parent = sysadmin.post(
        f"/console/tenants/{tree['research'].pk}/quotas/",
        {"q-flavor": flavor.name, "q-guaranteed_cards": "3", "q-guaranteed_memory_gib": "0"},
    )
    [message] = over_parent.context["form"].errors["guaranteed_cards"]
    assert "the guarantees under acme add up to 3000 millis" in message
    assert not Quota.objects.filter(tenant=tree["research"]).exists()


def test_the_services_quota_messages_read_in_chinese(sysadmin, tree):
    flavor = make_flavor()
    make_node(devices=8, flavor=flavor)
    zh = {"HTTP_ACCEPT_LANGUAGE": "zh-hans"}
    below = sysadmin.post(
        f"/console/tenants/{tree['acme'].pk}/quotas/",
        {"q-flavor": flavor.name, "q-guaranteed_cards": "4", "q-limit_cards": "2", "q-guaranteed_memory_gib": "0"},
        **zh,
    )
    [message] = below.context["form"].errors["limit_cards"]
    assert message == f"配额 acme/{flavor.name}：上限 2000 毫卡低于保障 4000 毫卡；上限不得低于保障。"  # noqa: RUF001

    quota_set(actor=None, tenant=tree["acme"], flavor=flavor, values={"guaranteed_millis": 2000})
    over_parent = sysadmin.post(
        f"/console/tenants/{tree['research'].pk}/quotas/",
        {"q-flavor": flavor.name, "q-guaranteed_cards": "3", "q-guaranteed_memory_gib": "0"},
        **zh,
    )
    [message] = over_parent.context["form"].errors["guaranteed_cards"]
    assert message.startswith(f"{flavor.name} 的配额：acme 下各租户的保障合计 3000 毫卡（")  # noqa: RUF001
    assert "guarantee" not in message


def test_system_admin_is_told_why_they_cannot_submit_as_the_api_says(sysadmin, tree):
    flavor = make_flavor()
    page = sysadmin.get("/console/jobs/submit/")
    assert page.status_code == 403
    assert "submits no work (separation of duties)" in page.content.decode()
    api = APIClient()
    api.force_authenticate(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    spec = {"name": "j", "tenant": "acme", "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]}
    assert api.post("/api/v1/jobs/", spec, format="json").status_code == 403
