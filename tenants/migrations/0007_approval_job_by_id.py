"""An admission request names its job by id, not by a foreign key to ``scheduler.Job`` (issue 34: the tenants
app sits below the scheduler and its schema names none of the scheduler's tables).

The column ``job_id`` keeps its values: the field becomes a plain integer on the same column (Django drops the
foreign-key constraint), then takes the name of its column.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0006_flavors_move_to_catalog"),
    ]

    operations = [
        migrations.AlterField(
            model_name="approvalrequest",
            name="job",
            field=models.BigIntegerField(blank=True, db_column="job_id", db_index=True, null=True),
        ),
        migrations.RenameField(model_name="approvalrequest", old_name="job", new_name="job_id"),
    ]
