"""The quotas and approvals point at ``catalog.ResourceFlavor``; ``FlavorPrice`` now belongs to the catalogue.

State only: the foreign keys keep their columns and constraints (the flavor table kept its name,
``scheduler_resourceflavor``) and ``tenants_flavorprice`` stays where it is, owned by ``catalog.FlavorPrice``.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0001_initial"),
        ("tenants", "0005_tenant_storage_usage"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="approvalrequest",
                    name="flavor",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        to="catalog.resourceflavor",
                    ),
                ),
                migrations.AlterField(
                    model_name="quota",
                    name="flavor",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="quotas",
                        to="catalog.resourceflavor",
                    ),
                ),
                migrations.DeleteModel(name="FlavorPrice"),
            ],
            database_operations=[],
        ),
    ]
