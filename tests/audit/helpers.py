"""Helpers for tampering with the audit tables directly, as a database administrator would."""

from __future__ import annotations

from django.db import connection
from django.test import TestCase

from audit.models import AuditRecord
from audit.services import audit_record, checkpoint_create
from tests.factories import TenantFactory, UserFactory


def raw(sql: str, params: list | None = None) -> None:
    """Run raw SQL with the append-only trigger disabled (PostgreSQL; the change rolls back with the test)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditrecord DISABLE TRIGGER USER")
        cursor.execute(sql, params or [])
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditrecord ENABLE TRIGGER USER")


def make_chain(count: int = 10, *, checkpoint: bool = True):
    """``count`` records by a tenant member in one tenant stream, optionally checkpointed. Returns the stream."""
    tenant = TenantFactory()
    member = UserFactory()
    for index in range(count):
        audit_record(action="job.submit", actor=member, tenant=tenant, target=f"job:{index}", details={"index": index})
    stream = f"tenant:{tenant.pk}"
    if checkpoint:
        # Tests run inside a transaction that never commits: run the on-commit witness append now.
        with TestCase.captureOnCommitCallbacks(execute=True):
            checkpoint_create(stream=stream)
    return stream


def row(stream: str, seq: int) -> AuditRecord:
    return AuditRecord.objects.get(stream=stream, seq=seq)
