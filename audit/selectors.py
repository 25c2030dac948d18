"""Reads of the audit trail. Only auditors (platform role ``auditor``) see anything."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import F, Min, Q, QuerySet

from audit import conf
from audit.alerts import may_take
from audit.events import codes_described_by
from audit.models import Alert, AuditRecord, ChainHead, IntegrityCheck
from audit.services import details_for, record_view
from kernel.access_rules import Action, Principal, role_may


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


def records_search(records: QuerySet[AuditRecord], text: str) -> QuerySet[AuditRecord]:
    """The ``records`` a free-text search for ``text`` finds: its action code, target (``job:42``) or actor's
    username contains it (any case), or the description of its action does ("cancelled" finds ``job.cancel``,
    "preempted" ``job.preempt``). Details are sealed, so no search reads them: what a record says must show
    in its code (cancellations and preemptions have codes of their own; older ones were ``job.transition``)."""
    text = text.strip()
    if not text:
        return records
    query = Q(action__icontains=text) | Q(target__icontains=text) | Q(actor_username__icontains=text)
    described = codes_described_by(text)
    if described:
        query |= Q(action__in=described)
    return records.filter(query)


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


def integrity_status() -> dict[str, float]:
    """The scheduled integrity check's latest run: its findings and when it ran (0, 0 when none ran)."""
    check = IntegrityCheck.objects.first()
    if check is None:
        return {"findings": 0.0, "last_run": 0.0}
    return {"findings": float(len(check.findings)), "last_run": check.ran_at.timestamp()}


def alerts_for(user: Any, *, open_only: bool = False) -> QuerySet[Alert]:
    """The alerts ``user`` may read (``alert.view``: platform roles), newest raising first; none for anyone else.
    ``open_only``: those nobody has acknowledged yet."""
    if not may_take(user, Action.ALERT_VIEW):
        return Alert.objects.none()
    alerts = Alert.objects.all()
    return alerts.filter(acknowledged_at__isnull=True) if open_only else alerts
