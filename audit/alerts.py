"""Keeping the alerts ``raise_alert`` raises, so that operators see them in the console (``Alert``).

An alert is often raised because a transaction is failing: an audit record that cannot be written rolls back the
change it audits, and the alert saying so must not roll back with it. Raised inside a transaction of the caller's,
the alert is written on a database connection of its own (committed at once); raised outside one, on the ordinary
connection. SQLite (embedded mode) has one writer at a time, and the caller's transaction may hold it: there the
alert is written when the caller commits, and one raised in a transaction that rolls back is only logged. Storing
is best effort — a database that refuses the write is logged — since the CRITICAL log line and the hook
(``GPUPOOL_AUDIT_ALERT_HOOK``) already carry the alert.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from audit.models import Alert
from kernel.access_rules import Action, Principal, role_may

logger = logging.getLogger("audit.alert")

MESSAGE_CHARS = 4000


def may_take(user: Any, action: Action) -> bool:
    """Whether the access policy lets ``user`` take an alert ``action`` (``alert.view``, ``alert.acknowledge``).
    Only platform roles have these rules, so the account's platform role decides (the audit app cannot read
    memberships)."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    return role_may(frozenset({Principal.ANY_USER, getattr(user, "platform_role", "")}), action)


def _in_callers_transaction() -> bool:
    # A test case's own atomic blocks do not count: what matters is whether the caller's change may roll back.
    return any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


def _upsert(cursor: Any, *, event: str, message: str, details_json: str, now: dt.datetime) -> None:
    table = connection.ops.quote_name(Alert._meta.db_table)
    cursor.execute(
        f"UPDATE {table} SET last_raised_at = %s, times_raised = times_raised + 1, details = %s "
        "WHERE event = %s AND message = %s AND acknowledged_at IS NULL",
        [now, details_json, event, message],
    )
    if cursor.rowcount == 0:
        cursor.execute(
            f"INSERT INTO {table} (event, message, details, first_raised_at, last_raised_at, times_raised, "
            "acknowledged_at, acknowledged_by_id, acknowledged_by_username) "
            "VALUES (%s, %s, %s, %s, %s, 1, NULL, NULL, '')",
            [event, message, details_json, now, now],
        )


def _store_now(*, event: str, message: str, details_json: str, now: dt.datetime) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        _upsert(cursor, event=event, message=message, details_json=details_json, now=now)


def alert_store(*, event: str, message: str, details: dict | None = None, now: dt.datetime | None = None) -> None:
    """Keep one raised alert: a new row, or one more raising of the same open (unacknowledged) alert."""
    now = now or timezone.now()
    message = message[:MESSAGE_CHARS]
    details_json = json.dumps(details or {}, cls=DjangoJSONEncoder, sort_keys=True, default=str)
    fields = {"event": event, "message": message, "details_json": details_json, "now": now}
    try:
        if not _in_callers_transaction():
            _store_now(**fields)
        elif connection.vendor != "postgresql":
            transaction.on_commit(lambda: _store_after_commit(**fields))
        else:
            own = connections.create_connection(DEFAULT_DB_ALIAS)
            try:
                with own.cursor() as cursor:  # autocommit: committed whatever the caller's transaction does
                    _upsert(cursor, **fields)
            finally:
                own.close()
    except Exception:
        logger.exception("could not store the alert %s in the database", event)


def _store_after_commit(**fields: Any) -> None:
    try:
        _store_now(**fields)
    except Exception:
        logger.exception("could not store the alert %s in the database", fields["event"])
