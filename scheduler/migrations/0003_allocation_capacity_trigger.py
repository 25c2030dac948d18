"""On PostgreSQL, refuse at the database any active allocation that takes a device past 1000 millis or its
memory, whoever writes it. The trigger locks the device row first, so two concurrent inserts onto one device
are serialised and the second sees the first. SQLite serialises writers (IMMEDIATE transactions), and the
service layer re-checks capacity inside the transaction, so nothing is needed there."""

from django.db import migrations

CREATE = r"""
CREATE OR REPLACE FUNCTION scheduler_allocation_check_capacity() RETURNS trigger AS $$
DECLARE
    used_millis bigint;
    used_memory bigint;
    device_memory bigint;
BEGIN
    IF NEW.ended_at IS NOT NULL THEN
        RETURN NEW;
    END IF;
    SELECT memory_mib INTO device_memory FROM scheduler_device WHERE id = NEW.device_id FOR UPDATE;
    SELECT COALESCE(SUM(millis), 0), COALESCE(SUM(memory_mib), 0) INTO used_millis, used_memory
      FROM scheduler_allocation
     WHERE device_id = NEW.device_id AND ended_at IS NULL AND id <> NEW.id;
    IF used_millis + NEW.millis > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '23514', MESSAGE = 'device ' || NEW.device_id || ' would be double-booked: '
            || used_millis || ' + ' || NEW.millis || ' millis > 1000';
    END IF;
    IF used_memory + NEW.memory_mib > device_memory THEN
        RAISE EXCEPTION USING ERRCODE = '23514', MESSAGE = 'device ' || NEW.device_id || ' memory exceeded: '
            || used_memory || ' + ' || NEW.memory_mib || ' MiB > ' || device_memory || ' MiB';
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER scheduler_allocation_capacity
BEFORE INSERT OR UPDATE OF millis, memory_mib, device_id, ended_at ON scheduler_allocation
FOR EACH ROW EXECUTE FUNCTION scheduler_allocation_check_capacity();
"""

DROP = r"""
DROP TRIGGER IF EXISTS scheduler_allocation_capacity ON scheduler_allocation;
DROP FUNCTION IF EXISTS scheduler_allocation_check_capacity();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # A plain cursor without parameters: keep the SQL free of parameter parsing.
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0002_jobs_allocations_outbox")]

    operations = [migrations.RunPython(forwards, backwards)]
