"""Harden the audit triggers (PostgreSQL): pinned search_path, schema-qualified names, append-only tables and
forward-only chain heads.

Before: the trigger functions named ``audit_tombstone`` unqualified and ran with the caller's search_path, in
which ``pg_temp`` comes first: a ``CREATE TEMP TABLE audit_tombstone`` holding a row that "covers" every record
made the DELETE trigger accept deletes of records no signed tombstone covers. Now (PostgreSQL only):

- every trigger function names its tables by the schema this migration runs in (``current_schema()``, quoted)
  and runs with ``SET search_path = pg_catalog, pg_temp`` (pg_temp explicitly last), its pg_catalog functions
  qualified;
- TRUNCATE is refused on ``audit_cosignature``, ``audit_keyrotation`` and ``audit_integritycheck`` too (unless the truncating role has the
  privileges of the table's owner: Django's test flush);
- UPDATE and DELETE are refused, for every role, on ``audit_checkpoint``, ``audit_cosignature``,
  ``audit_keyrotation``, ``audit_tombstone``, ``audit_signingkey`` and ``audit_integritycheck`` (the scheduled
  check's results: nobody rewrites a failed run as clean): they are append-only;
- an UPDATE of ``audit_chainhead`` may only move a head forward: its seq never decreases, its hash changes only
  with its seq, ``checkpoint_seq`` and ``witnessed_seq`` never decrease, ``checkpoint_seq`` never passes
  ``seq``, and ``checkpoint_seq`` moves only to a seq for which ``audit_checkpoint`` holds a row of the stream.
  The portal's role needs its column UPDATE on the heads for every append and checkpoint; with this trigger it
  can no longer move a head back or pause checkpointing by moving ``checkpoint_seq`` ahead.

Data keys stay updatable (rotation and shred re-wrap and destroy them); records stay deletable only where a
tombstone covers them (0003). A superuser or the tables' owner can still disable triggers: what they do is found
by the witness.
"""

from django.db import migrations

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
NEW_TRUNCATE_TABLES = ("audit_cosignature", "audit_keyrotation", "audit_integritycheck")
APPEND_ONLY_TABLES = (
    "audit_checkpoint",
    "audit_cosignature",
    "audit_keyrotation",
    "audit_tombstone",
    "audit_signingkey",
    "audit_integritycheck",
)

# ``@schema@`` is replaced by the quoted schema name (str.replace: PL/pgSQL bodies are not format strings).
FUNCTIONS = """
CREATE OR REPLACE FUNCTION @schema@.audit_record_append_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (
        SELECT 1 FROM @schema@.audit_tombstone t WHERE t.stream = OLD.stream AND t.through_seq >= OLD.seq
    ) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit records are append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Audit records cannot be changed; only records a signed tombstone covers can be deleted '
                     '(gpupool audit_purge, run as the audit-admin role).';
END;
$fn$;

CREATE OR REPLACE FUNCTION @schema@.audit_refuse_truncate() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF pg_catalog.pg_has_role(
        current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE'
    ) THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'TRUNCATE on audit table % refused for role %', TG_TABLE_NAME, current_user
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'The audit trail is append-only; purges beyond retention use gpupool audit_purge.';
END;
$fn$;

CREATE OR REPLACE FUNCTION @schema@.audit_refuse_change() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RAISE EXCEPTION 'audit table % is append-only: % refused for role %', TG_TABLE_NAME, TG_OP, current_user
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Checkpoints, cosignatures, key rotations, tombstones and signing keys are never changed '
                     'or removed once written.';
END;
$fn$;

CREATE OR REPLACE FUNCTION @schema@.audit_chainhead_forward_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF NEW.stream IS DISTINCT FROM OLD.stream THEN
        RAISE EXCEPTION 'audit chain head %: the stream of a head cannot change', OLD.stream
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.seq < OLD.seq THEN
        RAISE EXCEPTION 'audit chain head %: seq cannot move back (from % to %)', OLD.stream, OLD.seq, NEW.seq
            USING ERRCODE = 'insufficient_privilege', HINT = 'Chain heads only move forward.';
    END IF;
    IF NEW.seq = OLD.seq AND NEW.hash IS DISTINCT FROM OLD.hash THEN
        RAISE EXCEPTION 'audit chain head %: the hash cannot change while seq stays at %', OLD.stream, OLD.seq
            USING ERRCODE = 'insufficient_privilege', HINT = 'Chain heads only move forward.';
    END IF;
    IF NEW.checkpoint_seq < OLD.checkpoint_seq THEN
        RAISE EXCEPTION 'audit chain head %: checkpoint_seq cannot move back (from % to %)',
            OLD.stream, OLD.checkpoint_seq, NEW.checkpoint_seq
            USING ERRCODE = 'insufficient_privilege', HINT = 'Chain heads only move forward.';
    END IF;
    IF NEW.witnessed_seq < OLD.witnessed_seq THEN
        RAISE EXCEPTION 'audit chain head %: witnessed_seq cannot move back (from % to %)',
            OLD.stream, OLD.witnessed_seq, NEW.witnessed_seq
            USING ERRCODE = 'insufficient_privilege', HINT = 'Chain heads only move forward.';
    END IF;
    IF NEW.checkpoint_seq > NEW.seq THEN
        RAISE EXCEPTION 'audit chain head %: checkpoint_seq % cannot pass seq %', OLD.stream, NEW.checkpoint_seq,
            NEW.seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.checkpoint_seq IS DISTINCT FROM OLD.checkpoint_seq AND NEW.checkpoint_seq <> 0 AND NOT EXISTS (
        SELECT 1 FROM @schema@.audit_checkpoint c WHERE c.stream = NEW.stream AND c.seq = NEW.checkpoint_seq
    ) THEN
        RAISE EXCEPTION 'audit chain head %: no checkpoint of the stream at seq %', OLD.stream, NEW.checkpoint_seq
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'checkpoint_seq moves only to a checkpoint written in the same or an earlier transaction.';
    END IF;
    RETURN NEW;
END;
$fn$;
"""

