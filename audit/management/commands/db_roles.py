"""``gpupool db_roles``: the PostgreSQL roles that make the audit trail append-only by privilege.

Run it as the database owner (the role that runs ``migrate``, with CREATEROLE; it need not be a superuser) after
every ``migrate``; it is idempotent. It creates three roles (the first two NOLOGIN unless ``--login``; set
passwords with ``ALTER ROLE … PASSWORD``) and grants:

``gpupool_audit_owner`` — owns the audit tables (and so their sequences). NOLOGIN; the role running db_roles
    (and the database's owner) are made members of it so that ``migrate`` and Django's test flush still work;
    neither the portal's role nor the audit admin may be able to assume it (checked with ``pg_has_role``; the
    command refuses otherwise). The owner of a table can grant itself anything on it and disable its triggers:
    that is why the portal must not own, or be able to become, the owner.
``gpupool_portal`` — what the web processes, agents' consumers, Celery worker and beat connect as:
    every non-audit table: SELECT, INSERT, UPDATE, DELETE (no TRUNCATE); sequences: USAGE, SELECT.
    audit_auditrecord, audit_checkpoint, audit_datakey, audit_signingkey, audit_cosignature, audit_keyrotation,
    audit_integritycheck: SELECT, INSERT only. audit_chainhead: SELECT, INSERT, and UPDATE of (seq, hash,
    checkpoint_seq, witnessed_seq, updated_at) — the heads move on every append and checkpoint. audit_tombstone,
    audit_legalhold: SELECT only.
``gpupool_audit_admin`` — what ``audit_purge``, ``audit_shred_tenant``, ``audit_rotate_keys`` and
    ``audit_legal_hold`` connect as: everything the portal role has (it is a member), plus DELETE on
    audit_auditrecord (the trigger still lets it delete only records a tombstone covers), INSERT on
    audit_tombstone, UPDATE of (wrapped_key, master_key_id, rewrapped_at, destroyed_at) on audit_datakey, INSERT
    and UPDATE of (released_at) on audit_legalhold.

Role attributes are changed only where they differ from what is wanted (a non-superuser with CREATEROLE may not
even name SUPERUSER, REPLICATION or BYPASSRLS in ``ALTER ROLE``); a role of these names that is a superuser is
refused, never used.

What a compromised portal can still do with its UPDATE on audit_chainhead: move a head forward (migration 0006's
trigger refuses every move back, a hash change at the same seq, and a ``checkpoint_seq`` with no checkpoint row).
Moving ``seq`` ahead breaks its own next appends (the chain forks from a wrong hash) and the verifier reports the
mismatch between the head row and the stored records; it cannot delete or change a record. docs/audit.md.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from audit.models import (
    AuditRecord,
    ChainHead,
    Checkpoint,
    Cosignature,
    DataKey,
    IntegrityCheck,
    KeyRotation,
    LegalHold,
    SigningKey,
    Tombstone,
)

PORTAL_ROLE = "gpupool_portal"
ADMIN_ROLE = "gpupool_audit_admin"
OWNER_ROLE = "gpupool_audit_owner"


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _ensure_role(role: str, *, login: bool, purpose: str) -> str:
    """A DO block that creates ``role`` if missing and removes the attributes it must not have, changing only
    what differs: a non-superuser with CREATEROLE may not name SUPERUSER, REPLICATION or BYPASSRLS at all, and
    needs CREATEDB to change CREATEDB (PostgreSQL 16). A superuser of that name is refused, never altered."""
    name, q = _literal(role), _quote(role)
    wanted, can_login = ("LOGIN", "true") if login else ("NOLOGIN", "false")
    return f"""DO $roles$
DECLARE
    r record;
    changes text := '';
BEGIN
    SELECT * INTO r FROM pg_catalog.pg_roles WHERE rolname = {name};
    IF NOT FOUND THEN
        BEGIN
            CREATE ROLE {q} {wanted};
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- created meanwhile by a db_roles run on another database of this cluster
        END;
        SELECT * INTO r FROM pg_catalog.pg_roles WHERE rolname = {name};
    END IF;
    IF r.rolsuper THEN
        RAISE EXCEPTION 'role % is a superuser: db_roles will not use it as the {purpose} role (a superuser '
            'bypasses every privilege); choose another name, or have a superuser run ALTER ROLE % NOSUPERUSER',
            {name}, {name} USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF (r.rolreplication OR r.rolbypassrls) AND NOT (
        SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user
    ) THEN
        RAISE EXCEPTION 'role % has REPLICATION or BYPASSRLS, which only a superuser can remove: have a '
            'superuser run ALTER ROLE % NOREPLICATION NOBYPASSRLS, then run db_roles again', {name}, {name}
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF r.rolcanlogin IS DISTINCT FROM {can_login} THEN changes := changes || ' {wanted}'; END IF;
    IF r.rolcreatedb THEN changes := changes || ' NOCREATEDB'; END IF;
    IF r.rolcreaterole THEN changes := changes || ' NOCREATEROLE'; END IF;
    IF r.rolreplication THEN changes := changes || ' NOREPLICATION'; END IF;
    IF r.rolbypassrls THEN changes := changes || ' NOBYPASSRLS'; END IF;
    IF changes <> '' THEN
        EXECUTE 'ALTER ROLE ' || pg_catalog.quote_ident({name}) || changes;
    END IF;
