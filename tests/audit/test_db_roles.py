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
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.test import TestCase
from django.utils import timezone

from audit.management.commands.db_roles import OWNER_ROLE
from audit.models import AuditRecord, ChainHead, Cosignature, DataKey, IntegrityCheck, KeyRotation, Tombstone
from audit.services import audit_record, checkpoint_all, tenant_keys_shred
from audit.trail_verifier import verify_trail
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
    schema = connection.ops.quote_name(current_schema())
    assert f'GRANT SELECT, INSERT ON {schema}."audit_auditrecord"' in out and "TRUNCATE" in out
    assert f'ALTER TABLE {schema}."audit_auditrecord" OWNER TO "{OWNER_ROLE}"' in out


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


# --- migration 0006 and the owner role -----------------------------------------------------------------------

AUDIT_TABLES = (
    "audit_auditrecord",
    "audit_chainhead",
    "audit_checkpoint",
    "audit_tombstone",
    "audit_datakey",
    "audit_legalhold",
    "audit_signingkey",
    "audit_cosignature",
    "audit_keyrotation",
    "audit_integritycheck",
)
TRIGGER_FUNCTIONS = (
    "audit_record_append_only",
    "audit_refuse_truncate",
    "audit_refuse_change",
    "audit_chainhead_forward_only",
)


def current_schema() -> str:
    return fetch("SELECT current_schema()")[0][0]


