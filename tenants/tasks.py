"""Celery tasks of the tenants app: thin — load, call a service."""

from __future__ import annotations

from celery import shared_task

from tenants.models import DeliveryStatus, NotificationDelivery
from tenants.services.approvals import approvals_expire
from tenants.services.notifications import notification_deliver

RETRY_BASE_SECONDS = 30


@shared_task(name="tenants.deliver_notification", bind=True, acks_late=True, max_retries=10)
def deliver_notification(self, delivery_id: int) -> bool:
    """Send one notification; on failure retry with exponential backoff (30 s, 60 s, 120 s, …) until the
    delivery is marked failed after NOTIFICATION_MAX_ATTEMPTS attempts."""
    delivery = NotificationDelivery.objects.filter(pk=delivery_id).first()
    if delivery is None:
        return False
    sent = notification_deliver(delivery=delivery)
    if not sent:
        delivery.refresh_from_db()
        if delivery.status == DeliveryStatus.RETRYING:
            raise self.retry(countdown=RETRY_BASE_SECONDS * 2 ** (delivery.attempts - 1))
    return sent


@shared_task(name="tenants.approvals_expire", acks_late=True)
def expire_approvals() -> int:
    return approvals_expire()
