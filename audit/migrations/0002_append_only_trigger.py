"""On PostgreSQL, refuse UPDATE and DELETE on audit records at the database level.

A purge beyond retention sets the transaction-local ``gpupool.audit_purge`` flag to delete (and leaves a signed
tombstone). TRUNCATE is not blocked: Django's test flush uses it; truncation is detected by ``audit_verify``
through the chain head, the checkpoints and the witness file.
"""

from django.db import migrations

CREATE = """
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
DROP TRIGGER IF EXISTS audit_record_append_only ON audit_auditrecord;
CREATE TRIGGER audit_record_append_only BEFORE UPDATE OR DELETE ON audit_auditrecord
    FOR EACH ROW EXECUTE FUNCTION audit_record_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS audit_record_append_only ON audit_auditrecord;
DROP FUNCTION IF EXISTS audit_record_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
