"""ChainHead.witnessed_seq, and the append-only triggers without the ``gpupool.audit_purge`` setting.

Before: DELETE on audit records was allowed to any session that ran ``SET gpupool.audit_purge = on`` (any role can
set a custom setting), and TRUNCATE was not covered. Now (PostgreSQL):

- UPDATE of an audit record is refused, always.
- DELETE of an audit record is allowed only when a tombstone already covers it (same stream, ``through_seq`` at
  or above its seq): ``records_purge`` writes its signed tombstone first, so nothing deletes records without
  leaving signed proof (a forged tombstone fails ``audit_verify``'s signature check).
- TRUNCATE of any audit table is refused unless the truncating role owns the table (the role that ran the
  migrations; Django's test flush runs as it). Privileges are the first wall: the portal's role has no UPDATE,
  DELETE or TRUNCATE on these tables (``gpupool db_roles``); the trigger also stops a role that was granted too
  much by mistake. The owner and superusers can drop triggers anyway: what they do is found by the witness.
"""

from django.db import migrations, models

AUDIT_TABLES = (
    "audit_auditrecord",
    "audit_chainhead",
    "audit_checkpoint",
    "audit_tombstone",
    "audit_datakey",
    "audit_legalhold",
    "audit_signingkey",
)

CREATE = """
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
"""

TRUNCATE_TRIGGER = """
DROP TRIGGER IF EXISTS audit_refuse_truncate ON {table};
CREATE TRIGGER audit_refuse_truncate BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_truncate();
"""

# What 0002 installed, for going backwards.
OLD_FUNCTION = """
CREATE OR REPLACE FUNCTION audit_record_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('gpupool.audit_purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit records are append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Audit records cannot be changed or deleted; purges beyond retention use manage.py audit_purge.';
END;
$$ LANGUAGE plpgsql;
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(CREATE, params=None)
    for table in AUDIT_TABLES:
        schema_editor.execute(TRUNCATE_TRIGGER.format(table=table), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in AUDIT_TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS audit_refuse_truncate ON {table};", params=None)
    schema_editor.execute("DROP FUNCTION IF EXISTS audit_refuse_truncate();", params=None)
    schema_editor.execute(OLD_FUNCTION, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only_trigger")]

    operations = [
        migrations.AddField(
            model_name="chainhead",
            name="witnessed_seq",
            field=models.BigIntegerField(
                db_default=0, default=0, help_text="Seq of the stream's latest checkpoint appended to the witness."
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
