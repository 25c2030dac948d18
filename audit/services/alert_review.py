"""An operator's answer to an alert: acknowledging it (audited)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.alerts import may_take
from audit.models import Alert
from audit.services.append import audit_record
from kernel.access_rules import Action
from kernel.api import PermissionDeniedError


def alert_acknowledge(*, alert: Alert, actor: Any, request: Any | None = None) -> Alert:
    """Mark an open alert as seen and handled by ``actor`` (platform admins: ``alert.acknowledge``); audited.
    Acknowledging it again changes nothing. If it is raised again later, it opens a new alert."""
    if not may_take(actor, Action.ALERT_ACKNOWLEDGE):
        raise PermissionDeniedError("Only a system or security admin acknowledges alerts.")
    with transaction.atomic():
        alert = Alert.objects.select_for_update().get(pk=alert.pk)
        if alert.acknowledged_at is not None:
            return alert
        alert.acknowledged_at = timezone.now()
        alert.acknowledged_by_id = actor.pk
        alert.acknowledged_by_username = actor.get_username()
        alert.save(update_fields=["acknowledged_at", "acknowledged_by_id", "acknowledged_by_username"])
        audit_record(
            action="alert.acknowledge",
            actor=actor,
            target=f"alert:{alert.pk}",
            details={"event": alert.event, "times_raised": alert.times_raised},
            request=request,
        )
    return alert
