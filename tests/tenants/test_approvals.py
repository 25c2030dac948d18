"""The approval workflow: quota changes (tenant admin → parent tenant admin → system admin) and job
admissions, their notifications, expiry, and the serialisation of concurrent final approvals."""

from __future__ import annotations

import datetime as dt
import json
import threading

import pytest
from django.core import mail
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from kernel.api import ConflictError, DomainError, PermissionDeniedError
from scheduler.models import JobState
from tenants import notifiers
from tenants.models import ApprovalStatus, DeliveryStatus, MembershipRole, NotificationDelivery, Quota
from tenants.selectors import approvals_awaiting
from tenants.services.admissions import (
    job_admission_needs_approval,
    job_admission_request_create,
    tenant_set_job_approval_threshold,
)
from tenants.services.approvals import (
    approval_approve,
    approval_cancel,
    approval_reject,
    approval_request_changes,
    approval_resubmit,
    approvals_expire,
    quota_change_request_create,
)
from tenants.services.notifications import notification_deliver
from tenants.services.quotas import quota_set
from tests.factories import MembershipFactory, SystemAdminFactory, UserFactory
from tests.scheduler.factories import FlavorFactory, JobFactory
from tests.tenants.conftest import audited

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup(world):
    """acme has 8 cards, research 6 (vision 2, nlp 2). vision has its own tenant admin; acme too."""
    flavor = FlavorFactory()
    quota_set(actor=None, tenant=world.acme, flavor=flavor, values={"guaranteed_millis": 8000})
    quota_set(actor=None, tenant=world.research, flavor=flavor, values={"guaranteed_millis": 6000})
    quota_set(actor=None, tenant=world.vision, flavor=flavor, values={"guaranteed_millis": 2000})
    quota_set(actor=None, tenant=world.nlp, flavor=flavor, values={"guaranteed_millis": 2000})
    vision_admin = UserFactory(username="vadmin")
    MembershipFactory(user=vision_admin, tenant=world.vision, role=MembershipRole.TENANT_ADMIN)
    world.users["vision_admin"] = vision_admin
    return flavor


def _request(world, flavor, millis: int = 3000, tenant=None):
    return quota_change_request_create(
        actor=world.users["vision_admin"],
        tenant=tenant or world.vision,
        flavor=flavor,
        values={"guaranteed_millis": millis},
        reason="new project",
    )


def test_quota_change_goes_through_parent_admin_then_system_admin(world, setup):
    approval = _request(world, setup)
    assert approval.chain == ["parent_tenant_admin", "system_admin"]
    assert approvals_awaiting(world.users["tenant_admin"]) == [approval]
    assert approvals_awaiting(world.users["system_admin"]) == []
    with pytest.raises(DomainError, match="must say why"):
        # Not the system admin's step yet: deciding it anyway is an override, which needs a comment.
        approval_approve(actor=world.users["system_admin"], approval=approval)
    with pytest.raises(PermissionDeniedError):
        approval_approve(actor=world.users["member"], approval=approval)

    approval = approval_approve(actor=world.users["tenant_admin"], approval=approval, comment="ok for research")
    assert approval.status == ApprovalStatus.PENDING and approval.step == 1
    assert Quota.objects.get(tenant=world.vision).guaranteed_millis == 2000  # nothing applied yet

    approval = approval_approve(actor=world.users["system_admin"], approval=approval, comment="fine")
    assert approval.status == ApprovalStatus.APPROVED
    assert Quota.objects.get(tenant=world.vision).guaranteed_millis == 3000
    assert [e["details"]["final"] for e in audited("quota_request.approve")] == [False, True]
    assert audited("quota.update")[0]["details"]["after"]["guaranteed_millis"] == 3000
    assert [step.decision for step in approval.steps.all()] == ["approve", "approve"]


def test_requester_cannot_approve_own_request(world, setup):
    # research's admin requests for research itself; the parent step belongs to acme's admins.
    approval = quota_change_request_create(
        actor=world.users["tenant_admin"], tenant=world.nlp, flavor=setup, values={"guaranteed_millis": 1000}
    )
    with pytest.raises(PermissionDeniedError, match="own request"):
        approval_approve(actor=world.users["tenant_admin"], approval=approval)


