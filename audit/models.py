"""The audit trail's tables.

Streams: every tenant has its own hash chain (``tenant:<id>``) and the platform has one (``platform``). An action
lands in its tenant's stream; an action without a tenant, or one by a platform operator (a user with a platform
role) on a tenant's objects, lands in the platform stream — the latter in both, so a tenant can audit the
operator and the platform keeps its own complete record.

Rows keep ids, not foreign keys: an audit row outlives the users and tenants it names. Records are append-only:
no code path updates them; on PostgreSQL the portal's database role has no UPDATE, DELETE or TRUNCATE privilege on
them (``gpupool db_roles``), and triggers refuse UPDATE, TRUNCATE, and DELETE of any record no signed tombstone
covers (a purge writes its tombstone first). See docs/audit.md.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

PLATFORM_STREAM = "platform"


def tenant_stream(tenant_id: int) -> str:
    return f"tenant:{tenant_id}"


class Outcome(models.TextChoices):
    SUCCESS = "success", _("success")
    FAILURE = "failure", _("failure")
    DENIED = "denied", _("denied")
    ERROR = "error", _("error")


class AuditRecord(models.Model):
    id = models.BigAutoField(primary_key=True)
    stream = models.CharField(max_length=40)
    seq = models.BigIntegerField(help_text="Position in the stream's chain, from 1.")
    event_id = models.CharField(max_length=32, db_index=True, help_text="Shared by the copies of one event.")
    created_at = models.DateTimeField(db_index=True)
    actor_id = models.BigIntegerField(null=True, blank=True)
    actor_username = models.CharField(max_length=150, blank=True, default="")
    actor_role = models.CharField(max_length=32, blank=True, default="")
    actor_ip = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=300, blank=True, default="")
    tenant_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    action = models.CharField(max_length=64, db_index=True)
    target = models.CharField(max_length=200, blank=True, default="")
    outcome = models.CharField(max_length=16, default=Outcome.SUCCESS)
    request_id = models.CharField(max_length=64, blank=True, default="")
    cipher = models.CharField(max_length=16)
    key_id = models.CharField(max_length=32)
    nonce = models.CharField(max_length=32, help_text="Base64 AEAD nonce.")
    ciphertext = models.BinaryField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["stream", "seq"], name="audit_record_stream_seq_unique")]
        indexes = [models.Index(fields=["tenant_id", "created_at"], name="audit_tenant_time")]
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"{self.stream}#{self.seq} {self.action}"


class ChainHead(models.Model):
    """The last seq and hash of each stream, updated in the append's transaction; a cross-check for tail
    truncation between checkpoints."""

    stream = models.CharField(max_length=40, primary_key=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64)
    checkpoint_seq = models.BigIntegerField(default=0, help_text="Seq of the stream's latest checkpoint.")
    # Bookkeeping only (what the next checkpoint run still has to append to the witness); the verifier reads
    # the witness file itself, so a wrong value here hides nothing.
    witnessed_seq = models.BigIntegerField(
        default=0, db_default=0, help_text="Seq of the stream's latest checkpoint appended to the witness."
    )
    updated_at = models.DateTimeField(auto_now=True)


class DataKey(models.Model):
    """A per-tenant (or platform, tenant_id NULL) data key, stored wrapped by a master key.

    Destroying it (``destroyed_at`` set, wrapped key emptied) crypto-shreds the details sealed under it.
    """

    key_id = models.CharField(max_length=32, primary_key=True)
    tenant_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    cipher = models.CharField(max_length=16)
    master_key_id = models.CharField(max_length=64)
    wrapped_key = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)
    rewrapped_at = models.DateTimeField(null=True, blank=True)
    destroyed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]


class Checkpoint(models.Model):
    """A signed statement: stream ``stream`` had head ``head_hash`` at ``seq``, and the records
    ``from_seq..seq`` have RFC 6962 Merkle root ``merkle_root``."""

    stream = models.CharField(max_length=40)
    seq = models.BigIntegerField()
    from_seq = models.BigIntegerField()
    head_hash = models.CharField(max_length=64)
    merkle_root = models.CharField(max_length=64)
    signed_at = models.CharField(max_length=40, help_text="ISO 8601, exactly as signed.")
    algorithm = models.CharField(max_length=16)
    key_id = models.CharField(max_length=64)
    signature = models.TextField()
    # The same statement as a C2SP checkpoint over the whole stream's RFC 6962 tree (what the witness cosigns),
    # and the tree's compact range at ``seq`` (what the next checkpoint's consistency proof is computed from).
    tree_root = models.CharField(max_length=64, blank=True, default="", db_default="")
    compact_range = models.TextField(blank=True, default="", db_default="")
    note = models.TextField(blank=True, default="", db_default="")

    class Meta:
        ordering = ["stream", "seq"]
        constraints = [models.UniqueConstraint(fields=["stream", "seq"], name="audit_checkpoint_stream_seq_unique")]

    def as_dict(self) -> dict:
        return {
            "stream": self.stream,
            "seq": self.seq,
            "from_seq": self.from_seq,
            "head_hash": self.head_hash,
            "merkle_root": self.merkle_root,
            "signed_at": self.signed_at,
            "algorithm": self.algorithm,
            "key_id": self.key_id,
            "signature": self.signature,
            "tree_root": self.tree_root,
            "note": self.note,
        }


class Cosignature(models.Model):
    """A witness's ``cosignature/v1`` of a checkpoint's note: proof that the witness saw the checkpoint and that it
    extends everything the witness cosigned before. Self-authenticating (checked against the pinned witness key),
    insert-only."""

    stream = models.CharField(max_length=40)
    seq = models.BigIntegerField()
    witness_key = models.TextField(help_text="The witness's verifier key (C2SP vkey).")
    cosignature = models.TextField(help_text="The cosignature line, as the witness returned it.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["stream", "seq"]
        constraints = [models.UniqueConstraint(fields=["stream", "seq"], name="audit_cosignature_stream_seq_unique")]


class KeyRotation(models.Model):
    """A signing-key rotation: the new key, signed by the key it replaces (``audit.transparency.key_chain``).
    A copy of what the witness holds; insert-only."""

    number = models.PositiveIntegerField(primary_key=True)
    statement = models.JSONField()
    signature = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["number"]

    def as_dict(self) -> dict:
        return {"statement": self.statement, "signature": self.signature}


class Tombstone(models.Model):
    """Signed proof that a stream's records up to ``through_seq`` were purged at the end of retention; the
    verifier starts the chain at ``through_seq + 1`` from ``through_hash``."""

    stream = models.CharField(max_length=40)
    through_seq = models.BigIntegerField()
    through_hash = models.CharField(max_length=64)
    purged_count = models.BigIntegerField()
    purged_at = models.CharField(max_length=40, help_text="ISO 8601, exactly as signed.")
    algorithm = models.CharField(max_length=16)
    key_id = models.CharField(max_length=64)
    signature = models.TextField()

    class Meta:
        ordering = ["stream", "through_seq"]

    def as_dict(self) -> dict:
        return {
            "stream": self.stream,
            "through_seq": self.through_seq,
            "through_hash": self.through_hash,
            "purged_count": self.purged_count,
            "purged_at": self.purged_at,
            "algorithm": self.algorithm,
            "key_id": self.key_id,
            "signature": self.signature,
        }


class LegalHold(models.Model):
    """While active, a tenant's (or, tenant_id NULL, the platform's) records are neither purged nor shredded."""

    tenant_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    reason = models.CharField(max_length=300)
    placed_by = models.CharField(max_length=150, blank=True, default="")
    placed_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-placed_at"]


class SigningKey(models.Model):
    """Public keys that have signed checkpoints: a cache for reading. No verifier trusts a key because it is
    listed here; trust comes from the pinned trust root and signed rotations (``audit.transparency``)."""

    key_id = models.CharField(max_length=64, primary_key=True)
    algorithm = models.CharField(max_length=16)
    public_key_pem = models.TextField()
    first_used_at = models.DateTimeField(auto_now_add=True)


class IntegrityCheck(models.Model):
    """One run of the scheduled integrity check (``audit.integrity``): what it verified and what it found."""

    ran_at = models.DateTimeField(db_index=True)
    ok = models.BooleanField()
    full = models.BooleanField(
        help_text="Every stream walked end to end (else: the streams changed since the last run)."
    )
    streams = models.IntegerField(default=0)
    records = models.BigIntegerField(default=0)
    findings = models.JSONField(default=list, help_text="The first 50 findings.")
    heads = models.JSONField(default=dict, help_text="Each stream's head seq when it ran (what the next run compares).")

    class Meta:
        ordering = ["-ran_at", "-id"]


class Alert(models.Model):
    """An alert ``raise_alert`` raised (a failed audit write, an unreachable witness, a failed integrity check), kept
    so that operators see it in the console and acknowledge it, beside the CRITICAL log line and the hook.

    An alert that repeats while nobody has acknowledged it (the witness down for an hour: one per checkpoint run)
    is one row whose ``times_raised`` and ``last_raised_at`` move; once acknowledged, the next one opens a new row.
    Rows keep the acknowledger's id and name, not a foreign key (the audit app sits below the accounts).
    """

    event = models.CharField(max_length=64, db_index=True)
    message = models.TextField()
    details = models.JSONField(default=dict, blank=True)
    first_raised_at = models.DateTimeField()
    last_raised_at = models.DateTimeField(db_index=True)
    times_raised = models.PositiveIntegerField(default=1)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by_id = models.BigIntegerField(null=True, blank=True)
    acknowledged_by_username = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["-last_raised_at", "-id"]

    def __str__(self) -> str:
        return f"{self.event}: {self.message[:80]}"

    @property
    def acknowledged(self) -> bool:
        return self.acknowledged_at is not None
