"""Input and output shapes of the fleet API."""

from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from kernel.serializers import JsonTypedSerializer
from scheduler import launch
from scheduler.fleet.models import Node


class BootstrapTokenCreateInput(JsonTypedSerializer):
    ttl_s = serializers.IntegerField(required=False, help_text="seconds the token stays valid (default 3600)")
    description = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")

    def validate_ttl_s(self, value: int) -> int:
        return value if value is not None else settings.GPUPOOL_BOOTSTRAP_TOKEN_TTL_S


class BootstrapTokenOutput(serializers.Serializer):
    id = serializers.IntegerField()
    token = serializers.CharField(help_text="shown once; give it to `gpupool-agent register`")
    prefix = serializers.CharField()
    expires_at = serializers.DateTimeField()


class RegisterInput(JsonTypedSerializer):
    token = serializers.CharField(max_length=200)
    node_name = serializers.CharField(max_length=128)
    hostname = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    agent_version = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")


class RegisterOutput(serializers.Serializer):
    node_id = serializers.IntegerField()
    node_name = serializers.CharField()
    credential = serializers.CharField(help_text="the node's secret; store it with mode 0600")
    ws_url = serializers.CharField()


class NodeSerializer(serializers.ModelSerializer):
    device_count = serializers.SerializerMethodField()
    sandbox = serializers.CharField(
        source="agent.sandbox",
        default="",
        allow_null=True,  # a node that never registered an agent has none: null
        read_only=True,
        help_text="how the node's agent confines workloads: namespaces, none (unconfined: development), '' (old agent)",
    )

    network_isolation = serializers.CharField(
        source="agent.network_isolation",
        default="",
        allow_null=True,
        read_only=True,
        help_text="how the node keeps other tenants' jobs from a job's ports: nftables, none, '' (old agent)",
    )
    job_ports = serializers.SerializerMethodField(help_text="the ports this node hands to jobs, first-last")

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "address",
            "job_ports",
            "network_isolation",
            "status",
            "labels",
            "cpu_cores",
            "memory_mib",
            "last_heartbeat_at",
            "agent_version",
            "sandbox",
            "topology",
            "device_count",
            "created_at",
        ]

    def get_device_count(self, node: Node) -> int:
        return len(node.devices.all())

    def get_job_ports(self, node: Node) -> str:
        ports = launch.port_range(node)
        return f"{ports.start}-{ports.stop - 1}"


class NodeDrainSerializer(JsonTypedSerializer):
    grace_s = serializers.FloatField(min_value=0, max_value=3600, required=False, default=30.0)


class NodeWithAgentSerializer(NodeSerializer):
    """A node as those who may read node agents (``fleet.view``) see it: with its agent's host and the times its
    connection came, went and its lease ran out."""

    hostname = serializers.CharField(source="agent.hostname", default="", allow_null=True, read_only=True)
    connected_at = serializers.DateTimeField(source="agent.connected_at", default=None, allow_null=True, read_only=True)
    disconnected_at = serializers.DateTimeField(
        source="agent.disconnected_at", default=None, allow_null=True, read_only=True
    )
    lost_at = serializers.DateTimeField(source="agent.lost_at", default=None, allow_null=True, read_only=True)

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "hostname", "connected_at", "disconnected_at", "lost_at"]


class NodeRevokeOutput(serializers.Serializer):
    node_id = serializers.IntegerField()
    revoked = serializers.IntegerField(help_text="how many live credentials were revoked")


class DeviceRehomeInput(serializers.Serializer):
    node = serializers.CharField(max_length=128, help_text="name of the node the card now sits in")


class DeviceRehomeOutput(serializers.Serializer):
    id = serializers.IntegerField()
    uuid = serializers.CharField()
    node = serializers.CharField()
    index = serializers.IntegerField()


class TelemetryHistoryQuery(serializers.Serializer):
    """``GET /api/v1/telemetry/history/``: which cards, how far back, per card or per flavor."""

    minutes = serializers.IntegerField(
        min_value=1, max_value=24 * 60, default=60, help_text="How many minutes back (1 to 1440, default 60)."
    )
    node = serializers.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, help_text="Only the cards of this node."
    )
    device = serializers.ListField(
        child=serializers.CharField(max_length=64),
        required=False,
        max_length=64,
        help_text="Only these cards (device UUIDs; repeat the parameter for several).",
    )
    by = serializers.ChoiceField(
        choices=["device", "flavor"],
        default="device",
        help_text="`device`: one series per card; `flavor`: the average utilisation of the cards of each flavor.",
    )

    def validate(self, attrs: dict) -> dict:
        if attrs["by"] == "flavor" and ("node" in attrs or attrs.get("device")):
            raise serializers.ValidationError(
                {"by": ["by=flavor averages every card you may see; leave out node and device, or use by=device."]}
            )
        return attrs


class TelemetryCardHistory(serializers.Serializer):
    uuid = serializers.CharField()
    node = serializers.IntegerField()
    node_name = serializers.CharField()
    index = serializers.IntegerField()
    flavor = serializers.CharField()
    memory_mib = serializers.IntegerField()
    t = serializers.ListField(child=serializers.FloatField(), help_text="Epoch seconds, the middle of each minute.")
    utilization_pct = serializers.ListField(child=serializers.FloatField())
    memory_used_mib = serializers.ListField(child=serializers.FloatField())
    power_w = serializers.ListField(child=serializers.FloatField(allow_null=True))
    temperature_c = serializers.ListField(child=serializers.FloatField(allow_null=True))


class TelemetryFlavorHistory(serializers.Serializer):
    flavor = serializers.CharField()
    t = serializers.ListField(child=serializers.FloatField())
    utilization_pct = serializers.ListField(child=serializers.FloatField())
    cards = serializers.ListField(child=serializers.IntegerField(), help_text="Cards averaged in each minute.")


class TelemetryHistoryOutput(serializers.Serializer):
    minutes = serializers.IntegerField()
    until = serializers.DateTimeField(help_text="When the history was read; live telemetry continues from here.")
    devices = TelemetryCardHistory(many=True, required=False)
    flavors = TelemetryFlavorHistory(many=True, required=False)
