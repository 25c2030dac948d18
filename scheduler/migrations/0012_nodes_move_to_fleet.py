"""Allocations, reservations, holds, ports and outputs point at ``fleet.Node`` / ``fleet.Device``; the scheduler
no longer owns nodes, cards or the command outbox.

State only: the tables keep their names (``fleet.0005``), so the foreign keys keep their columns and constraints.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0005_nodes_devices_commands_move_here'),
        ('scheduler', '0011_flavors_move_to_catalog'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='device',
                    name='flavor',
                ),
                migrations.RemoveField(
                    model_name='device',
                    name='node',
                ),
                migrations.AlterField(
                    model_name='capacityhold',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='capacity_holds', to='fleet.device'),
                ),
                migrations.AlterField(
                    model_name='allocation',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='allocations', to='fleet.device'),
                ),
                migrations.AlterField(
                    model_name='inferencereservation',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='reservations', to='fleet.device'),
                ),
                migrations.AlterField(
                    model_name='allocation',
                    name='node',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='allocations', to='fleet.node'),
                ),
                migrations.AlterField(
                    model_name='replicaport',
                    name='node',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='ports', to='fleet.node'),
                ),
                migrations.AlterField(
                    model_name='inferencereservation',
                    name='node',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='reservations', to='fleet.node'),
                ),
                migrations.AlterField(
                    model_name='joboutput',
                    name='node',
                    field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleet.node'),
                ),
                migrations.DeleteModel(
                    name='AgentCommand',
                ),
                migrations.DeleteModel(
                    name='Device',
                ),
                migrations.DeleteModel(
                    name='Node',
                ),
    
            ],
        ),
    ]
