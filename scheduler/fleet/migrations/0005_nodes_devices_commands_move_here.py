"""The fleet takes over Node, Device and AgentCommand from the scheduler.

State only: the tables ``scheduler_node``, ``scheduler_device`` and ``scheduler_agentcommand`` keep their names,
rows, constraints and indexes, so a database migrated before the move goes on with no copy. The fleet's own
foreign keys (agents, credentials, tokens, reports, telemetry) point at the new owner here;
``scheduler.0012`` then points the jobs' and allocations' keys here and drops the old models from its state.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('catalog', '0002_content_types_follow_models'),
        ('fleet', '0004_nodeagent_network_isolation'),
        ('scheduler', '0011_flavors_move_to_catalog'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Node',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=128, unique=True)),
                        ('labels', models.JSONField(blank=True, default=dict)),
                        ('cpu_cores', models.PositiveIntegerField(default=0)),
                        ('memory_mib', models.PositiveBigIntegerField(default=0)),
                        ('status', models.CharField(choices=[('ready', 'ready'), ('not_ready', 'not ready'), ('cordoned', 'cordoned'), ('draining', 'draining')], default='not_ready', max_length=16)),
                        ('last_heartbeat_at', models.DateTimeField(blank=True, null=True)),
                        ('agent_version', models.CharField(blank=True, default='', max_length=32)),
                        ('topology', models.JSONField(blank=True, default=dict)),
                        ('address', models.CharField(blank=True, default='', max_length=255)),
                        ('job_port_first', models.PositiveIntegerField(blank=True, null=True)),
                        ('job_port_last', models.PositiveIntegerField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        'db_table': 'scheduler_node',
                        'ordering': ['name'],
                    },
                ),
                migrations.CreateModel(
                    name='Device',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('index', models.PositiveSmallIntegerField()),
                        ('uuid', models.CharField(max_length=96, unique=True)),
                        ('vendor', models.CharField(choices=[('nvidia', 'NVIDIA'), ('ascend', 'Huawei Ascend'), ('amd', 'AMD'), ('hygon', 'Hygon'), ('cambricon', 'Cambricon'), ('simulated', 'simulated')], max_length=16)),
                        ('model', models.CharField(max_length=64)),
                        ('memory_mib', models.PositiveIntegerField()),
                        ('numa_node', models.SmallIntegerField(blank=True, null=True)),
                        ('pci_bus_id', models.CharField(blank=True, default='', max_length=32)),
                        ('health', models.CharField(choices=[('healthy', 'healthy'), ('degraded', 'degraded'), ('unhealthy', 'unhealthy')], default='healthy', max_length=16)),
                        ('mig_mode', models.BooleanField(default=False)),
                        ('nvlink_domain', models.CharField(blank=True, default='', max_length=64)),
                        ('pcie_switch', models.CharField(blank=True, default='', max_length=64)),
                        ('flavor', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='devices', to='catalog.resourceflavor')),
                        ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='devices', to='fleet.node')),
                    ],
                    options={
                        'db_table': 'scheduler_device',
                        'ordering': ['node__name', 'index'],
                    },
                ),
                migrations.AlterField(
                    model_name='telemetryhour',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.device'),
                ),
                migrations.AlterField(
                    model_name='telemetryminute',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.device'),
                ),
                migrations.CreateModel(
                    name='AgentCommand',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('command_type', models.CharField(max_length=32)),
                        ('payload', models.JSONField()),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('sent_at', models.DateTimeField(blank=True, null=True)),
                        ('acked_at', models.DateTimeField(blank=True, null=True)),
                        ('ack_ok', models.BooleanField(blank=True, null=True)),
                        ('error', models.CharField(blank=True, default='', max_length=500)),
                        ('attempts', models.PositiveIntegerField(default=0)),
                        ('job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='commands', to='scheduler.job')),
                        ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='commands', to='fleet.node')),
                    ],
                    options={
                        'db_table': 'scheduler_agentcommand',
                        'ordering': ['id'],
                    },
                ),
                migrations.AlterField(
                    model_name='agentreport',
                    name='node',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.node'),
                ),
                migrations.AlterField(
                    model_name='bootstraptoken',
                    name='used_by_node',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleet.node'),
                ),
                migrations.AlterField(
                    model_name='nodeagent',
                    name='node',
                    field=models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='agent', serialize=False, to='fleet.node'),
                ),
                migrations.AlterField(
                    model_name='nodecredential',
                    name='node',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='credentials', to='fleet.node'),
                ),
                migrations.AddConstraint(
                    model_name='device',
                    constraint=models.UniqueConstraint(fields=('node', 'index'), name='device_unique_node_index'),
                ),
                migrations.AddIndex(
                    model_name='agentcommand',
                    index=models.Index(fields=['node', 'acked_at'], name='agentcommand_node_unacked'),
                ),
    
            ],
        ),
    ]