def test_member_cannot_request_quota(world, setup):
    with pytest.raises(PermissionDeniedError):
        quota_change_request_create(
            actor=world.users["member"], tenant=world.vision, flavor=setup, values={"guaranteed_millis": 1000}
        )


def test_request_that_cannot_fit_is_refused_at_once(world, setup):
    with pytest.raises(DomainError, match="add up to 7000"):
        _request(world, setup, millis=5000)


def test_reject_needs_a_comment_and_closes_the_request(world, setup):
    approval = _request(world, setup)
    with pytest.raises(DomainError, match="why"):
        approval_reject(actor=world.users["tenant_admin"], approval=approval, comment=" ")
    approval = approval_reject(actor=world.users["tenant_admin"], approval=approval, comment="no budget")
    assert approval.status == ApprovalStatus.REJECTED
    with pytest.raises(ConflictError):
        approval_approve(actor=world.users["system_admin"], approval=approval)
    assert audited("quota_request.reject")[0]["details"]["comment"] == "no budget"


def test_request_changes_then_resubmit_restarts_the_chain(world, setup):
    approval = _request(world, setup, millis=4000)
    approval = approval_approve(actor=world.users["tenant_admin"], approval=approval)
    approval = approval_request_changes(actor=world.users["system_admin"], approval=approval, comment="ask for 3")
    assert approval.status == ApprovalStatus.CHANGES_REQUESTED
    with pytest.raises(PermissionDeniedError):
        approval_resubmit(actor=world.users["tenant_admin"], approval=approval, values={"guaranteed_millis": 3000})
    approval = approval_resubmit(
        actor=world.users["vision_admin"], approval=approval, values={"guaranteed_millis": 3000}
    )
    assert approval.status == ApprovalStatus.PENDING and approval.step == 0
    assert approval.payload["guaranteed_millis"] == 3000


def test_final_approval_that_no_longer_fits_fails_without_change(world, setup):
    approval = _request(world, setup, millis=4000)  # 4000 + 2000 = research's 6000: fits now
    approval = approval_approve(actor=world.users["tenant_admin"], approval=approval)
    quota_set(actor=None, tenant=world.nlp, flavor=setup, values={"guaranteed_millis": 2500})  # meanwhile
    approval = approval_approve(actor=world.users["system_admin"], approval=approval)
    assert approval.status == ApprovalStatus.FAILED
    assert "no longer fits" in approval.result_message and "6500" in approval.result_message
    assert Quota.objects.get(tenant=world.vision).guaranteed_millis == 2000
    assert audited("quota_request.fail")


def test_cancel_by_requester(world, setup):
    approval = _request(world, setup)
    with pytest.raises(PermissionDeniedError):
        approval_cancel(actor=world.users["member"], approval=approval)
    approval = approval_cancel(actor=world.users["vision_admin"], approval=approval)
    assert approval.status == ApprovalStatus.CANCELLED


def test_open_requests_expire(world, setup):
    approval = _request(world, setup)
    assert approvals_expire(now=timezone.now() + dt.timedelta(hours=71)) == 0
    assert approvals_expire(now=timezone.now() + dt.timedelta(hours=73)) == 1
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.EXPIRED
    assert audited("quota_request.expire")


@override_settings(GPUPOOL_APPROVAL_CHAINS={"quota_change": ["system_admin"], "job_admission": ["system_admin"]})
def test_chain_is_configurable(world, setup):
    approval = _request(world, setup)
    assert approval.chain == ["system_admin"]
    assert approval_approve(actor=world.users["system_admin"], approval=approval).status == ApprovalStatus.APPROVED


def test_top_level_tenant_skips_the_parent_step(world, setup):
    acme_admin = UserFactory(username="acmeadmin")
    MembershipFactory(user=acme_admin, tenant=world.acme, role=MembershipRole.TENANT_ADMIN)
    approval = quota_change_request_create(
        actor=acme_admin, tenant=world.acme, flavor=setup, values={"guaranteed_millis": 9000}
    )
    assert approval.chain == ["system_admin"]


# --- notifications ----------------------------------------------------------------------------------------


