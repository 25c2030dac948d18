"""Signed export bundles for assessors, checked offline by ``python -m audit.verify bundle.zip``.

A bundle is a zip of::

    records.jsonl      one record per line: its hashed header, ciphertext (base64), prev_hash, hash, and the
                       opened details (for reading; the details are covered by the manifest signature)
    records.csv        the same records flattened for spreadsheets
    checkpoints.json   the signed checkpoints covering the records (and the one before, which the first record
                       links to) and any tombstones of the streams
    keys.json          the public keys (PEM) that signed the checkpoints, by key id
    public_key.pem     the key that signed the manifest
    datakeys.json      every data key the records name (tenant, destroyed or not) and, for each destroyed one, the
                       ``audit.key.shred`` record that destroyed it with an RFC 6962 inclusion proof against a
                       signed checkpoint, so the offline verifier can tell a shred from a key destroyed by hand
    manifest.json      what was asked for, what is included per stream, and the SHA-256 of every file above
    manifest.sig       the signature (base64) over manifest.json

The requested time range is widened to whole checkpoint ranges, so every record in the bundle is covered by a
signed Merkle root and the chain can be checked end to end without the database.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import hashlib
import io
import json
import zipfile
from typing import Any

from django.db import transaction
from django.db.models import Max, Min

from audit import chain
from audit.csvsafe import formula_safe_row
from audit.models import (
    PLATFORM_STREAM,
    AuditRecord,
    ChainHead,
    Checkpoint,
    DataKey,
    SigningKey,
    Tombstone,
    tenant_stream,
)
from audit.services import _iso, audit_record, checkpoint_all, details_for, record_header
from audit.signing import get_signer
from portal.api import DomainError

BUNDLE_FORMAT = "gpupool-audit-bundle/2"
CSV_COLUMNS = [
    "stream",
    "seq",
    "time",
    "event_id",
    "actor_id",
    "actor_username",
    "actor_role",
    "actor_ip",
    "user_agent",
    "tenant_id",
    "action",
    "target",
    "outcome",
    "request_id",
    "cipher",
    "key_id",
    "details",
    "prev_hash",
    "hash",
]
FILES = ("records.jsonl", "records.csv", "checkpoints.json", "keys.json", "datakeys.json", "public_key.pem")


def _stream_range(stream: str, start: dt.datetime, end: dt.datetime) -> tuple[int, int, dict | None] | None:
    """(first seq, last seq, checkpoint before the first) of the checkpoint ranges covering [start, end)."""
    found = AuditRecord.objects.filter(stream=stream, created_at__gte=start, created_at__lt=end).aggregate(
        lo=Min("seq"), hi=Max("seq")
    )
    if found["lo"] is None:
        return None
    covering_lo = Checkpoint.objects.filter(stream=stream, seq__gte=found["lo"]).order_by("seq").first()
    covering_hi = Checkpoint.objects.filter(stream=stream, seq__gte=found["hi"]).order_by("seq").first()
    if covering_lo is None or covering_hi is None:
        raise DomainError("The records are not covered by a checkpoint yet; try again in a moment.")
    previous = Checkpoint.objects.filter(stream=stream, seq__lt=covering_lo.from_seq).order_by("-seq").first()
    return covering_lo.from_seq, covering_hi.seq, previous.as_dict() if previous else None


def _record_line(record: AuditRecord, details: Any) -> dict[str, Any]:
    return {
        "header": record_header(record),
        "ciphertext": base64.b64encode(bytes(record.ciphertext)).decode("ascii"),
        "prev_hash": record.prev_hash,
        "hash": record.hash,
        "details": details,
    }


def _data_keys(key_ids: set[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``datakeys.json``: the keys the bundle's records name, and the shred records (with inclusion proofs against
    a signed checkpoint) of the destroyed ones. A key destroyed by hand has no shred record: the offline verifier
    then fails naming it."""
    keys = {
        k.key_id: {
            "tenant_id": k.tenant_id,
            "destroyed": k.destroyed_at is not None or not bytes(k.wrapped_key),
            "destroyed_at": _iso(k.destroyed_at) if k.destroyed_at else None,
        }
        for k in DataKey.objects.filter(key_id__in=key_ids)
    }
    destroyed = {key_id for key_id, info in keys.items() if info["destroyed"]}
    if not destroyed:
        return keys, []
    shreds: list[dict[str, Any]] = []
    records = list(AuditRecord.objects.filter(stream=PLATFORM_STREAM, action="audit.key.shred").order_by("seq"))
    opened = details_for(records)
    for record in records:
        details = opened[record.pk]
        if not isinstance(details, dict) or not destroyed & {str(k) for k in details.get("key_ids") or []}:
            continue
        checkpoint = Checkpoint.objects.filter(stream=PLATFORM_STREAM, from_seq__lte=record.seq, seq__gte=record.seq)
        checkpoint = checkpoint.order_by("seq").first()
        if checkpoint is None:
            continue  # not sealed yet: the verifier fails on the key, and the auditor exports again
        hashes = list(
            AuditRecord.objects.filter(stream=PLATFORM_STREAM, seq__gte=checkpoint.from_seq, seq__lte=checkpoint.seq)
            .order_by("seq")
            .values_list("hash", flat=True)
        )
        shreds.append(
            {
                "record": _record_line(record, details),
                "checkpoint": checkpoint.as_dict(),
                "proof": chain.inclusion_proof(hashes, record.seq - checkpoint.from_seq),
            }
        )
    return keys, shreds


