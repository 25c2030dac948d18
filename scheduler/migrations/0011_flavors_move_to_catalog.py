"""Devices, allocations and reservations point at ``catalog.ResourceFlavor``; the scheduler no longer owns it.

State only: ``scheduler_resourceflavor`` keeps its name and rows under its new owner, so the foreign keys keep
their columns and constraints. It waits for ``tenants.0006``, whose models pointed at the old flavor until then.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0001_initial"),
        ("scheduler", "0010_job_output"),
        ("tenants", "0006_flavors_move_to_catalog"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="allocation",
                    name="flavor",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="allocations",
                        to="catalog.resourceflavor",
                    ),
                ),
                migrations.AlterField(
                    model_name="device",
                    name="flavor",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="devices",
                        to="catalog.resourceflavor",
                    ),
                ),
                migrations.AlterField(
                    model_name="inferencereservation",
                    name="flavor",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="reservations",
                        to="catalog.resourceflavor",
                    ),
                ),
                migrations.DeleteModel(name="ResourceFlavor"),
            ],
            database_operations=[],
        ),
    ]