def test_approvers_are_notified_by_email(world, setup, django_capture_on_commit_callbacks):
    world.users["tenant_admin"].email = "radmin@example.com"
    world.users["tenant_admin"].save()
    with django_capture_on_commit_callbacks(execute=False):
        approval = _request(world, setup)
    delivery = NotificationDelivery.objects.get(approval=approval)
    assert delivery.recipients[0]["username"] == "radmin"
    assert notification_deliver(delivery=delivery) is True
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.SENT and delivery.attempts == 1
    assert mail.outbox[-1].to == ["radmin@example.com"]
    assert "quota change for acme-vision" in mail.outbox[-1].body


def test_each_person_is_notified_in_the_language_their_console_shows(
    world, setup, client, django_capture_on_commit_callbacks
):
    """The language menu remembers a signed-in person's choice; the approvers' notification is written once per
    language, the Chinese reader's from the same catalogue messages as the English one."""
    radmin = world.users["tenant_admin"]
    client.force_login(radmin)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/"})
    radmin.refresh_from_db()
    assert radmin.language == "zh-hans"
    second = UserFactory(username="radmin2")
    MembershipFactory(user=second, tenant=world.research, role=MembershipRole.TENANT_ADMIN)
    with django_capture_on_commit_callbacks(execute=False):
        approval = _request(world, setup)
    deliveries = {
        tuple(r["username"] for r in d.recipients): d for d in NotificationDelivery.objects.filter(approval=approval)
    }
    assert set(deliveries) == {("radmin",), ("radmin2",)}
    english, chinese = deliveries[("radmin2",)], deliveries[("radmin",)]
    assert english.subject == f"[gpupool] Approval needed: quota_change #{approval.pk}".replace(
        "quota_change", "quota change"
    )
    assert "Requested by vadmin" in english.body and "quota change for acme-vision" in english.body
    assert chinese.subject == f"[gpupool] 待审批\uff1a配额变更 #{approval.pk}"
    assert "申请人 vadmin" in chinese.body and "的配额变更" in chinese.body
    assert "Requested by" not in chinese.body


def test_an_unknown_language_is_refused():
    from tenants.services.identity import user_language_set

    with pytest.raises(DomainError, match="Unknown language 'xx'"):
        user_language_set(user=UserFactory(), language="xx")


class BrokenNotifier:
    def send(self, delivery):
        raise ConnectionError("robot unreachable")


