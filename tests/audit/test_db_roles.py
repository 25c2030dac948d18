"""``gpupool db_roles``: as the portal's role PostgreSQL itself refuses UPDATE, DELETE and TRUNCATE of the audit
trail, while appending, reading and checkpointing work; purge and shred need the audit-admin role.

The roles are created inside the test's transaction (CREATE ROLE is transactional), with names derived from the
test database so parallel runs on one cluster do not meet; ``SET LOCAL ROLE`` gives the session exactly that
role's privileges, as if the portal had logged in as it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test import TestCase
from django.utils import timezone

from audit.models import AuditRecord, DataKey
from audit.services import audit_record, checkpoint_all, tenant_keys_shred
from audit.verification import verify_trail
from tests.factories import TenantFactory

pytestmark = [pytest.mark.django_db, pytest.mark.services, pytest.mark.database_owner]  # switches roles itself


@pytest.fixture
def roles(postgres) -> tuple[str, str]:
    base = connection.settings_dict["NAME"][:40]
    portal, admin = f"{base}_portal", f"{base}_audit_admin"
    call_command("db_roles", "--portal-role", portal, "--admin-role", admin)
    return portal, admin


@contextmanager
def as_role(role: str) -> Iterator:
    """Run as ``role`` inside a savepoint; an error rolls the savepoint (and the role switch) back."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL ROLE {connection.ops.quote_name(role)}")
        yield cursor
        cursor.execute("RESET ROLE")


def refused(role: str, sql: str, params: list | None = None) -> str:
    with pytest.raises(DatabaseError) as error, as_role(role) as cursor:
        cursor.execute(sql, params or [])
    return str(error.value)


def test_portal_role_appends_reads_and_checkpoints(roles):
    portal, _admin = roles
    tenant = TenantFactory()
    with as_role(portal) as cursor:
        for index in range(3):
            audit_record(action="job.submit", actor=None, tenant=tenant, target=f"job:{index}")
        with TestCase.captureOnCommitCallbacks(execute=True):
            assert len(checkpoint_all()) == 1
        cursor.execute("SELECT count(*) FROM audit_auditrecord WHERE tenant_id = %s", [tenant.pk])
        assert cursor.fetchone()[0] == 3
    assert verify_trail(record_result=False).ok


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE audit_auditrecord SET target = 'x'",
        "DELETE FROM audit_auditrecord",
        "TRUNCATE audit_auditrecord",
        "TRUNCATE audit_chainhead, audit_checkpoint, audit_tombstone, audit_datakey",
        "UPDATE audit_datakey SET destroyed_at = now(), wrapped_key = ''",
        "DELETE FROM audit_datakey",
        "UPDATE audit_checkpoint SET head_hash = 'x'",
        "DELETE FROM audit_checkpoint",
        "INSERT INTO audit_tombstone (stream, through_seq, through_hash, purged_count, purged_at, algorithm, key_id, "
        "signature) VALUES ('platform', 1000, '', 0, '', '', '', '')",
        "UPDATE audit_legalhold SET released_at = now()",
    ],
)
def test_portal_role_cannot_change_or_remove_the_trail(roles, sql):
    portal, _admin = roles
    audit_record(action="job.submit", actor=None, tenant=TenantFactory(), target="job:1")
    assert "permission denied" in refused(portal, sql)


def test_the_old_purge_setting_opens_nothing_for_the_portal_role(roles):
    portal, _admin = roles
    audit_record(action="job.submit", actor=None, tenant=TenantFactory(), target="job:1")
    with pytest.raises(DatabaseError, match="permission denied"), as_role(portal) as cursor:
        cursor.execute("SET LOCAL gpupool.audit_purge = 'on'")
        cursor.execute("DELETE FROM audit_auditrecord")
    assert AuditRecord.objects.exists()


def test_shredding_needs_the_audit_admin_role(roles):
    portal, admin = roles
    tenant = TenantFactory()
    audit_record(action="job.submit", actor=None, tenant=tenant, target="job:1")
    later = timezone.now() + dt.timedelta(days=400)
    with pytest.raises(DatabaseError, match="permission denied"), as_role(portal):
        tenant_keys_shred(actor=None, tenant_id=tenant.pk, now=later)
    assert not DataKey.objects.filter(tenant_id=tenant.pk, destroyed_at__isnull=False).exists()
    with as_role(admin):
        assert tenant_keys_shred(actor=None, tenant_id=tenant.pk, now=later) == 1


def test_the_audit_admin_cannot_delete_records_no_tombstone_covers(roles):
    _portal, admin = roles
    audit_record(action="job.submit", actor=None, tenant=TenantFactory(), target="job:1")
    assert "append-only" in refused(admin, "DELETE FROM audit_auditrecord")
    assert "permission denied" in refused(admin, "UPDATE audit_auditrecord SET target = 'x'")
    assert "permission denied" in refused(admin, "TRUNCATE audit_auditrecord")


def test_the_truncate_trigger_stops_a_role_granted_truncate_by_mistake(roles):
    portal, _admin = roles
    audit_record(action="job.submit", actor=None, tenant=TenantFactory(), target="job:1")
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT TRUNCATE ON audit_auditrecord TO {connection.ops.quote_name(portal)}")
    assert "TRUNCATE on audit table audit_auditrecord refused" in refused(portal, "TRUNCATE audit_auditrecord")
    assert AuditRecord.objects.exists()


def test_db_roles_prints_its_sql(roles, capsys):
    portal, admin = roles
    call_command("db_roles", "--portal-role", portal, "--admin-role", admin, "--print")
    out = capsys.readouterr().out
    assert 'GRANT SELECT, INSERT ON "audit_auditrecord"' in out and "TRUNCATE" in out


def test_purge_needs_the_audit_admin_role_and_leaves_tombstones(roles):
    from audit.models import Tombstone
    from audit.services import records_purge

    portal, admin = roles
    tenant = TenantFactory()
    for index in range(3):
        audit_record(action="job.submit", actor=None, tenant=tenant, target=f"job:{index}")
    with TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint_all()
    later = timezone.now() + dt.timedelta(days=400)
    with pytest.raises(DatabaseError, match="permission denied"), as_role(portal):
        records_purge(actor=None, now=later)
    with as_role(admin), TestCase.captureOnCommitCallbacks(execute=True):
        tombstones = records_purge(actor=None, now=later)
    assert f"tenant:{tenant.pk}" in {t.stream for t in tombstones}
    assert not AuditRecord.objects.filter(stream=f"tenant:{tenant.pk}", seq__lte=3).exists()
    assert Tombstone.objects.filter(stream=f"tenant:{tenant.pk}", through_seq=3).exists()
    assert verify_trail(record_result=False).ok
