"""``gpupool db_roles``: the PostgreSQL roles that make the audit trail append-only by privilege.

Run it as the database owner (the role that runs ``migrate``) after every ``migrate``; it is idempotent. It
creates two roles (NOLOGIN unless ``--login``; set passwords with ``ALTER ROLE … PASSWORD``) and grants:

``gpupool_portal`` — what the web processes, agents' consumers, Celery worker and beat connect as:
    every non-audit table: SELECT, INSERT, UPDATE, DELETE (no TRUNCATE); sequences: USAGE, SELECT.
    audit_auditrecord, audit_checkpoint, audit_datakey, audit_signingkey: SELECT, INSERT only.
    audit_chainhead: SELECT, INSERT, and UPDATE of (seq, hash, checkpoint_seq, witnessed_seq, updated_at) — the
    heads move on every append and checkpoint. audit_tombstone, audit_legalhold: SELECT only.
``gpupool_audit_admin`` — what ``audit_purge``, ``audit_shred_tenant``, ``audit_rotate_keys`` and
    ``audit_legal_hold`` connect as: everything the portal role has (it is a member), plus DELETE on
    audit_auditrecord (the trigger still lets it delete only records a tombstone covers), INSERT on
    audit_tombstone, UPDATE of (wrapped_key, master_key_id, rewrapped_at, destroyed_at) on audit_datakey, INSERT
    and UPDATE of (released_at) on audit_legalhold.

What a compromised portal can still do with its UPDATE on audit_chainhead: move a head back or forward. That
breaks its own next appends (a seq collides, or the chain forks from a wrong hash) and the verifier reports the
mismatch between the head row and the stored records; it cannot delete or change a record. docs/audit.md.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from audit.models import AuditRecord, ChainHead, Checkpoint, DataKey, LegalHold, SigningKey, Tombstone

PORTAL_ROLE = "gpupool_portal"
ADMIN_ROLE = "gpupool_audit_admin"


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


def role_statements(*, portal: str, admin: str, login: bool, schema: str, database: str) -> list[str]:
    """The SQL ``db_roles`` runs, in order (also what ``--print`` shows)."""
    p, a, s = _quote(portal), _quote(admin), _quote(schema)
    record, head, checkpoint = AuditRecord._meta.db_table, ChainHead._meta.db_table, Checkpoint._meta.db_table
    datakey, signing = DataKey._meta.db_table, SigningKey._meta.db_table
    tombstone, hold = Tombstone._meta.db_table, LegalHold._meta.db_table
    audit_tables = ", ".join(_quote(t) for t in (record, head, checkpoint, datakey, signing, tombstone, hold))
    can_login = "LOGIN" if login else "NOLOGIN"
    statements = []
    for role in (portal, admin):
        literal = role.replace("'", "''")
        statements.append(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{literal}') THEN "
            f"CREATE ROLE {_quote(role)} {can_login}; END IF; END $$"
        )
        statements.append(f"ALTER ROLE {_quote(role)} {can_login} NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS")
    statements += [
        f"GRANT CONNECT ON DATABASE {_quote(database)} TO {p}, {a}",
        f"GRANT USAGE ON SCHEMA {s} TO {p}, {a}",
        # Everything else: ordinary DML, never TRUNCATE.
        f"REVOKE TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA {s} FROM {p}, {a}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {p}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {p}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {p}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT USAGE, SELECT ON SEQUENCES TO {p}",
        # The audit tables: append and read only, plus the head bookkeeping.
        f"REVOKE ALL ON {audit_tables} FROM {p}, {a}",
        f"GRANT SELECT, INSERT ON {_quote(record)}, {_quote(checkpoint)}, {_quote(datakey)}, {_quote(signing)} TO {p}",
        f"GRANT SELECT, INSERT ON {_quote(head)} TO {p}",
        f"GRANT UPDATE (seq, hash, checkpoint_seq, witnessed_seq, updated_at) ON {_quote(head)} TO {p}",
        f"GRANT SELECT ON {_quote(tombstone)}, {_quote(hold)} TO {p}",
        # The audit admin: the portal's privileges, plus purge, shred, key rotation and legal holds.
        f"GRANT {p} TO {a}",
        f"GRANT DELETE ON {_quote(record)} TO {a}",
        f"GRANT INSERT ON {_quote(tombstone)} TO {a}",
        f"GRANT UPDATE (wrapped_key, master_key_id, rewrapped_at, destroyed_at) ON {_quote(datakey)} TO {a}",
        f"GRANT INSERT, UPDATE (released_at) ON {_quote(hold)} TO {a}",
    ]
    return statements


def apply_roles(*, portal: str = PORTAL_ROLE, admin: str = ADMIN_ROLE, login: bool = False) -> list[str]:
    """Create or update the roles on the default database; returns the statements run."""
    if connection.vendor != "postgresql":
        raise CommandError("db_roles needs PostgreSQL (SQLite has no roles; embedded mode is single-user).")
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema(), current_database()")
        schema, database = cursor.fetchone()
    statements = role_statements(portal=portal, admin=admin, login=login, schema=schema, database=database)
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    return statements


class Command(BaseCommand):
    help = (
        "Create the PostgreSQL roles for production: the portal's role (INSERT and SELECT on the audit tables, "
        "no UPDATE/DELETE/TRUNCATE) and the audit-admin role (purge, shred, key rotation, legal holds). Run as "
        "the database owner after every migrate; idempotent. See docs/audit.md."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--portal-role", default=PORTAL_ROLE, help=f"the portal's role (default {PORTAL_ROLE})")
        parser.add_argument("--admin-role", default=ADMIN_ROLE, help=f"the audit-admin role (default {ADMIN_ROLE})")
        parser.add_argument("--login", action="store_true", help="make them LOGIN roles (then set passwords)")
        parser.add_argument("--print", action="store_true", dest="print_only", help="print the SQL, change nothing")

    def handle(self, *args, **options) -> None:
        portal, admin, login = options["portal_role"], options["admin_role"], options["login"]
        if options["print_only"]:
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_schema(), current_database()")
                schema, database = cursor.fetchone()
            for statement in role_statements(portal=portal, admin=admin, login=login, schema=schema, database=database):
                self.stdout.write(statement + ";")
            return
        try:
            apply_roles(portal=portal, admin=admin, login=login)
        except CommandError:
            raise
        except Exception as exc:
            raise CommandError(
                f"could not set up the roles: {exc}. Run db_roles as the database owner (the role that runs "
                "migrate), with CREATEROLE."
            ) from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"roles ready: {portal} (portal: INSERT/SELECT on audit tables), {admin} (audit admin: purge, "
                f"shred, key rotation, legal holds). Run this again after every migrate."
            )
        )