@override_settings(GPUPOOL_NOTIFIERS=["tests.tenants.test_approvals.BrokenNotifier"])
def test_failed_deliveries_are_retried_then_marked_failed(world, setup, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        _request(world, setup)
    delivery = NotificationDelivery.objects.get()
    for attempt in range(1, 6):
        assert notification_deliver(delivery=delivery) is False
        delivery.refresh_from_db()
        assert delivery.attempts == attempt
    assert delivery.status == DeliveryStatus.FAILED
    assert "robot unreachable" in delivery.last_error
    assert audited("notification.failed")[0]["outcome"] == "failure"


def test_webhook_body_is_signed_with_hmac_sha256(world, setup, monkeypatch, settings):
    settings.GPUPOOL_NOTIFY_WEBHOOK_URL = "http://127.0.0.1:9/hook"
    settings.GPUPOOL_NOTIFY_WEBHOOK_SECRET = "s3cret"
    sent = {}

    def fake_post(url, payload, headers=None):
        sent.update(url=url, payload=payload, headers=headers)
        return b"{}"

    monkeypatch.setattr(notifiers, "_post_json", fake_post)
    delivery = NotificationDelivery(event="approval.awaiting", subject="s", body="b", recipients=[])
    notifiers.WebhookNotifier().send(delivery)
    body = json.dumps(sent["payload"], ensure_ascii=False, sort_keys=True).encode()
    assert sent["headers"]["X-Gpupool-Signature"] == notifiers.sign(body, "s3cret")
    assert sent["headers"]["X-Gpupool-Signature"].startswith("sha256=")


def test_chat_robot_message_formats():
    delivery = NotificationDelivery(event="e", subject="Approval needed", body="details")
    assert notifiers.dingtalk_message(delivery) == {"msgtype": "text", "text": {"content": "Approval needed\ndetails"}}
    assert notifiers.wecom_message(delivery)["msgtype"] == "text"
    assert notifiers.feishu_message(delivery) == {"msg_type": "text", "content": {"text": "Approval needed\ndetails"}}


# --- job admission ----------------------------------------------------------------------------------------


def test_job_admission_rules(world, settings):
    settings.GPUPOOL_JOB_APPROVAL_THRESHOLD_MILLIS = None
    assert job_admission_needs_approval(tenant=world.vision, total_millis=1, critical=True)
    assert not job_admission_needs_approval(tenant=world.vision, total_millis=64000, critical=False)
    tenant_set_job_approval_threshold(actor=None, tenant=world.research, threshold_millis=4000)
    assert job_admission_needs_approval(tenant=world.vision, total_millis=4100, critical=False)  # inherited
    assert not job_admission_needs_approval(tenant=world.vision, total_millis=4000, critical=False)
    settings.GPUPOOL_JOB_APPROVAL_THRESHOLD_MILLIS = 1000
    assert job_admission_needs_approval(tenant=world.globex, total_millis=2000, critical=False)


def test_approved_job_is_released_and_rejected_job_fails(world):
    member = world.users["member"]
    jobs = [JobFactory(tenant=world.vision, submitter=member, state=JobState.PENDING_APPROVAL) for _ in range(2)]
    approvals = [job_admission_request_create(job=job, actor=member) for job in jobs]
    assert approvals[0].chain == ["tenant_admin", "system_admin"]
    approval = approval_approve(actor=world.users["tenant_admin"], approval=approvals[0])
    approval = approval_approve(actor=world.users["system_admin"], approval=approval)
    assert approval.status == ApprovalStatus.APPROVED
    jobs[0].refresh_from_db()
    assert jobs[0].state == JobState.QUEUED
    approval_reject(actor=world.users["tenant_admin"], approval=approvals[1], comment="too big")
    jobs[1].refresh_from_db()
    assert jobs[1].state == JobState.FAILED and "too big" in jobs[1].state_message
    with pytest.raises(DomainError):
        approval_request_changes(actor=world.users["system_admin"], approval=approvals[1], comment="x")


# --- concurrency ------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_final_approvals_that_together_overflow_the_parent_are_serialised(postgres, world, settings):
    """vision and nlp each ask for +1 card; research has room for only one more. Two threads approve the
    final steps at the same moment on two connections: exactly one is applied."""
    settings.GPUPOOL_APPROVAL_CHAINS = {"quota_change": ["system_admin"], "job_admission": ["system_admin"]}
    flavor = FlavorFactory()
    quota_set(actor=None, tenant=world.research, flavor=flavor, values={"guaranteed_millis": 5000})
    quota_set(actor=None, tenant=world.vision, flavor=flavor, values={"guaranteed_millis": 2000})
    quota_set(actor=None, tenant=world.nlp, flavor=flavor, values={"guaranteed_millis": 2000})
    admin = world.users["tenant_admin"]
    requests = [
        quota_change_request_create(actor=admin, tenant=tenant, flavor=flavor, values={"guaranteed_millis": 3000})
        for tenant in (world.vision, world.nlp)
    ]
    system_admins = [world.users["system_admin"], SystemAdminFactory(username="sys2")]
    barrier = threading.Barrier(2)
    results: list = [None, None]

    def approve(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = approval_approve(actor=system_admins[index], approval=requests[index]).status
        except Exception as exc:  # surfaced by the assertion below
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=approve, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(map(str, results)) == [ApprovalStatus.APPROVED, ApprovalStatus.FAILED], results
    total = sum(
        Quota.objects.filter(tenant__in=[world.vision, world.nlp], flavor=flavor).values_list(
            "guaranteed_millis", flat=True
        )
    )
    assert total == 5000


def test_critical_job_submitted_through_the_scheduler_waits_in_the_inbox_until_approved(world):
    from scheduler.services.jobs import job_submit

    FlavorFactory()
    spec = {
        "name": "urgent",
        "tenant": "acme-vision",
        "priority_class": "critical",
        "resources": {"flavors": ["sim-80g"], "gpus": 1},
        "command": ["python", "train.py"],
    }
    job = job_submit(actor=world.users["member"], spec=spec)
    assert job.state == JobState.PENDING_APPROVAL
    [approval] = approvals_awaiting(world.users["tenant_admin"])
    assert approval.job_id == job.pk and approval.requester == world.users["member"]
    approval = approval_approve(actor=world.users["tenant_admin"], approval=approval)
    approval_approve(actor=world.users["system_admin"], approval=approval)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert [e["details"]["final"] for e in audited("approval.approve")] == [False, True]
