"""Retention: legal holds, crypto-shredding a tenant's data keys, and purging records past the retention period
behind signed tombstones."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from audit import chain, conf, witness
from audit.models import (
    PLATFORM_STREAM,
    AuditRecord,
    ChainHead,
    Checkpoint,
    Cosignature,
    DataKey,
    LegalHold,
    Outcome,
    Tombstone,
)
from audit.services.append import audit_record
from audit.services.checkpoints import checkpoint_create, signer_key_remember
from audit.services.records import data_key_cache, iso_utc
from audit.signing import get_signer
from kernel.api import ConflictError, DomainError


def _active_hold(tenant_id: int | None) -> LegalHold | None:
    return LegalHold.objects.filter(tenant_id=tenant_id, released_at__isnull=True).first()


def tenant_keys_shred(*, actor: Any | None, tenant_id: int, now: dt.datetime | None = None) -> int:
    """Destroy a tenant's data keys at the end of retention (crypto-shredding). Its records stay in the chain
    (hashes cover ciphertext, so the chain still verifies) but their details read as "[shredded]".

    Refused while the tenant is under legal hold or still has records inside the retention period. The
    destruction is itself a chain event: an ``audit.key.shred`` record naming the tenant and every key id is
    written in the same transaction, in the platform stream and sealed under the platform key (so it stays
    readable after the tenant's keys are gone), and the platform stream is checkpointed and witnessed right after
    the commit. ``audit_verify`` and the offline verifier fail on any destroyed key no such record names.
    Runs as the audit-admin database role (the portal's role cannot UPDATE data keys; docs/audit.md).
    """
    now = now or timezone.now()
    with transaction.atomic():
        hold = _active_hold(tenant_id)
        if hold is not None:
            raise ConflictError(
                f"Tenant {tenant_id} is under legal hold ({hold.reason!r}); release the hold before shredding.",
                code="legal_hold",
            )
        newest = AuditRecord.objects.filter(tenant_id=tenant_id).aggregate(newest=Max("created_at"))["newest"]
        keep_until = newest + dt.timedelta(days=conf.retention_days()) if newest else None
        if keep_until is not None and keep_until > now:
            raise ConflictError(
                f"Tenant {tenant_id} has audit records inside the {conf.retention_days()}-day retention period "
                f"until {keep_until:%Y-%m-%d}; shred after that date.",
                code="inside_retention",
            )
        keys = list(
            DataKey.objects.select_for_update().filter(tenant_id=tenant_id, destroyed_at__isnull=True).order_by("pk")
        )
        # The record first: no key is destroyed without it (it commits with the destruction or neither does).
        audit_record(
            action="audit.key.shred",
            actor=actor,
            target=f"tenant:{tenant_id}",
            details={"tenant_id": tenant_id, "key_ids": [k.key_id for k in keys], "destroyed_at": iso_utc(now)},
        )
        for data_key in keys:
            data_key.wrapped_key, data_key.destroyed_at = b"", now
            data_key.save(update_fields=["wrapped_key", "destroyed_at"])
            data_key_cache.pop(data_key.key_id, None)
        transaction.on_commit(lambda: checkpoint_create(stream=PLATFORM_STREAM))
    return len(keys)


def legal_hold_place(*, actor: Any | None, tenant_id: int | None, reason: str) -> LegalHold:
    if not reason.strip():
        raise DomainError("Give the reason for the legal hold (case or request number).", field="reason")
    with transaction.atomic():
        existing = _active_hold(tenant_id)
        if existing is not None:
            return existing
        hold = LegalHold.objects.create(
            tenant_id=tenant_id, reason=reason, placed_by=getattr(actor, "username", "") or ""
        )
        audit_record(
            action="audit.legal_hold.set",
            actor=actor,
            tenant=tenant_id,
            target=f"legal_hold:{hold.pk}",
            details={"reason": reason},
        )
    return hold


def legal_hold_release(*, actor: Any | None, tenant_id: int | None) -> int:
    with transaction.atomic():
        holds = list(LegalHold.objects.filter(tenant_id=tenant_id, released_at__isnull=True))
        for hold in holds:
            hold.released_at = timezone.now()
            hold.save(update_fields=["released_at"])
            audit_record(
                action="audit.legal_hold.release", actor=actor, tenant=tenant_id, target=f"legal_hold:{hold.pk}"
            )
    return len(holds)


# --- purge ------------------------------------------------------------------------------------------------


def records_purge(*, actor: Any | None, now: dt.datetime | None = None) -> list[Tombstone]:
    """Remove records older than the retention period and not under legal hold, leaving a signed tombstone per
    stream. Purges stop at a checkpoint boundary, so the tombstone names a signed head and the verifier starts
    the chain there. Runs as the audit-admin database role (the portal's role cannot DELETE records; see
    docs/audit.md). Returns the tombstones written."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=conf.retention_days())
    signer = get_signer()
    tombstones: list[Tombstone] = []
    with transaction.atomic():
        # Every head, in stream order: no record may be appended to a stream while it is being cut.
        list(ChainHead.objects.select_for_update().order_by("stream"))
        held = set(LegalHold.objects.filter(released_at__isnull=True).values_list("tenant_id", flat=True))
        for head in ChainHead.objects.order_by("stream"):
            stream_tenant = None if head.stream == PLATFORM_STREAM else int(head.stream.split(":", 1)[1])
            if stream_tenant in held:
                continue
            last = Tombstone.objects.filter(stream=head.stream).order_by("-through_seq").first()
            start = last.through_seq if last else 0
            limit_seq = None
            held_tenants = {t for t in held if t is not None}
            if head.stream == PLATFORM_STREAM and held_tenants:
                # Platform copies of actions on a held tenant's objects are held too.
                limit_seq = (
                    AuditRecord.objects.filter(stream=head.stream, seq__gt=start, tenant_id__in=held_tenants)
                    .order_by("seq")
                    .values_list("seq", flat=True)
                    .first()
                )
            old_seqs = AuditRecord.objects.filter(stream=head.stream, seq__gt=start, created_at__lt=cutoff)
            newest_old = old_seqs.aggregate(top=Max("seq"))["top"]
            if newest_old is None:
                continue
            # Only a checkpoint the witness cosigned: the witness accepts a purge only of what it has seen.
            cosigned = Cosignature.objects.filter(stream=head.stream).values("seq")
            candidates = Checkpoint.objects.filter(
                stream=head.stream, seq__gt=start, seq__lte=newest_old, seq__in=cosigned
            )
            if limit_seq is not None:
                candidates = candidates.filter(seq__lt=limit_seq)
            checkpoint = candidates.order_by("-seq").first()
            if checkpoint is None:
                continue
            doomed = AuditRecord.objects.filter(stream=head.stream, seq__gt=start, seq__lte=checkpoint.seq)
            purged = doomed.count()
            fields = {
                "stream": head.stream,
                "through_seq": checkpoint.seq,
                "through_hash": checkpoint.head_hash,
                "purged_count": purged + (last.purged_count if last else 0),
                "purged_at": iso_utc(now),
                "key_id": signer.key_id,
            }
            tombstone = Tombstone.objects.create(
                **fields, algorithm=signer.algorithm, signature=signer.sign(chain.tombstone_payload(fields))
            )
            # The tombstone first: the database's trigger lets a record be deleted only once a tombstone covers
            # it (migration 0003), so nothing but a purge that leaves signed proof can remove records.
            deleted, _ = doomed.delete()
            if deleted != purged:
                raise ConflictError(f"{head.stream}: expected to purge {purged} records, deleted {deleted}")
            tombstones.append(tombstone)
            # The witness records the purge before it commits: refused (or unreachable), nothing is purged.
            try:
                witness.get_witness().add_tombstone(witness.log_id(), tombstone.as_dict())
            except witness.WitnessError as exc:
                raise ConflictError(
                    f"{head.stream}: {witness.describe()} did not record the purge ({exc}); nothing was purged",
                    code="witness_refused",
                ) from exc
        signer_key_remember()
        audit_record(
            action="audit.purge",
            actor=actor,
            target="audit",
            outcome=Outcome.SUCCESS,
            details={
                "cutoff": iso_utc(cutoff),
                "tombstones": [{"stream": t.stream, "through_seq": t.through_seq} for t in tombstones],
            },
        )
    return tombstones
