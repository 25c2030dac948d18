"""The change log of the incremental snapshot (``scheduler.live_snapshot``): statement-level triggers on every
table the snapshot reads write the ids of the rows a statement inserted, deleted or changed (in a column the
snapshot reads) into ``scheduler_snapshotchange``, stamped with the transaction's id. PostgreSQL only; elsewhere
the snapshot is read in full every cycle.

The column lists are the snapshot's reads (``tests/scheduler/test_live_snapshot.py`` checks that they cover
every column ``scheduler.snapshot`` reads). A table marked ``None`` records every update.
"""

from django.db import migrations, models

# source name → (table, columns an update must change to count, or None: every update counts)
WATCHED = {
    "job": (
        "scheduler_job",
        (
            "tenant_id",
            "flavors",
            "any_flavor",
            "millis_per_replica",
            "memory_mib_per_replica",
            "cpu_millicores_per_replica",
            "host_memory_mib_per_replica",
            "priority_class",
            "preemptible",
            "submitted_at",
            "kind",
            "replicas",
            "topology",
            "min_replicas",
            "max_replicas",
            "node_selector",
            "preempted_by",
            "state",
            "runtime_estimate_s",
            "last_checkpoint_at",
            "preemption_count",
            "max_runtime_s",
        ),
    ),
    "allocation": ("scheduler_allocation", None),
    "reservation": ("scheduler_inferencereservation", None),
    "hold": ("scheduler_capacityhold", None),
    "node": ("scheduler_node", ("name", "status", "labels", "topology", "cpu_cores", "memory_mib")),
    "device": (
        "scheduler_device",
        ("node_id", "index", "uuid", "flavor_id", "memory_mib", "health", "nvlink_domain", "pcie_switch", "numa_node"),
    ),
    "tenant": ("tenants_tenant", ("slug", "parent_id")),
    "flavor": ("scheduler_resourceflavor", ("name",)),
    "quota": ("tenants_quota", None),
}
# The pending explanation a cycle writes is known to the cycle (it updates its own copy): that write, and only
# that one, sets ``gpupool.explanations_known`` for its statement, so it does not send every waiting job back
# through the change log each time the queue moves. Any other write of these columns counts.
EXPLANATION_COLUMNS = ("pending_reason_code", "pending_message", "position_in_tenant", "position_overall")

STAMP = "pg_current_xact_id()::text::bigint"


def _function(source: str, table: str, columns: tuple[str, ...] | None) -> str:
    if columns is None:
        changed = "TRUE"
    else:
        changed = " OR ".join(f"o.{c} IS DISTINCT FROM n.{c}" for c in columns)
    if source == "job":
        explained = " OR ".join(f"o.{c} IS DISTINCT FROM n.{c}" for c in EXPLANATION_COLUMNS)
        changed = (
            f"({changed}) OR (coalesce(current_setting('gpupool.explanations_known', true), '') <> 'on'"
            f" AND ({explained}))"
        )
    return f"""
CREATE OR REPLACE FUNCTION gpupool_snapshot_change_{source}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO scheduler_snapshotchange (xid, source, row_id) SELECT {STAMP}, '{source}', id FROM new_rows;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO scheduler_snapshotchange (xid, source, row_id) SELECT {STAMP}, '{source}', id FROM old_rows;
    ELSE
        INSERT INTO scheduler_snapshotchange (xid, source, row_id)
        SELECT {STAMP}, '{source}', n.id FROM new_rows n JOIN old_rows o ON o.id = n.id WHERE {changed};
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER gpupool_snapshot_{source}_insert AFTER INSERT ON {table}
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION gpupool_snapshot_change_{source}();
CREATE TRIGGER gpupool_snapshot_{source}_delete AFTER DELETE ON {table}
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION gpupool_snapshot_change_{source}();
CREATE TRIGGER gpupool_snapshot_{source}_update AFTER UPDATE ON {table}
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION gpupool_snapshot_change_{source}();
"""


# A TRUNCATE fires no row trigger: it leaves one mark, and a reader that sees it reads everything anew.
TRUNCATED = f"""
CREATE OR REPLACE FUNCTION gpupool_snapshot_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scheduler_snapshotchange (xid, source, row_id) VALUES ({STAMP}, '*', 0);
    RETURN NULL;
END $$;
"""


def _truncate(source: str, table: str) -> str:
    return (
        f"CREATE TRIGGER gpupool_snapshot_{source}_truncate AFTER TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION gpupool_snapshot_truncated();\n"
    )


def _drop(source: str, table: str) -> str:
    return (
        "".join(
            f"DROP TRIGGER IF EXISTS gpupool_snapshot_{source}_{event} ON {table};\n"
            for event in ("insert", "delete", "update", "truncate")
        )
        + f"DROP FUNCTION IF EXISTS gpupool_snapshot_change_{source}();\n"
    )


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(TRUNCATED)
        for source, (table, columns) in WATCHED.items():
            cursor.execute(_function(source, table, columns) + _truncate(source, table))


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for source, (table, _columns) in WATCHED.items():
            cursor.execute(_drop(source, table))
        cursor.execute("DROP FUNCTION IF EXISTS gpupool_snapshot_truncated();")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0013_job_arrays_as_one_record"),
        ("fleet", "0006_content_types_follow_models"),
        ("tenants", "0008_user_language"),
        ("catalog", "0002_content_types_follow_models"),
    ]

    operations = [
        migrations.CreateModel(
            name="SnapshotChange",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("xid", models.BigIntegerField(db_index=True)),
                ("source", models.CharField(max_length=16)),
                ("row_id", models.BigIntegerField()),
            ],
        ),
        migrations.CreateModel(
            name="SnapshotChangeHorizon",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("pruned_below", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(forwards, backwards),
    ]
