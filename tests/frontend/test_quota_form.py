"""The quota request form (issue 20, item 4): it opens on the tenant's current values for a flavor the tenant
uses, sends only what changed, the approval page marks the changed rows, and an overcommit warning shows
wherever guarantees exceed the pool's schedulable cards."""

from __future__ import annotations

import pytest

from tenants.models import ApprovalRequest, MembershipRole, PlatformRole
from tenants.services.quotas import quota_set
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def research(db):
    """acme (8 H100s guaranteed, 8 in the pool) > research (4 guaranteed, limit 8), administered by alice; an
    A100 flavor exists with no card in the pool."""
    make_flavor("a100-empty")
    h100 = make_flavor("nvidia-h100-80g")
    make_node("n1", devices=8, flavor=h100)
    acme = make_tenant("acme")
    research = make_tenant("research", parent=acme)
    quota_set(actor=None, tenant=acme, flavor=h100, values={"guaranteed_millis": 8000})
    quota_set(actor=None, tenant=research, flavor=h100, values={"guaranteed_millis": 4000, "limit_millis": 8000})
    alice = make_member(research, role=MembershipRole.TENANT_ADMIN, username="alice")
    make_user("root", platform_role=PlatformRole.SYSTEM_ADMIN)
    return research, alice


def _form_post(response, **changes) -> dict:
    """What the browser sends: every field of the form as shown, with ``changes`` applied."""
    form = response.context["quota_form"]
    data = {f"q-{name}": ("" if value is None else value) for name, value in form.initial.items()}
    data.setdefault("q-reason", "")
    data.update({f"q-{name}": value for name, value in changes.items()})
    return data


def test_the_form_opens_on_the_current_values_of_a_flavor_the_tenant_uses(client, research):
    tenant, alice = research
    client.force_login(alice)
    response = client.get(f"/console/tenants/{tenant.pk}/")
    form = response.context["quota_form"]
    assert response.context["quota_flavor"] == "nvidia-h100-80g"
    assert (form.initial["guaranteed_cards"], form.initial["limit_cards"]) == (4, 8)
    html = response.content.decode()
    assert 'name="q-guaranteed_cards" value="4"' in html and 'name="q-limit_cards" value="8"' in html


def test_a_tenant_without_quota_opens_on_a_flavor_that_has_cards(client, research):
    tenant, _alice = research
    team = make_tenant("team", parent=tenant)
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    assert client.get(f"/console/tenants/{team.pk}/").context["quota_flavor"] == "nvidia-h100-80g"


def test_changing_only_the_guarantee_keeps_the_limit_and_marks_only_that_row(client, research):
    tenant, alice = research
    client.force_login(alice)
    shown = client.get(f"/console/tenants/{tenant.pk}/")

    client.post(f"/console/tenants/{tenant.pk}/quota-request/", _form_post(shown, guaranteed_cards="6"))

    approval = ApprovalRequest.objects.get()
    assert approval.payload["guaranteed_millis"] == 6000
    assert approval.payload["limit_millis"] == 8000  # was sent as "no limit" from an empty form
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    page = client.get(f"/console/approvals/{approval.pk}/").content.decode()
    assert page.count('data-testid="changed-row"') == 1
    changed = page.split('data-testid="changed-row"', 1)[1].split("</tr>", 1)[0]
    assert "Guaranteed (cards)" in changed


def test_sending_the_form_unchanged_is_refused_with_a_message(client, research):
    tenant, alice = research
    client.force_login(alice)
    shown = client.get(f"/console/tenants/{tenant.pk}/")
    response = client.post(f"/console/tenants/{tenant.pk}/quota-request/", _form_post(shown), follow=True)
    assert "Nothing changed" in response.content.decode()
    assert not ApprovalRequest.objects.exists()


def test_guarantees_beyond_the_pool_are_flagged_on_the_overview_tenant_and_approval_pages(client, research):
    tenant, alice = research
    acme = tenant.parent
    quota_set(actor=None, tenant=acme, flavor=make_flavor("nvidia-h100-80g"), values={"guaranteed_millis": 16000})
    admin = make_user(platform_role=PlatformRole.SYSTEM_ADMIN)
    client.force_login(admin)

    overview = client.get("/console/overview/numbers/").content.decode()
    assert "guarantees add up to 16 cards, but the pool has 8 schedulable cards" in overview
    client.force_login(alice)
    assert 'data-testid="overcommit-warning"' in client.get(f"/console/tenants/{tenant.pk}/").content.decode()


def test_the_approval_page_warns_when_approving_would_overcommit(client, research):
    tenant, _alice = research
    acme = tenant.parent
    acme_admin = make_member(acme, role=MembershipRole.TENANT_ADMIN, username="acmeadmin")
    client.force_login(acme_admin)
    shown = client.get(f"/console/tenants/{acme.pk}/")
    client.post(f"/console/tenants/{acme.pk}/quota-request/", _form_post(shown, guaranteed_cards="12"))
    approval = ApprovalRequest.objects.get()

    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    page = client.get(f"/console/approvals/{approval.pk}/").content.decode()
    assert "guarantees add up to 12 cards, but the pool has 8 schedulable cards" in page
