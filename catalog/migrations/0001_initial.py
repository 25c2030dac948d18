"""The catalogue takes over ResourceFlavor (from the scheduler) and FlavorPrice (from the tenants app).

State only: the tables ``scheduler_resourceflavor`` and ``tenants_flavorprice`` already hold the rows and keep
their names, so a database migrated before the move goes on with no copy and no lock beyond Django's own
bookkeeping. This is why it depends on the last migrations of both apps: on a fresh database they create the
tables, this one only names their new owner. ``tenants.0006`` and ``scheduler.0011`` then point their foreign
keys here and drop the old models from their state.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("scheduler", "0010_job_output"),
        ("tenants", "0005_tenant_storage_usage"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ResourceFlavor",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID"),
                        ),
                        ("name", models.SlugField(max_length=64, unique=True)),
                        (
                            "vendor",
                            models.CharField(
                                choices=[
                                    ("nvidia", "NVIDIA"),
                                    ("ascend", "Huawei Ascend"),
                                    ("amd", "AMD"),
                                    ("hygon", "Hygon"),
                                    ("cambricon", "Cambricon"),
                                    ("simulated", "simulated"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("model", models.CharField(max_length=64)),
                        ("memory_mib", models.PositiveIntegerField()),
                        ("description", models.CharField(blank=True, default="", max_length=200)),
                        ("cpu_millicores_per_card", models.PositiveIntegerField(default=0)),
                        ("host_memory_mib_per_card", models.PositiveIntegerField(default=0)),
                    ],
                    options={
                        "db_table": "scheduler_resourceflavor",
                        "ordering": ["name"],
                    },
                ),
                migrations.CreateModel(
                    name="FlavorPrice",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID"),
                        ),
                        ("price_per_device_hour", models.DecimalField(decimal_places=4, max_digits=12)),
                        ("currency", models.CharField(default="CNY", max_length=3)),
                        (
                            "flavor",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="price",
                                to="catalog.resourceflavor",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "tenants_flavorprice",
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
