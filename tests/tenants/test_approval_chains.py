"""Approval chains that can always finish (issue 20, item 1): a step nobody but the requester could decide is
passed over, the chain names who decides when the request is sent, and a system admin may decide any open step
with a comment, audited as an override."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.urls import reverse

from kernel.api import DomainError, PermissionDeniedError
from tenants.models import ApprovalStatus, MembershipRole, Quota
from tenants.selectors import approvals_awaiting, approvals_overridable
from tenants.services.admissions import job_admission_request_create
from tenants.services.approvals import approval_approve, approval_reject, quota_change_request_create
from tenants.services.quotas import quota_set
from tests.factories import ApiTokenFactory, MembershipFactory, SystemAdminFactory, UserFactory, bearer
from tests.scheduler.factories import FlavorFactory, JobFactory
from tests.tenants.conftest import audited

pytestmark = pytest.mark.django_db


@pytest.fixture
def flavor(world):
    flavor = FlavorFactory()
    quota_set(actor=None, tenant=world.acme, flavor=flavor, values={"guaranteed_millis": 8000})
    quota_set(actor=None, tenant=world.research, flavor=flavor, values={"guaranteed_millis": 4000})
    return flavor


def _demo_request(world, flavor):
    """The demo's case: radmin (alice) administers acme/research and asks for research itself; acme, the parent,
    has no tenant admin at all."""
    return quota_change_request_create(
        actor=world.users["tenant_admin"], tenant=world.research, flavor=flavor, values={"guaranteed_millis": 6000}
    )


def test_a_step_nobody_else_can_decide_is_passed_over_to_the_system_admins(world, flavor):
    approval = _demo_request(world, flavor)

    assert approval.chain == ["system_admin"]
    assert approval.escalations == [
        {"role": "parent_tenant_admin", "reason": "nobody but the requester holds this role"}
    ]
    assert approvals_awaiting(world.users["system_admin"]) == [approval]
    approval = approval_approve(actor=world.users["system_admin"], approval=approval, comment="ok")
    assert approval.status == ApprovalStatus.APPROVED
    assert Quota.objects.get(tenant=world.research, flavor=flavor).guaranteed_millis == 6000
    assert audited("quota_request.create")[0]["details"]["escalations"][0]["role"] == "parent_tenant_admin"


def test_a_step_someone_else_holds_is_kept_and_the_plan_names_them(world, flavor):
    acme_admin = UserFactory(username="acmeadmin")
    MembershipFactory(user=acme_admin, tenant=world.acme, role=MembershipRole.TENANT_ADMIN)

    approval = _demo_request(world, flavor)

    assert approval.chain == ["parent_tenant_admin", "system_admin"]
    assert approval.escalations == []
    from tenants.approval_chain import chain_plan

    plan = chain_plan(approval)
    assert [(step["role"], step["state"], step["approvers"]) for step in plan] == [
        ("parent_tenant_admin", "awaiting", ["acmeadmin"]),
        ("system_admin", "upcoming", ["sys"]),
    ]


def test_a_later_step_whose_only_holder_left_is_passed_over_when_the_request_gets_there(world, flavor):
    acme_admin = UserFactory(username="acmeadmin")
    MembershipFactory(user=acme_admin, tenant=world.acme, role=MembershipRole.TENANT_ADMIN)
    with override_settings(
        GPUPOOL_APPROVAL_CHAINS={"quota_change": ["parent_tenant_admin", "system_admin"], "job_admission": []}
    ):
        approval = _demo_request(world, flavor)
    world.users["system_admin"].is_active = False  # the only system admin leaves
    world.users["system_admin"].save()
    other_admin = SystemAdminFactory(username="sys2")

    approval = approval_approve(actor=acme_admin, approval=approval, comment="fine")

    assert approval.status == ApprovalStatus.PENDING and approval.awaiting_role == "system_admin"
    assert approvals_awaiting(other_admin) == [approval]


def test_a_system_admin_may_decide_any_step_with_a_comment_and_it_is_audited(world, flavor):
    acme_admin = UserFactory(username="acmeadmin")
    MembershipFactory(user=acme_admin, tenant=world.acme, role=MembershipRole.TENANT_ADMIN)
    approval = _demo_request(world, flavor)
    system_admin = world.users["system_admin"]
    assert approvals_awaiting(system_admin) == [] and approvals_overridable(system_admin) == [approval]

    with pytest.raises(DomainError, match="must say why"):
        approval_approve(actor=system_admin, approval=approval)
    approval = approval_approve(actor=system_admin, approval=approval, comment="acme's admin is on leave")

    assert approval.step == 1 and approval.awaiting_role == "system_admin"
    event = audited("quota_request.approve")[0]
    assert event["actor_username"] == "sys" and event["details"]["override"] is True
    assert event["details"]["comment"] == "acme's admin is on leave"


def test_the_requester_still_cannot_decide_and_members_cannot_override(world, flavor):
    approval = _demo_request(world, flavor)
    with pytest.raises(PermissionDeniedError):
        approval_approve(actor=world.users["tenant_admin"], approval=approval, comment="me")
    with pytest.raises(PermissionDeniedError):
        approval_reject(actor=world.users["member"], approval=approval, comment="no")


def test_the_only_system_admin_asking_is_told_to_set_the_quota_directly(world, flavor):
    # acme is top level: its chain is the system admins alone, and the only one is asking.
    with pytest.raises(DomainError, match="set the quota directly"):
        quota_change_request_create(
            actor=world.users["system_admin"], tenant=world.acme, flavor=flavor, values={"guaranteed_millis": 9000}
        )


@override_settings(GPUPOOL_APPROVAL_CHAINS={"quota_change": ["system_admin"], "job_admission": ["tenant_admin"]})
def test_a_job_admission_whose_submitter_is_the_only_tenant_admin_goes_to_the_system_admins(world, flavor):
    job = JobFactory(tenant=world.research, submitter=world.users["tenant_admin"])

    approval = job_admission_request_create(job=job, actor=world.users["tenant_admin"])

    assert approval.chain == ["system_admin"] and approval.escalations[0]["role"] == "tenant_admin"


def test_the_api_shows_the_plan_and_lets_the_system_admin_approve_the_demo_request(world, flavor, client):
    token = ApiTokenFactory(user=world.users["tenant_admin"])
    response = client.post(
        "/api/v1/approvals/quota-change/",
        {"tenant": world.research.pk, "flavor": flavor.name, "guaranteed_millis": 6000},
        content_type="application/json",
        headers=bearer(token),
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["plan"] == [{"step": 0, "role": "system_admin", "state": "awaiting", "approvers": ["sys"]}]
    assert body["escalations"][0]["role"] == "parent_tenant_admin"

    admin_token = ApiTokenFactory(user=world.users["system_admin"])
    decided = client.post(
        f"/api/v1/approvals/{body['id']}/approve/",
        {"comment": ""},
        content_type="application/json",
        headers=bearer(admin_token),
    )
    assert decided.status_code == 200, decided.content
    assert decided.json()["status"] == "approved"


def test_the_console_names_who_decides_when_the_request_is_sent(world, flavor, client):
    client.force_login(world.users["tenant_admin"])
    response = client.post(
        reverse("frontend:quota-request", args=[world.research.pk]),
        {"q-flavor": flavor.name, "q-guaranteed_cards": "6", "q-guaranteed_memory_gib": "0", "q-reason": "new project"},
        follow=True,
    )
    text = response.content.decode()
    assert "It will be decided by: system admin (sys)." in text
    assert "Nobody but you holds the role tenant admin of the parent tenant" in text
    assert 'data-testid="approval-escalation"' in text

    client.force_login(world.users["system_admin"])
    inbox = client.get(reverse("frontend:approval-inbox")).content.decode()
    assert "Nothing waits for you." not in inbox
