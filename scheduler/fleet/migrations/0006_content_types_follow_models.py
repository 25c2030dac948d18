"""Hand the content types of the moved models to the fleet, so their permissions and admin log entries follow
them instead of being orphaned beside a fresh, empty set.

On a fresh database there are no content types yet (Django creates them after migrating): nothing to do.
"""

from django.db import migrations

MOVED = ["node", "device", "agentcommand"]


def forwards(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if content_type.objects.filter(app_label="fleet", model=model).exists():
            continue
        content_type.objects.filter(app_label="scheduler", model=model).update(app_label="fleet")


def backwards(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if content_type.objects.filter(app_label="scheduler", model=model).exists():
            continue
        content_type.objects.filter(app_label="fleet", model=model).update(app_label="scheduler")


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0005_nodes_devices_commands_move_here"),
        ("scheduler", "0012_nodes_move_to_fleet"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=True)]
