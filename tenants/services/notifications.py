"""Notifications about approval requests (and other news for one user, ``notification_queue``): who to tell,
queueing one delivery per notifier, sending and retrying them.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone, translation

from audit.services import audit_record
from kernel.access_rules import Action
from kernel.api import ConflictError
from kernel.messages import localize
from kernel.task_queue import task_queue
from tenants import messages as tenants_messages
from tenants.access import allows
from tenants.approval_chain import eligible_approvers
from tenants.models import ApprovalKind, DeliveryStatus, NotificationDelivery, User
from tenants.services.guards import ensure_may_write, require_permission

logger = logging.getLogger(__name__)


def approvers_for(approval: Any) -> list[User]:
    """Who can take the decision ``approval`` waits for (for notifications)."""
    role = approval.awaiting_role
    if role is None:
        return []
    return eligible_approvers(role, approval.tenant, approval.requester_id)


def _notify(approval: Any | None, *, event: str, recipients: list[User], subject: str, body: str) -> None:
    """Queue one delivery per configured notifier and language of the recipients (each person reads it in the
    language their console shows, ``User.language``; a catalogue message is rendered in it); sent by a Celery
    task after commit (retried on failure)."""
    paths = getattr(settings, "GPUPOOL_NOTIFIERS", None) or []
    if not paths:
        return
    for language, readers in recipients_by_language(recipients).items():
        with translation.override(language):
            shown_subject, shown_body = localize(subject), localize(body)
        for path in paths:
            delivery = NotificationDelivery.objects.create(
                approval=approval,
                event=event,
                notifier=path,
                recipients=[{"username": user.username, "email": user.email} for user in readers],
                subject=shown_subject[:200],
                body=shown_body,
            )
            transaction.on_commit(lambda pk=delivery.pk: _enqueue_delivery(pk))


def recipients_by_language(recipients: list[User]) -> dict[str, list[User]]:
    """The recipients grouped by the language they read (their own, else the platform's), in first-seen order;
    no recipient at all is one group in the platform's language (a notifier may tell a channel)."""
    groups: dict[str, list[User]] = {}
    for user in recipients:
        groups.setdefault(user.language or settings.LANGUAGE_CODE, []).append(user)
    return groups or {settings.LANGUAGE_CODE: []}


def notification_queue(*, event: str, recipients: list[User], subject: str, body: str) -> None:
    """Tell ``recipients`` something that is not about an approval (``job.never_fits``: a queued job can no longer
    ever start), through every configured notifier, as approvals are; call it inside the caller's transaction.
    ``subject`` and ``body`` are catalogue messages (each recipient reads them in their language) or text."""
    if recipients:
        _notify(None, event=event, recipients=recipients, subject=subject, body=body)


def _enqueue_delivery(delivery_id: int) -> None:
    # By name: ``tenants.tasks`` imports this module, so importing it back would make a circle.
    task_queue("tenants.deliver_notification", args=(delivery_id,))


def _describe(approval: Any) -> str:
    if approval.kind == ApprovalKind.QUOTA_CHANGE:
        values = ", ".join(f"{key}={value}" for key, value in approval.payload.items())
        return tenants_messages.QUOTA_CHANGE(where=f"{approval.tenant.slug}/{approval.flavor.name}", values=values)
    return tenants_messages.ADMISSION_JOB(
        pk=approval.job_id, tenant=approval.tenant.slug, summary=approval.payload.get("summary", "")
    )


def notify_approvers(approval: Any) -> None:
    role = approval.awaiting_role
    _notify(
        approval,
        event="approval.awaiting",
        recipients=approvers_for(approval),
        subject=tenants_messages.GPUPOOL_APPROVAL_NEEDED(kind=approval.kind, pk=approval.pk),
        body=tenants_messages.REQUESTED_WAITING_REASON(
            what=_describe(approval),
            requester=getattr(approval.requester, "username", "system"),
            role=role.replace("_", " "),
            reason=approval.reason or "-",
        ),
    )


def notify_requester(approval: Any, *, comment: str) -> None:
    if approval.requester is None:
        return
    _notify(
        approval,
        event=f"approval.{approval.status}",
        recipients=[approval.requester],
        subject=tenants_messages.GPUPOOL(kind=approval.kind, pk=approval.pk, status=approval.status),
        body=tenants_messages.STATUS_COMMENT(
            what=_describe(approval), status=approval.status, result=approval.result_message, comment=comment or "-"
        ),
    )


# --- notifications -----------------------------------------------------------------------------------------

NOTIFICATION_MAX_ATTEMPTS = 5


def notification_deliver(*, delivery: Any) -> bool:
    """Try to send one delivery through its notifier; record the attempt. Returns True when sent."""
    from django.utils.module_loading import import_string

    with transaction.atomic():
        delivery = NotificationDelivery.objects.select_for_update(no_key=True).get(pk=delivery.pk)
        if delivery.status in (DeliveryStatus.SENT, DeliveryStatus.FAILED):
            return delivery.status == DeliveryStatus.SENT
        delivery.attempts += 1
        delivery.save(update_fields=["attempts", "updated_at"])
    error = ""
    try:
        import_string(delivery.notifier)().send(delivery)
    except Exception as exc:  # a notifier may fail in any way; the attempt is recorded, never raised
        error = f"{type(exc).__name__}: {exc}"[:2000]
        logger.warning(
            "notification %s via %s failed (attempt %s): %s", delivery.pk, delivery.notifier, delivery.attempts, error
        )
    with transaction.atomic():
        if error:
            delivery.last_error = error
            delivery.status = (
                DeliveryStatus.FAILED if delivery.attempts >= NOTIFICATION_MAX_ATTEMPTS else DeliveryStatus.RETRYING
            )
            if delivery.status == DeliveryStatus.FAILED:
                audit_record(
                    action="notification.failed",
                    actor=None,
                    tenant=delivery.approval.tenant if delivery.approval_id else None,
                    target=f"notification:{delivery.pk}",
                    outcome="failure",
                    details={"notifier": delivery.notifier, "attempts": delivery.attempts, "error": error},
                )
        else:
            delivery.status = DeliveryStatus.SENT
            delivery.sent_at = timezone.now()
            delivery.last_error = ""
        delivery.save(update_fields=["status", "last_error", "sent_at", "updated_at"])
    return not error


@transaction.atomic
def notification_retry(*, actor: User | None, delivery: Any, request: Any = None) -> Any:
    """Send a failed delivery again (admins, from the API), with a fresh attempt budget."""
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            allows(actor, Action.NOTIFICATION_RETRY), tenants_messages.ONLY_PLATFORM_ADMINS_RETRY_NOTIFICATIONS()
        )
    delivery = NotificationDelivery.objects.select_for_update(no_key=True).get(pk=delivery.pk)
    if delivery.status == DeliveryStatus.SENT:
        raise ConflictError(tenants_messages.NOTIFICATION_ALREADY_SENT(pk=delivery.pk), code="already_sent")
    delivery.status = DeliveryStatus.PENDING
    delivery.attempts = 0
    delivery.save(update_fields=["status", "attempts", "updated_at"])
    audit_record(action="notification.retry", actor=actor, target=f"notification:{delivery.pk}", request=request)
    transaction.on_commit(lambda: _enqueue_delivery(delivery.pk))
    return delivery
