from __future__ import annotations

from rest_framework import serializers


class AuditRecordSerializer(serializers.Serializer):
    """A record as ``audit.selectors.readable`` opens it (details decrypted, or "[shredded]")."""

    id = serializers.IntegerField()
    stream = serializers.CharField()
    seq = serializers.IntegerField()
    event_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    actor_id = serializers.IntegerField(allow_null=True)
    actor_username = serializers.CharField()
    actor_role = serializers.CharField()
    actor_ip = serializers.CharField(allow_null=True)
    user_agent = serializers.CharField()
    tenant_id = serializers.IntegerField(allow_null=True)
    action = serializers.CharField()
    target = serializers.CharField()
    outcome = serializers.CharField()
    request_id = serializers.CharField()
    cipher = serializers.CharField()
    key_id = serializers.CharField()
    details = serializers.JSONField()
    prev_hash = serializers.CharField()
    hash = serializers.CharField()


class ExportQuerySerializer(serializers.Serializer):
    start = serializers.DateTimeField(help_text="from (inclusive), ISO 8601")
    end = serializers.DateTimeField(help_text="to (exclusive), ISO 8601")
    tenant = serializers.IntegerField(required=False, allow_null=True, default=None)

    def validate(self, attrs: dict) -> dict:
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": "must be after start"})
        return attrs


class VerificationSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    streams = serializers.IntegerField()
    records = serializers.IntegerField()
    checkpoints = serializers.IntegerField()
    findings = serializers.ListField(child=serializers.DictField())
    warnings = serializers.ListField(child=serializers.CharField())
