"""Input and output shapes of the fleet API."""

from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from kernel.serializers import JsonTypedSerializer
from scheduler.models import Node


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


class FleetNodeOutput(serializers.ModelSerializer):
    hostname = serializers.CharField(source="agent.hostname", default="", allow_null=True)
    connected_at = serializers.DateTimeField(source="agent.connected_at", default=None, allow_null=True)
    disconnected_at = serializers.DateTimeField(source="agent.disconnected_at", default=None, allow_null=True)
    lost_at = serializers.DateTimeField(source="agent.lost_at", default=None, allow_null=True)
    sandbox = serializers.CharField(
        source="agent.sandbox",
        default="",
        allow_null=True,  # a node that never registered an agent has none: null
        help_text="namespaces | none (unconfined, development) | '' (old agent)",
    )
    device_count = serializers.IntegerField()

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "status",
            "last_heartbeat_at",
            "agent_version",
            "hostname",
            "connected_at",
            "disconnected_at",
            "lost_at",
            "sandbox",
            "device_count",
        ]


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