def build_bundle(
    *, actor: Any | None, start: dt.datetime, end: dt.datetime, tenant_id: int | None = None
) -> tuple[bytes, dict[str, Any]]:
    """The bundle (zip bytes) and its manifest. The export is audited (``audit.export``)."""
    if end <= start:
        raise DomainError("The export range is empty: 'to' must be after 'from'.", field="to")
    checkpoint_all()  # sign the tail first, so the newest records are covered too
    signer = get_signer()
    if tenant_id is not None:
        streams = [tenant_stream(tenant_id)]
    else:
        streams = sorted(ChainHead.objects.values_list("stream", flat=True))

    lines: list[str] = []
    csv_buffer = io.StringIO()
    writer = csv.writer(csv_buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    checkpoints: list[dict] = []
    tombstones: list[dict] = []
    included: dict[str, dict[str, Any]] = {}
    record_key_ids: set[str] = set()
    for stream in streams:
        found = _stream_range(stream, start, end)
        if found is None:
            continue
        lo, hi, previous = found
        records = list(AuditRecord.objects.filter(stream=stream, seq__gte=lo, seq__lte=hi).order_by("seq"))
        details = details_for(records)
        for record in records:
            line = _record_line(record, details[record.pk])
            lines.append(json.dumps(line, sort_keys=True, ensure_ascii=False, default=str))
            record_key_ids.add(record.key_id)
            header = line["header"]
            # Formula-safe cells (audit.csvsafe): user agents, usernames and targets are attacker-controlled.
            writer.writerow(
                formula_safe_row(
                    [header.get(c, "") for c in CSV_COLUMNS[:16]]
                    + [
                        json.dumps(details[record.pk], sort_keys=True, ensure_ascii=False, default=str),
                        record.prev_hash,
                        record.hash,
                    ]
                )
            )
        stream_cps = [c.as_dict() for c in Checkpoint.objects.filter(stream=stream, seq__gte=lo, seq__lte=hi)]
        checkpoints.extend(([previous] if previous else []) + stream_cps)
        tombstones.extend(t.as_dict() for t in Tombstone.objects.filter(stream=stream))
        included[stream] = {"from_seq": lo, "to_seq": hi, "records": len(records)}

    data_keys, shreds = _data_keys(record_key_ids)
    checkpoints_for_keys = [shred["checkpoint"] for shred in shreds]
    key_ids = (
        {c["key_id"] for c in checkpoints + checkpoints_for_keys} | {t["key_id"] for t in tombstones} | {signer.key_id}
    )
    keys = {k.key_id: k.public_key_pem for k in SigningKey.objects.filter(key_id__in=key_ids)}
    keys[signer.key_id] = signer.public_key_pem()
    files = {
        "records.jsonl": ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8"),
        "records.csv": csv_buffer.getvalue().encode("utf-8"),
        "checkpoints.json": json.dumps(
            {"checkpoints": checkpoints, "tombstones": tombstones}, indent=1, sort_keys=True
        ).encode("utf-8"),
        "keys.json": json.dumps(keys, indent=1, sort_keys=True).encode("utf-8"),
        "datakeys.json": json.dumps(
            {"keys": data_keys, "shreds": shreds}, indent=1, sort_keys=True, ensure_ascii=False, default=str
        ).encode("utf-8"),
        "public_key.pem": signer.public_key_pem().encode("ascii"),
    }
    manifest = {
        "format": BUNDLE_FORMAT,
        "created_at": _iso(dt.datetime.now(dt.UTC)),
        "created_by": getattr(actor, "username", "") or "system",
        "range": {"from": _iso(start), "to": _iso(end)},
        "tenant_id": tenant_id,
        "streams": included,
        "files": {name: hashlib.sha256(body).hexdigest() for name, body in files.items()},
        "signing_key_id": signer.key_id,
        "algorithm": signer.algorithm,
    }
    manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    files["manifest.json"] = manifest_bytes
    files["manifest.sig"] = (signer.sign(manifest_bytes) + "\n").encode("ascii")

    output = io.BytesIO()
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for name, body in files.items():
            bundle.writestr(name, body)
    with transaction.atomic():
        audit_record(
            action="audit.export",
            actor=actor,
            tenant=tenant_id,
            target=f"tenant:{tenant_id}" if tenant_id is not None else PLATFORM_STREAM,
            details={
                "from": manifest["range"]["from"],
                "to": manifest["range"]["to"],
                "streams": included,
                "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
            },
        )
    return output.getvalue(), manifest


def bundle_public_key_id() -> str:
    """The id of the key bundles are signed with, to pin when verifying (``--key-id``)."""
    return chain.public_key_id(get_signer().public_key_pem())
