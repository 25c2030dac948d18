"""A record's canonical header and its sealed details: what its hash covers and how an auditor's code opens it.

Also the cache of unwrapped data keys, which appending (sealing) and reading (opening) share.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterable
from typing import Any

from audit import chain, crypto
from audit.models import AuditRecord, DataKey

SHREDDED = "[shredded]"
SEAL_BROKEN = "[seal broken]"


def iso_utc(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="microseconds")


def record_header(record: AuditRecord) -> dict[str, Any]:
    """The canonical header of a stored record (what its hash and its AEAD associated data cover)."""
    created = record.created_at
    return {
        "v": chain.HEADER_VERSION,
        "stream": record.stream,
        "seq": record.seq,
        "event_id": record.event_id,
        "time": iso_utc(created) if isinstance(created, dt.datetime) else str(created),
        "actor_id": record.actor_id,
        "actor_username": record.actor_username,
        "actor_role": record.actor_role,
        "actor_ip": record.actor_ip,
        "user_agent": record.user_agent,
        "tenant_id": record.tenant_id,
        "action": record.action,
        "target": record.target,
        "outcome": record.outcome,
        "request_id": record.request_id,
        "cipher": record.cipher,
        "key_id": record.key_id,
        "nonce": record.nonce,
    }


# key_id → (master_key_id, wrapped bytes, raw key). Checked against the row on every use, so a re-wrapped or
# destroyed key (or a rolled-back test database) is never served stale.
data_key_cache: dict[str, tuple[str, bytes, bytes]] = {}


def raw_data_key(data_key: DataKey) -> bytes:
    wrapped = bytes(data_key.wrapped_key)
    if data_key.destroyed_at is not None or not wrapped:
        raise crypto.KeyUnavailable(f"data key {data_key.key_id} was destroyed")
    cached = data_key_cache.get(data_key.key_id)
    if cached is not None and cached[0] == data_key.master_key_id and cached[1] == wrapped:
        return cached[2]
    raw = crypto.unwrap_data_key(
        key_id=data_key.key_id,
        tenant_id=data_key.tenant_id,
        cipher=data_key.cipher,
        master_key_id=data_key.master_key_id,
        wrapped=wrapped,
    )
    data_key_cache[data_key.key_id] = (data_key.master_key_id, wrapped, raw)
    return raw


def open_details(record: AuditRecord, data_key: DataKey | None) -> dict | str:
    """The record's details, ``"[shredded]"`` when its key was destroyed, ``"[seal broken]"`` if tampered."""
    if data_key is None:
        return SHREDDED
    try:
        raw = raw_data_key(data_key)
    except crypto.KeyUnavailable:
        return SHREDDED
    try:
        plaintext = crypto.open_sealed(
            record.cipher,
            raw,
            base64.b64decode(record.nonce),
            bytes(record.ciphertext),
            chain.canonical_json(record_header(record)),
        )
    except crypto.SealBroken:
        return SEAL_BROKEN
    return json.loads(plaintext)["details"]


def record_view(record: AuditRecord, details: dict | str) -> dict[str, Any]:
    """A record as an auditor reads it: the header fields, the opened ``details`` and the chain fields."""
    return {
        "id": record.pk,
        **record_header(record),
        "created_at": record.created_at,
        "details": details,
        "prev_hash": record.prev_hash,
        "hash": record.hash,
    }


def record_details(record: AuditRecord) -> dict | str:
    """The opened details (before/after dict) of one record, ``"[shredded]"`` after crypto-shredding or
    ``"[seal broken]"`` if tampered. Only auditors' code paths (selectors, exports) and tests call this."""
    return open_details(record, DataKey.objects.filter(key_id=record.key_id).first())


def details_for(records: Iterable[AuditRecord]) -> dict[int, dict | str]:
    """Details of many records with one query for their keys."""
    records = list(records)
    keys = {k.key_id: k for k in DataKey.objects.filter(key_id__in={r.key_id for r in records})}
    return {r.pk: open_details(r, keys.get(r.key_id)) for r in records}
