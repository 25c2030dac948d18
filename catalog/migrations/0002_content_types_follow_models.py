"""Hand the content types of the moved models to the catalogue, so their permissions and any generic relation
(admin log entries) follow them instead of being orphaned beside a fresh, empty pair.

On a fresh database there are no content types yet (Django creates them after migrating): nothing to do.
"""

from django.db import migrations

MOVED = [("scheduler", "resourceflavor"), ("tenants", "flavorprice")]


def forwards(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for old_label, model in MOVED:
        if content_type.objects.filter(app_label="catalog", model=model).exists():
            continue
        content_type.objects.filter(app_label=old_label, model=model).update(app_label="catalog")


def backwards(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for old_label, model in MOVED:
        if content_type.objects.filter(app_label=old_label, model=model).exists():
            continue
        content_type.objects.filter(app_label="catalog", model=model).update(app_label=old_label)


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=True)]