TRIGGERS = """
DROP TRIGGER IF EXISTS audit_record_append_only ON @schema@.audit_auditrecord;
CREATE TRIGGER audit_record_append_only BEFORE UPDATE OR DELETE ON @schema@.audit_auditrecord
    FOR EACH ROW EXECUTE FUNCTION @schema@.audit_record_append_only();
DROP TRIGGER IF EXISTS audit_chainhead_forward_only ON @schema@.audit_chainhead;
CREATE TRIGGER audit_chainhead_forward_only BEFORE UPDATE ON @schema@.audit_chainhead
    FOR EACH ROW EXECUTE FUNCTION @schema@.audit_chainhead_forward_only();
"""

TRUNCATE_TRIGGER = """
DROP TRIGGER IF EXISTS audit_refuse_truncate ON @schema@.@table@;
CREATE TRIGGER audit_refuse_truncate BEFORE TRUNCATE ON @schema@.@table@
    FOR EACH STATEMENT EXECUTE FUNCTION @schema@.audit_refuse_truncate();
"""

APPEND_ONLY_TRIGGER = """
DROP TRIGGER IF EXISTS audit_refuse_change ON @schema@.@table@;
CREATE TRIGGER audit_refuse_change BEFORE UPDATE OR DELETE ON @schema@.@table@
    FOR EACH ROW EXECUTE FUNCTION @schema@.audit_refuse_change();
"""

# What 0003 installed, for going backwards.
OLD_FUNCTIONS = """
CREATE OR REPLACE FUNCTION audit_record_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (
        SELECT 1 FROM audit_tombstone t WHERE t.stream = OLD.stream AND t.through_seq >= OLD.seq
    ) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit records are append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Audit records cannot be changed; only records a signed tombstone covers can be deleted '
                     '(gpupool audit_purge, run as the audit-admin role).';
END;
$$ LANGUAGE plpgsql;
ALTER FUNCTION audit_record_append_only() RESET search_path;

CREATE OR REPLACE FUNCTION audit_refuse_truncate() RETURNS trigger AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'USAGE') THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'TRUNCATE on audit table % refused for role %', TG_TABLE_NAME, current_user
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'The audit trail is append-only; purges beyond retention use gpupool audit_purge.';
END;
$$ LANGUAGE plpgsql;
ALTER FUNCTION audit_refuse_truncate() RESET search_path;
"""


def _schema(schema_editor) -> str:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        return schema_editor.quote_name(cursor.fetchone()[0])


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema = _schema(schema_editor)
    schema_editor.execute(FUNCTIONS.replace("@schema@", schema), params=None)
    schema_editor.execute(TRIGGERS.replace("@schema@", schema), params=None)
    for table in AUDIT_TABLES:  # the old ones too: their triggers now name the function by its schema
        sql = TRUNCATE_TRIGGER.replace("@schema@", schema).replace("@table@", schema_editor.quote_name(table))
        schema_editor.execute(sql, params=None)
    for table in APPEND_ONLY_TABLES:
        sql = APPEND_ONLY_TRIGGER.replace("@schema@", schema).replace("@table@", schema_editor.quote_name(table))
        schema_editor.execute(sql, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema = _schema(schema_editor)
    for table in APPEND_ONLY_TABLES:
        schema_editor.execute(
            f"DROP TRIGGER IF EXISTS audit_refuse_change ON {schema}.{schema_editor.quote_name(table)};", params=None
        )
    for table in NEW_TRUNCATE_TABLES:
        schema_editor.execute(
            f"DROP TRIGGER IF EXISTS audit_refuse_truncate ON {schema}.{schema_editor.quote_name(table)};", params=None
        )
    schema_editor.execute(
        f"DROP TRIGGER IF EXISTS audit_chainhead_forward_only ON {schema}.audit_chainhead;", params=None
    )
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {schema}.audit_chainhead_forward_only();", params=None)
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {schema}.audit_refuse_change();", params=None)
    # The remaining triggers keep pointing at the same functions (by oid); only their bodies go back.
    schema_editor.execute(OLD_FUNCTIONS, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0005_integrity_check")]  # (after 0004_transparency, whose tables it covers)

    operations = [migrations.RunPython(forwards, backwards)]
