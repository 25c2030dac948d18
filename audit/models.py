"""The audit trail. First cut: plain records; the audit issue adds encryption, the hash chain and
signed checkpoints behind the same ``audit.services.audit_record`` entry point."""

from __future__ import annotations

from django.db import models


class AuditRecord(models.Model):
    seq = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # Ids, not foreign keys: an audit row outlives the users and tenants it names.
    actor_id = models.BigIntegerField(null=True, blank=True)
    actor_username = models.CharField(max_length=150, blank=True, default="")
    actor_ip = models.GenericIPAddressField(null=True, blank=True)
    tenant_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    action = models.CharField(max_length=64, db_index=True)
    target = models.CharField(max_length=200, blank=True, default="")
    outcome = models.CharField(max_length=16, default="success")
    request_id = models.CharField(max_length=64, blank=True, default="")
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["seq"]