def fetch(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall()


def execute(sql: str, params: list | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def table_owners() -> dict[str, str]:
    rows = fetch(
        "SELECT c.relname, c.relowner::regrole::text FROM pg_class c WHERE c.relname = ANY(%s) "
        "AND c.relnamespace = current_schema()::regnamespace",
        [list(AUDIT_TABLES)],
    )
    return dict(rows)


def sealed_stream(records: int = 3, tenant=None) -> str:
    """A tenant stream of ``records`` records, checkpointed and cosigned by the witness (as the owner)."""
    tenant = tenant or TenantFactory()
    for index in range(records):
        audit_record(action="job.submit", actor=None, tenant=tenant, target=f"job:{index}")
    with TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint_all()
    return f"tenant:{tenant.pk}"


def test_db_roles_works_as_a_createrole_database_owner_that_is_no_superuser(postgres):
    """As documented: the database owner, with CREATEROLE and nothing more, runs db_roles (repeatedly)."""
    base = connection.settings_dict["NAME"][:40]
    dbo, portal, admin, owner = (f"{base}_{suffix}" for suffix in ("dbo", "nsu_portal", "nsu_admin", "nsu_owner"))
    q = connection.ops.quote_name
    # As the superuser: make ``dbo`` what production's owner is (owner of the database, schema and tables). The
    # portal role exists already, with an attribute it must lose: db_roles changes only what differs.
    execute(f"CREATE ROLE {q(dbo)} NOLOGIN NOSUPERUSER CREATEROLE")
    execute(f"CREATE ROLE {q(portal)} NOLOGIN CREATEDB")
    execute(f"ALTER DATABASE {q(connection.settings_dict['NAME'])} OWNER TO {q(dbo)}")
    execute(
        "DO $$ DECLARE t regclass; BEGIN "
        "FOR t IN SELECT c.oid FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace "
        "AND c.relkind IN ('r', 'p', 'v', 'm') LOOP "
        f"EXECUTE 'ALTER TABLE ' || t || ' OWNER TO ' || quote_ident({dbo!r}); END LOOP; END $$"
    )
    with as_role(dbo) as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert cursor.fetchone() == (False,)
        for _ in range(2):  # idempotent, also when every role exists already
            call_command("db_roles", "--portal-role", portal, "--admin-role", admin, "--owner-role", owner, verbosity=0)
    assert set(table_owners().values()) == {owner}
    assert fetch("SELECT rolcreatedb, rolcanlogin FROM pg_roles WHERE rolname = %s", [portal]) == [(False, False)]
    assert fetch("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", [owner]) == [(False,)]
    assert fetch("SELECT pg_has_role(%s, %s, 'USAGE')", [dbo, owner]) == [(True,)]  # migrate and flush still work
    for role in (portal, admin):
        assert fetch("SELECT pg_has_role(%s, %s, 'MEMBER')", [role, owner]) == [(False,)]
    # The portal's privileges came through the ownership change, sequences included.
    with as_role(portal) as cursor:
        audit_record(action="job.submit", actor=None, tenant=TenantFactory(), target="job:1")
        cursor.execute("SELECT has_sequence_privilege('audit_auditrecord_id_seq', 'USAGE')")
        assert cursor.fetchone() == (True,)


def test_db_roles_refuses_a_superuser_of_a_role_name(postgres):
    base = connection.settings_dict["NAME"][:40]
    superuser = f"{base}_su_portal"
    execute(f"CREATE ROLE {connection.ops.quote_name(superuser)} SUPERUSER NOLOGIN")
    with pytest.raises(CommandError, match=f"role {superuser} is a superuser"):
        call_command("db_roles", "--portal-role", superuser, "--admin-role", f"{base}_su_admin", verbosity=0)
    assert fetch("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [superuser]) == [(True,)]


def test_the_audit_tables_belong_to_a_role_neither_portal_nor_admin_can_become(roles):
    portal, admin = roles
    assert set(table_owners().values()) == {OWNER_ROLE}
    assert fetch("SELECT c.relowner::regrole::text FROM pg_class c WHERE c.relname = 'audit_auditrecord_id_seq'") == [
        (OWNER_ROLE,)
    ]
    for role in (portal, admin):
        assert fetch("SELECT pg_has_role(%s, %s, 'USAGE'), pg_has_role(%s, %s, 'MEMBER')", [role, OWNER_ROLE] * 2) == [
            (False, False)
        ]
    assert fetch("SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = %s", [OWNER_ROLE]) == [(False, False)]


def test_db_roles_refuses_when_the_portal_can_become_the_owner(roles):
    portal, admin = roles
    execute(f"GRANT {connection.ops.quote_name(OWNER_ROLE)} TO {connection.ops.quote_name(portal)}")
    with pytest.raises(CommandError, match=f"role {portal} is a member of the audit tables' owner"):
        call_command("db_roles", "--portal-role", portal, "--admin-role", admin, verbosity=0)


def test_every_trigger_function_pins_its_search_path(postgres):
    rows = dict(fetch("SELECT proname, proconfig FROM pg_proc WHERE proname = ANY(%s)", [list(TRIGGER_FUNCTIONS)]))
    assert rows == {name: ["search_path=pg_catalog, pg_temp"] for name in TRIGGER_FUNCTIONS}


@pytest.mark.parametrize("which", ["portal", "admin"])
def test_a_temp_audit_tombstone_opens_no_deletes(roles, which):
    """pg_temp comes first in a session's search_path: a temp table named audit_tombstone used to shadow the real
    one in the DELETE trigger. The trigger names its tables by schema and pins its search_path now."""
    role = dict(zip(("portal", "admin"), roles, strict=True))[which]
    stream = sealed_stream()
    with pytest.raises(DatabaseError) as error, as_role(role) as cursor:
        cursor.execute("CREATE TEMP TABLE audit_tombstone (stream varchar(40), through_seq bigint)")
        cursor.execute("INSERT INTO audit_tombstone SELECT DISTINCT stream, 1000000000 FROM audit_auditrecord")
        cursor.execute("DELETE FROM audit_auditrecord")
    assert ("append-only" if which == "admin" else "permission denied") in str(error.value)
    assert AuditRecord.objects.filter(stream=stream).count() == 3


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("UPDATE audit_chainhead SET seq = seq - 1 WHERE stream = %s", "seq cannot move back"),
        ("UPDATE audit_chainhead SET seq = 0, hash = 'x' WHERE stream = %s", "seq cannot move back"),
        ("UPDATE audit_chainhead SET hash = repeat('0', 64) WHERE stream = %s", "the hash cannot change"),
        ("UPDATE audit_chainhead SET checkpoint_seq = 0 WHERE stream = %s", "checkpoint_seq cannot move back"),
        ("UPDATE audit_chainhead SET checkpoint_seq = seq WHERE stream = %s", "no checkpoint of the stream at seq 5"),
        ("UPDATE audit_chainhead SET checkpoint_seq = seq + 1 WHERE stream = %s", "checkpoint_seq 6 cannot pass seq 5"),
        ("UPDATE audit_chainhead SET witnessed_seq = 0 WHERE stream = %s", "witnessed_seq cannot move back"),
    ],
)
def test_the_portal_role_cannot_move_a_head_back_or_pause_checkpointing(roles, sql, message):
    portal, _admin = roles
    tenant = TenantFactory()
    stream = sealed_stream(tenant=tenant)  # checkpointed and witnessed at 3
    for index in range(2):  # seq 5, not checkpointed yet
        audit_record(action="job.cancel", actor=None, tenant=tenant, target=f"job:{index}")
    before = ChainHead.objects.values_list("seq", "hash", "checkpoint_seq", "witnessed_seq").get(stream=stream)
    assert before[0] == 5 and before[2:] == (3, 3)
    error = refused(portal, sql, [stream])
    assert f"audit chain head {stream}: {message}" in error
    after = ChainHead.objects.values_list("seq", "hash", "checkpoint_seq", "witnessed_seq").get(stream=stream)
    assert after == before


def test_the_app_still_moves_heads_forward_as_the_portal_role(roles):
    portal, _admin = roles
    tenant = TenantFactory()
    stream = f"tenant:{tenant.pk}"
    with as_role(portal):
        for round_ in range(2):
            for index in range(3):
                audit_record(action="job.submit", actor=None, tenant=tenant, target=f"job:{round_}.{index}")
            with TestCase.captureOnCommitCallbacks(execute=True):
                checkpoint_all()
    head = ChainHead.objects.get(stream=stream)
    assert (head.seq, head.checkpoint_seq, head.witnessed_seq) == (6, 6, 6)
    assert verify_trail(record_result=False).ok


APPEND_ONLY = {  # table → the change an UPDATE tries
    "audit_checkpoint": "signature = signature || 'x'",
    "audit_cosignature": "cosignature = cosignature || 'x'",
    "audit_keyrotation": "signature = signature || 'x'",
    "audit_tombstone": "signature = signature || 'x'",
    "audit_signingkey": "algorithm = algorithm || 'x'",
    "audit_integritycheck": "ok = true, findings = '[]'",  # a failed run rewritten as clean
}


def append_only_rows() -> None:
    stream = sealed_stream()
    if not Cosignature.objects.filter(stream=stream).exists():
        Cosignature.objects.create(stream=stream, seq=3, witness_key="k", cosignature="c")
    KeyRotation.objects.create(number=999, statement={}, signature="s")
    IntegrityCheck.objects.create(ran_at=timezone.now(), ok=False, full=True, findings=[{"kind": "gap"}])
    Tombstone.objects.create(
        stream=stream,
        through_seq=0,
        through_hash="",
        purged_count=0,
        purged_at="",
        algorithm="",
        key_id="",
        signature="",
    )


@pytest.mark.parametrize("table", sorted(APPEND_ONLY))
@pytest.mark.parametrize("verb", ["UPDATE", "DELETE"])
def test_append_only_tables_refuse_update_and_delete(roles, table, verb):
    portal, _admin = roles
    append_only_rows()
    sql = f"UPDATE {table} SET {APPEND_ONLY[table]}" if verb == "UPDATE" else f"DELETE FROM {table}"
    assert "permission denied" in refused(portal, sql)
    # A role granted too much by mistake, and the owner itself, meet the trigger.
    execute(f"GRANT UPDATE, DELETE ON {table} TO {connection.ops.quote_name(portal)}")
    assert f"audit table {table} is append-only: {verb} refused" in refused(portal, sql)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        execute(sql)


@pytest.mark.parametrize("table", ["audit_cosignature", "audit_keyrotation", "audit_integritycheck"])
def test_the_new_tables_refuse_truncate_too(roles, table):
    portal, _admin = roles
    append_only_rows()
    assert "permission denied" in refused(portal, f"TRUNCATE {table}")
    execute(f"GRANT TRUNCATE ON {table} TO {connection.ops.quote_name(portal)}")
    assert f"TRUNCATE on audit table {table} refused" in refused(portal, f"TRUNCATE {table}")