END $roles$"""


def _owner_membership(owner: str) -> str:
    """A DO block that makes the running role and the database's owner members of ``owner`` (with INHERIT and,
    on PostgreSQL 16+, SET): ALTER TABLE … OWNER TO needs it, and so do later migrations and the test flush.
    Superusers, and roles that are members already, are left alone."""
    name = _literal(owner)
    return f"""DO $roles$
DECLARE
    member name;
BEGIN
    FOR member IN
        SELECT DISTINCT m.rolname FROM pg_catalog.pg_roles m
        WHERE m.rolname = current_user
           OR m.oid = (SELECT d.datdba FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
    LOOP
        IF pg_catalog.current_setting('server_version_num')::int >= 160000 THEN
            IF NOT (pg_catalog.pg_has_role(member, {name}, 'USAGE') AND pg_catalog.pg_has_role(member, {name}, 'SET'))
            THEN
                EXECUTE 'GRANT ' || pg_catalog.quote_ident({name}) || ' TO ' || pg_catalog.quote_ident(member)
                    || ' WITH INHERIT TRUE, SET TRUE';
            END IF;
        ELSIF NOT pg_catalog.pg_has_role(member, {name}, 'USAGE') THEN
            EXECUTE 'GRANT ' || pg_catalog.quote_ident({name}) || ' TO ' || pg_catalog.quote_ident(member);
        END IF;
    END LOOP;
END $roles$"""


def _owner_is_out_of_reach(owner: str, roles: tuple[str, ...]) -> str:
    """A DO block that fails when one of ``roles`` can become (or use the privileges of) ``owner``."""
    checks = "\n".join(
        f"""    IF pg_catalog.pg_has_role({_literal(role)}, {_literal(owner)}, 'MEMBER') THEN
        RAISE EXCEPTION 'role % is a member of the audit tables'' owner % (directly or through another role): '
            'it could change or drop the audit trail and its triggers; revoke that membership, or choose another '
            '--owner-role', {_literal(role)}, {_literal(owner)} USING ERRCODE = 'insufficient_privilege';
    END IF;"""
        for role in roles
    )
    return f"DO $roles$\nBEGIN\n{checks}\nEND $roles$"


def role_statements(
    *, portal: str, admin: str, login: bool, schema: str, database: str, owner: str = OWNER_ROLE
) -> list[str]:
    """The SQL ``db_roles`` runs, in order (also what ``--print`` shows)."""
    if len({portal, admin, owner}) < 3:
        raise CommandError(f"the portal ({portal}), audit-admin ({admin}) and owner ({owner}) roles must differ")
    p, a, o, s = _quote(portal), _quote(admin), _quote(owner), _quote(schema)
    record, head, checkpoint = AuditRecord._meta.db_table, ChainHead._meta.db_table, Checkpoint._meta.db_table
    datakey, signing = DataKey._meta.db_table, SigningKey._meta.db_table
    tombstone, hold = Tombstone._meta.db_table, LegalHold._meta.db_table
    cosignature, rotation = Cosignature._meta.db_table, KeyRotation._meta.db_table
    integrity = IntegrityCheck._meta.db_table
    tables = (record, head, checkpoint, datakey, signing, tombstone, hold, cosignature, rotation, integrity)
    audit_tables = ", ".join(f"{s}.{_quote(t)}" for t in tables)
    appendable = ", ".join(
        f"{s}.{_quote(t)}" for t in (record, checkpoint, datakey, signing, cosignature, rotation, integrity)
    )
    statements = [
        _ensure_role(portal, login=login, purpose="portal"),
        _ensure_role(admin, login=login, purpose="audit-admin"),
        _ensure_role(owner, login=False, purpose="audit-owner"),
        # The audit tables belong to a role nobody logs in as and neither the portal nor the admin can become.
        _owner_membership(owner),
        f"GRANT CREATE ON SCHEMA {s} TO {o}",  # ALTER … OWNER TO needs the new owner to have CREATE on the schema
        *(f"ALTER TABLE {s}.{_quote(t)} OWNER TO {o}" for t in tables),  # their sequences follow
        f"REVOKE CREATE ON SCHEMA {s} FROM {o}",
        f"GRANT CONNECT ON DATABASE {_quote(database)} TO {p}, {a}",
        f"GRANT USAGE ON SCHEMA {s} TO {p}, {a}",
        # Everything else: ordinary DML, never TRUNCATE.
        f"REVOKE TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA {s} FROM {p}, {a}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {p}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {p}",  # the audit tables' sequences too
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {p}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT USAGE, SELECT ON SEQUENCES TO {p}",
        # The audit tables: append and read only, plus the head bookkeeping (forward only: migration 0006).
        f"REVOKE ALL ON {audit_tables} FROM {p}, {a}",
        f"GRANT SELECT, INSERT ON {appendable} TO {p}",
        f"GRANT SELECT, INSERT ON {s}.{_quote(head)} TO {p}",
        f"GRANT UPDATE (seq, hash, checkpoint_seq, witnessed_seq, updated_at) ON {s}.{_quote(head)} TO {p}",
        f"GRANT SELECT ON {s}.{_quote(tombstone)}, {s}.{_quote(hold)} TO {p}",
        # The audit admin: the portal's privileges, plus purge, shred, key rotation and legal holds.
        f"GRANT {p} TO {a}",
        f"GRANT DELETE ON {s}.{_quote(record)} TO {a}",
        f"GRANT INSERT ON {s}.{_quote(tombstone)} TO {a}",
        f"GRANT UPDATE (wrapped_key, master_key_id, rewrapped_at, destroyed_at) ON {s}.{_quote(datakey)} TO {a}",
        f"GRANT INSERT, UPDATE (released_at) ON {s}.{_quote(hold)} TO {a}",
        # Last, once every membership is in place: neither can become the owner.
        _owner_is_out_of_reach(owner, (portal, admin)),
    ]
    return statements


def _schema_and_database() -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema(), current_database()")
        return cursor.fetchone()


def apply_roles(
    *, portal: str = PORTAL_ROLE, admin: str = ADMIN_ROLE, login: bool = False, owner: str = OWNER_ROLE
) -> list[str]:
    """Create or update the roles on the default database; returns the statements run."""
    if connection.vendor != "postgresql":
        raise CommandError("db_roles needs PostgreSQL (SQLite has no roles; embedded mode is single-user).")
    schema, database = _schema_and_database()
    statements = role_statements(portal=portal, admin=admin, login=login, schema=schema, database=database, owner=owner)
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    return statements


class Command(BaseCommand):
    help = (
        "Create the PostgreSQL roles for production: the audit tables' owner (NOLOGIN), the portal's role (INSERT "
        "and SELECT on the audit tables, no UPDATE/DELETE/TRUNCATE) and the audit-admin role (purge, shred, key "
        "rotation, legal holds). Run as the database owner (CREATEROLE, no superuser needed) after every migrate; "
        "idempotent. See docs/audit.md."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--portal-role", default=PORTAL_ROLE, help=f"the portal's role (default {PORTAL_ROLE})")
        parser.add_argument("--admin-role", default=ADMIN_ROLE, help=f"the audit-admin role (default {ADMIN_ROLE})")
        parser.add_argument(
            "--owner-role", default=OWNER_ROLE, help=f"the NOLOGIN role owning the audit tables (default {OWNER_ROLE})"
        )
        parser.add_argument("--login", action="store_true", help="make the portal and admin LOGIN roles")
        parser.add_argument("--print", action="store_true", dest="print_only", help="print the SQL, change nothing")

    def handle(self, *args, **options) -> None:
        portal, admin, owner, login = (
            options["portal_role"],
            options["admin_role"],
            options["owner_role"],
            options["login"],
        )
        if options["print_only"]:
            schema, database = _schema_and_database()
            for statement in role_statements(
                portal=portal, admin=admin, login=login, schema=schema, database=database, owner=owner
            ):
                self.stdout.write(statement + ";")
            return
        try:
            apply_roles(portal=portal, admin=admin, login=login, owner=owner)
        except CommandError:
            raise
        except Exception as exc:
            raise CommandError(
                f"could not set up the roles: {exc}. Run db_roles as the database owner (the role that runs "
                "migrate, owner of the schema and its tables), with CREATEROLE."
            ) from exc
        if options["verbosity"] >= 1:
            self.stdout.write(
                self.style.SUCCESS(
                    f"roles ready: {owner} (owns the audit tables, NOLOGIN), {portal} (portal: INSERT/SELECT on "
                    f"audit tables), {admin} (audit admin: purge, shred, key rotation, legal holds). Run this again "
                    "after every migrate."
                )
            )
