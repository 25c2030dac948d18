"""Helpers for tampering with the audit tables directly, as a database administrator would."""

from __future__ import annotations

from django.db import connection
from django.test import TestCase

from audit.models import AuditRecord
from audit.services import audit_record, checkpoint_create
from tests.factories import TenantFactory, UserFactory

AUDIT_TABLES = (
    "audit_auditrecord",
    "audit_chainhead",
    "audit_checkpoint",
    "audit_cosignature",
    "audit_keyrotation",
    "audit_tombstone",
    "audit_signingkey",
    "audit_datakey",
    "audit_legalhold",
)


def raw(sql: str, params: list | None = None) -> None:
    """Run raw SQL as a superuser would: with every audit table's triggers disabled (PostgreSQL; the change rolls
    back with the test)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for table in AUDIT_TABLES:
                cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        cursor.execute(sql, params or [])
        if connection.vendor == "postgresql":
            for table in AUDIT_TABLES:
                cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


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
