"""Input and output shapes of the fleet API."""

from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from portal.serializers import JsonTypedSerializer
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
