"""Signed export bundles for assessors, checked offline by ``python -m audit.bundle_verifier bundle.zip``.

A bundle is a zip of::

    records.jsonl      one record per line: its hashed header, ciphertext (base64), prev_hash, hash, and the
                       opened details (for reading; the details are covered by the manifest signature)
    records.csv        the same records flattened for spreadsheets
    checkpoints.json   per stream: the anchor (the newest cosigned checkpoint before the range, with its compact
                       range, and its head record), every cosigned checkpoint after it up to the witness's latest
                       (C2SP notes with the witness's cosignature/v1), and the stream's tombstones
    trust.json         the log's genesis entry (its SHA-256 is the trust root the auditor pins) and the signing-key
                       rotations, each signed by its predecessor
    witness.json       the witness's signed manifest of every stream and its size at export time, and the purges
                       it recorded
    public_key.pem     the key that signed the manifest (it must be a key of the trust root's chain)
    datakeys.json      every data key the records name (tenant, destroyed or not) and, for each destroyed one, the
                       ``audit.key.shred`` record that destroyed it with an RFC 6962 inclusion proof against a
                       signed, cosigned checkpoint, so the offline verifier tells a shred from a key destroyed by hand
    manifest.json      what was asked for, what is included per stream, and the SHA-256 of every file above
    manifest.sig       the signature (base64) over manifest.json

Each stream's records run from its anchor to the size the witness cosigned last, so the offline verifier
recomputes the tree the witness signed: a record left out, a stream left out or a cut tail fails it. A range in
the past therefore carries the stream's records up to the export; that is the price of proving nothing after the
range's start was dropped.
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

from audit import chain, witness
from audit import messages as audit_messages
from audit import transparency as tp
from audit.csvsafe import formula_safe_row
from audit.models import (
    PLATFORM_STREAM,
    AuditRecord,
    ChainHead,
    Checkpoint,
    Cosignature,
    DataKey,
    Tombstone,
    tenant_stream,
)
from audit.services import audit_record, checkpoint_all, details_for, record_header, witness_genesis
from audit.services.checkpoints import witness_pending
from audit.services.records import iso_utc
from audit.signing import get_signer
from kernel.api import DomainError

BUNDLE_FORMAT = "gpupool-audit-bundle/3"
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
FILES = (
    "records.jsonl",
    "records.csv",
    "checkpoints.json",
    "trust.json",
    "witness.json",
    "datakeys.json",
    "public_key.pem",
)


def _cosigned(stream: str) -> list[Checkpoint]:
    cosigned = Cosignature.objects.filter(stream=stream).values("seq")
    return list(Checkpoint.objects.filter(stream=stream, seq__in=cosigned).order_by("seq"))


def _stream_segment(
    stream: str, start: dt.datetime, latest_size: int
) -> tuple[Checkpoint | None, AuditRecord | None, list[Checkpoint]]:
    """What a bundle holds of ``stream``: the anchor (the newest cosigned checkpoint whose head record is older
    than ``start``, or None to start at the chain's start), that head record, and the cosigned checkpoints after
    the anchor up to the witness's latest size. Every record from the anchor to that size goes in, so the offline
    verifier recomputes the tree the witness cosigned and nothing in the range can be left out."""
    checkpoints = [c for c in _cosigned(stream) if c.seq <= latest_size]
    if not checkpoints or checkpoints[-1].seq != latest_size:
        raise DomainError(audit_messages.WITNESSS_LATEST_CHECKPOINT_NOT_DATABASE(stream=stream))
    heads = dict(
        AuditRecord.objects.filter(stream=stream, seq__in=[c.seq for c in checkpoints]).values_list("seq", "created_at")
    )
    anchor = None
    for checkpoint in checkpoints:
        if checkpoint.compact_range and heads.get(checkpoint.seq) is not None and heads[checkpoint.seq] < start:
            anchor = checkpoint
    tombstone = Tombstone.objects.filter(stream=stream).order_by("-through_seq").first()
    if anchor is None and tombstone is not None:
        anchor = next((c for c in checkpoints if c.seq == tombstone.through_seq), None)
    anchor_record = AuditRecord.objects.filter(stream=stream, seq=anchor.seq).first() if anchor else None
    after = [c for c in checkpoints if anchor is None or c.seq > anchor.seq]
    return anchor, anchor_record, after


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
            "destroyed_at": iso_utc(k.destroyed_at) if k.destroyed_at else None,
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
        raise DomainError(audit_messages.EXPORT_RANGE_EMPTY_MUST_AFTER(), field="to")
    with transaction.atomic():
        checkpoint_all()  # sign the tail first, so the newest records are covered too
    streams_in_db = sorted(ChainHead.objects.values_list("stream", flat=True))
    witness_pending(streams_in_db)  # and have the witness cosign it now, not at the next beat
    client = witness.get_witness()
    log = witness.log_id()
    try:
        state = client.state(log)
        witness_manifest = client.manifest(log)
    except witness.WitnessError as exc:
        raise DomainError(audit_messages.WITNESS_CANNOT_READ_EXPORT_MUST(error=exc)) from exc
    signer = get_signer()
    witnessed = state["streams"]
    in_scope = [tenant_stream(tenant_id)] if tenant_id is not None else set(streams_in_db) | set(witnessed)
    streams = sorted(in_scope)

    lines: list[str] = []
    csv_buffer = io.StringIO()
    writer = csv.writer(csv_buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    anchors: dict[str, dict[str, Any]] = {}
    checkpoints: list[dict] = []
    tombstones: list[dict] = []
    included: dict[str, dict[str, Any]] = {}
    record_key_ids: set[str] = set()
    cosignatures = {(c.stream, c.seq): c.cosignature for c in Cosignature.objects.filter(stream__in=streams)}
    for stream in streams:
        latest = witnessed.get(stream)
        if latest is None:
            continue  # nothing witnessed yet (a stream younger than a checkpoint run)
        anchor, anchor_record, after = _stream_segment(stream, start, int(latest["size"]))
        lo = anchor.seq + 1 if anchor else 1
        hi = int(latest["size"])
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
        for checkpoint in ([anchor] if anchor else []) + after:
            checkpoints.append(
                checkpoint.as_dict()
                | {"compact_range": checkpoint.compact_range, "cosignature": cosignatures.get((stream, checkpoint.seq))}
            )
        if anchor_record is not None:
            anchors[stream] = _record_line(anchor_record, None)
        tombstones.extend(t.as_dict() for t in Tombstone.objects.filter(stream=stream))
        included[stream] = {"from_seq": lo, "to_seq": hi, "records": len(records), "anchor_seq": lo - 1}

    data_keys, shreds = _data_keys(record_key_ids)
    for shred in shreds:
        shred["cosignature"] = (
            cosignatures.get(("platform", shred["checkpoint"]["seq"]))
            or Cosignature.objects.filter(stream=PLATFORM_STREAM, seq=shred["checkpoint"]["seq"])
            .values_list("cosignature", flat=True)
            .first()
        )
    files = {
        "records.jsonl": ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8"),
        "records.csv": csv_buffer.getvalue().encode("utf-8"),
        "checkpoints.json": json.dumps(
            {"checkpoints": checkpoints, "tombstones": tombstones, "anchors": anchors}, indent=1, sort_keys=True
        ).encode("utf-8"),
        "trust.json": json.dumps(
            {"genesis": state["genesis"], "rotations": state.get("rotations", [])}, indent=1, sort_keys=True
        ).encode("utf-8"),
        "witness.json": json.dumps(
            {"manifest": witness_manifest, "tombstones": state.get("tombstones", {})}, indent=1, sort_keys=True
        ).encode("utf-8"),
        "datakeys.json": json.dumps(
            {"keys": data_keys, "shreds": shreds}, indent=1, sort_keys=True, ensure_ascii=False, default=str
        ).encode("utf-8"),
        "public_key.pem": signer.public_key_pem().encode("ascii"),
    }
    manifest = {
        "format": BUNDLE_FORMAT,
        "created_at": iso_utc(dt.datetime.now(dt.UTC)),
        "created_by": getattr(actor, "username", "") or "system",
        "range": {"from": iso_utc(start), "to": iso_utc(end)},
        "tenant_id": tenant_id,
        "log_id": log,
        "streams": included,
        "files": {name: hashlib.sha256(body).hexdigest() for name, body in files.items()},
        "signing_key_id": signer.key_id,
        "trust_root": tp.trust_root_fingerprint(state["genesis"]),
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


def trust_root() -> str:
    """The trust-root fingerprint an auditor pins (``python -m audit.bundle_verifier --trust-root``)."""
    return tp.trust_root_fingerprint(witness_genesis())


def bundle_public_key_id() -> str:
    """The id of the key bundles are signed with, to pin when verifying (``--key-id``)."""
    return chain.public_key_id(get_signer().public_key_pem())
