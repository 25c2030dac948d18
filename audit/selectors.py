"""Reads of the audit trail. Only auditors (platform role ``auditor``) see anything."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import F, Min, Q, QuerySet

from audit import conf
from audit.models import AuditRecord, ChainHead
from audit.services import details_for, record_view
from portal.policy import Action, Principal, role_may


def may_read_trail(user: Any, action: Action = Action.AUDIT_VIEW) -> bool:
    """Whether the access policy lets ``user`` take an audit-trail ``action``. Separation of duties: in the
    table only the auditor role has these rules — not system admins, not superusers. The audit app sits below
    the tenants app and cannot read memberships; no tenant role has an audit rule (tests/security hold the
    table to that), so the account's platform role decides."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    return role_may(frozenset({Principal.ANY_USER, user.platform_role}), action)


def records_for(
    user: Any,
    *,
    created_after: dt.datetime | None = None,
    created_before: dt.datetime | None = None,
    actor: str | None = None,
    tenant_id: int | None = None,
    action: str | None = None,
    outcome: str | None = None,
    stream: str | None = None,
    target: str | None = None,
    request_id: str | None = None,
) -> QuerySet[AuditRecord]:
    """Audit records ``user`` may read, newest first, filtered. Empty for anyone but an auditor.

    ``actor`` matches the username (or the numeric actor id); ``action`` is a prefix (``job.`` finds every job
    action).
    """
    if not may_read_trail(user):
        return AuditRecord.objects.none()
    records = AuditRecord.objects.order_by("-id")
    if created_after is not None:
        records = records.filter(created_at__gte=created_after)
    if created_before is not None:
        records = records.filter(created_at__lt=created_before)
    if actor:
        records = records.filter(actor_id=int(actor)) if str(actor).isdigit() else records.filter(actor_username=actor)
    if tenant_id is not None:
        records = records.filter(tenant_id=tenant_id)
    if action:
        records = records.filter(action__startswith=action)
    if outcome:
        records = records.filter(outcome=outcome)
    if stream:
        records = records.filter(stream=stream)
    if target:
        records = records.filter(target=target)
    if request_id:
        records = records.filter(request_id=request_id)
    return records


def readable(records: list[AuditRecord]) -> list[dict[str, Any]]:
    """Records opened for an auditor (one key query for the page)."""
    details = details_for(records)
    return [record_view(record, details[record.pk]) for record in records]


def unwitnessed_record_age_seconds(*, now: dt.datetime) -> float:
    """How old the oldest audit record is that no witnessed checkpoint covers yet (0 when every record is covered).

    Beat seals each changed stream every ``GPUPOOL_AUDIT_CHECKPOINT_SECONDS``; past ``witness_window_seconds()``
    ``audit_verify`` fails, so this figure climbing towards the window means the sealing fell behind or stopped
    (no beat, no worker, an unwritable witness). One row per stream whose head is ahead of its witness.
    """
    behind = list(ChainHead.objects.filter(seq__gt=F("witnessed_seq")).values_list("stream", "witnessed_seq"))
    if not behind:
        return 0.0
    first_unwitnessed = Q()
    for stream, witnessed_seq in behind:
        first_unwitnessed |= Q(stream=stream, seq=witnessed_seq + 1)
    oldest = AuditRecord.objects.filter(first_unwitnessed).aggregate(oldest=Min("created_at"))["oldest"]
    return round(max(0.0, (now - oldest).total_seconds()), 3) if oldest is not None else 0.0


def witness_window_seconds() -> int:
    """The age past which every audit record must be covered by a witnessed checkpoint (``audit_verify``)."""
    return conf.witness_window_seconds()
