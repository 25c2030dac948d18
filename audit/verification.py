"""Verifying the stored audit trail against its hash chain, signed checkpoints, tombstones and the witness file.

Reports OK or exactly which records were edited, deleted, inserted, reordered or truncated at the tail, which
checkpoints were forged or removed, and which records do not open under their data key (forged). A failed
verification is itself audited (``audit.tamper_detected``) and raises an alert.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from audit import chain, crypto, witness
from audit.chain import Finding
from audit.models import AuditRecord, ChainHead, Checkpoint, DataKey, Tombstone
from audit.services import _raw_key, audit_record, raise_alert, record_header
from audit.signing import get_signer

logger = logging.getLogger(__name__)


@dataclass
class VerificationReport:
    ok: bool
    streams: int = 0
    records: int = 0
    checkpoints: int = 0
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "streams": self.streams,
            "records": self.records,
            "checkpoints": self.checkpoints,
            "findings": [f.as_dict() for f in self.findings],
            "warnings": self.warnings,
        }


def _trusted_keys(witness_entries: list[dict[str, Any]]) -> dict[str, str]:
    signer = get_signer()
    keys = {signer.key_id: signer.public_key_pem()}
    for entry in witness_entries:
        pem = entry.get("public_key_pem")
        if pem and chain.public_key_id(pem) == entry.get("key_id"):
            keys[entry["key_id"]] = pem
    return keys


def _chain_records(stream: str) -> tuple[list[chain.ChainRecord], dict[int, AuditRecord]]:
    chain_records: list[chain.ChainRecord] = []
    rows: dict[int, AuditRecord] = {}
    for record in AuditRecord.objects.filter(stream=stream).order_by("seq").iterator(chunk_size=2000):
        rows[record.seq] = record
        chain_records.append(
            chain.ChainRecord(
                seq=record.seq,
                header=record_header(record),
                ciphertext=bytes(record.ciphertext),
                prev_hash=record.prev_hash,
                hash=record.hash,
            )
        )
    return chain_records, rows


def _verify_stream(
    stream: str,
    head: ChainHead | None,
    trusted: dict[str, str],
    witnessed: list[dict],
    keys: dict[str, DataKey],
    report: VerificationReport,
    check_seals: bool,
) -> None:
    findings: list[Finding] = []
    # Where the chain starts: genesis, or the latest valid tombstone.
    start_seq, start_hash, purged_through = 1, chain.GENESIS_HASH, 0
    witnessed_tombstones = [e for e in witnessed if e.get("type") == "tombstone"]
    for tombstone in Tombstone.objects.filter(stream=stream).order_by("through_seq"):
        data = tombstone.as_dict()
        pem = trusted.get(tombstone.key_id)
        if pem is None or not chain.verify_ed25519(pem, tombstone.signature, chain.tombstone_payload(data)):
            findings.append(
                Finding(
                    chain.FINDING_TOMBSTONE,
                    stream,
                    f"tombstone through seq {tombstone.through_seq} has a bad signature (forged purge)",
                    [tombstone.through_seq],
                )
            )
            continue
        start_seq, start_hash, purged_through = tombstone.through_seq + 1, tombstone.through_hash, tombstone.through_seq
    for entry in witnessed_tombstones:
        if entry["through_seq"] > purged_through:
            findings.append(
                Finding(
                    chain.FINDING_TOMBSTONE,
                    stream,
                    f"the witness holds a tombstone through seq {entry['through_seq']} that the database lacks",
                    [entry["through_seq"]],
                )
            )

    records, rows = _chain_records(stream)
    report.records += len(records)
    if records and records[0].seq < start_seq:
        findings.append(
            Finding(
                chain.FINDING_INSERTED,
                stream,
                f"records before seq {start_seq} exist although a tombstone says they were purged",
                [r.seq for r in records if r.seq < start_seq],
            )
        )
        records = [r for r in records if r.seq >= start_seq]
    findings.extend(chain.walk_chain(stream, records, start_seq=start_seq, start_hash=start_hash))
    broken = {seq for f in findings for seq in f.seqs}

    # Forged: a well-linked record whose ciphertext does not open under its data key and header. Only someone
    # holding the keys could have written it, so this catches a rehashed (rewritten) or appended fake record.
    if check_seals:
        for record in records:
            if record.seq in broken:
                continue
            row = rows[record.seq]
            data_key = keys.get(row.key_id)
            if data_key is None:
                findings.append(
                    Finding(
                        chain.FINDING_FORGED,
                        stream,
                        f"record seq {record.seq} names an unknown data key {row.key_id}",
                        [record.seq],
                    )
                )
                continue
            try:
                raw = _raw_key(data_key)
            except crypto.KeyUnavailable:
                continue  # crypto-shredded: the hash chain still covers the ciphertext
            try:
                crypto.open_sealed(
                    row.cipher, raw, base64.b64decode(row.nonce), record.ciphertext, chain.canonical_json(record.header)
                )
            except (crypto.SealBroken, ValueError):
                findings.append(
                    Finding(
                        chain.FINDING_FORGED,
                        stream,
                        f"record seq {record.seq} does not open under its data key: it was forged or rewritten",
                        [record.seq],
                    )
                )

    # Checkpoints in the database and in the witness file.
    hashes = {r.seq: r.hash for r in records}
    db_checkpoints = [c.as_dict() for c in Checkpoint.objects.filter(stream=stream).order_by("seq")]
    report.checkpoints += len(db_checkpoints)
    findings.extend(chain.check_checkpoints(stream, db_checkpoints, hashes, trusted, purged_through=purged_through))
    witnessed_cps = [e for e in witnessed if e.get("type") == "checkpoint"]
    by_seq = {c["seq"]: c for c in db_checkpoints}
    for entry in witnessed_cps:
        stored = by_seq.get(entry["seq"])
        if stored is None:
            if entry["seq"] > purged_through:
                findings.append(
                    Finding(
                        chain.FINDING_WITNESS,
                        stream,
                        f"checkpoint at seq {entry['seq']} is in the witness file but was removed from the database",
                        [entry["seq"]],
                    )
                )
        elif stored["head_hash"] != entry["head_hash"] or stored["signature"] != entry["signature"]:
            findings.append(
                Finding(
                    chain.FINDING_WITNESS,
                    stream,
                    f"checkpoint at seq {entry['seq']} differs from its witnessed copy (rewritten)",
                    [entry["seq"]],
                )
            )
    findings.extend(chain.check_checkpoints(stream, witnessed_cps, hashes, trusted, purged_through=purged_through))
    witnessed_seqs = {e["seq"] for e in witnessed_cps}
    unwitnessed = [c["seq"] for c in db_checkpoints if c["seq"] not in witnessed_seqs and c["seq"] > purged_through]
    if unwitnessed:
        report.warnings.append(f"{stream}: checkpoints at seq {unwitnessed} are not in the witness file")

    # Tail truncation: the records end before what the head row, a checkpoint or the witness says exists.
    last = records[-1].seq if records else purged_through
    expected_tail = max(
        [head.seq if head else 0]
        + [c["seq"] for c in db_checkpoints]
        + [e["seq"] for e in witnessed_cps]
        + [purged_through]
    )
    if expected_tail > last:
        missing = list(range(last + 1, expected_tail + 1))
        findings.append(
            Finding(
                chain.FINDING_TRUNCATED,
                stream,
                f"the chain was truncated: records seq {missing[0]}..{missing[-1]} are missing at the tail",
                missing,
            )
        )
    elif head is not None and records and head.hash != records[-1].hash and head.seq == last:
        findings.append(
            Finding(
                chain.FINDING_EDITED,
                stream,
                f"the chain head names a different hash for seq {last} than the stored record",
                [last],
            )
        )
    seen: set[tuple[str, str]] = set()
    for finding in findings:
        if (finding.kind, finding.message) not in seen:
            seen.add((finding.kind, finding.message))
            report.findings.append(finding)


def verify_trail(
    *, actor: Any | None = None, record_result: bool = True, check_seals: bool = True
) -> VerificationReport:
    """Verify every stream. With ``record_result``, the run is audited (``audit.verify``), and a failure also
    records ``audit.tamper_detected`` and raises an alert."""
    report = VerificationReport(ok=True)
    entries = witness.entries()
    trusted = _trusted_keys(entries)
    heads = {h.stream: h for h in ChainHead.objects.all()}
    streams = (
        set(heads)
        | set(AuditRecord.objects.values_list("stream", flat=True).distinct())
        | set(Checkpoint.objects.values_list("stream", flat=True).distinct())
        | {e["stream"] for e in entries if "stream" in e}
    )
    keys = {k.key_id: k for k in DataKey.objects.all()}
    corrupt = [e["line"] for e in entries if e.get("type") == "corrupt"]
    if corrupt:
        report.findings.append(Finding(chain.FINDING_WITNESS, "", f"witness file lines {corrupt} are unreadable"))
    for stream in sorted(streams):
        stream_entries = [e for e in entries if e.get("stream") == stream]
        _verify_stream(stream, heads.get(stream), trusted, stream_entries, keys, report, check_seals)
    report.streams = len(streams)
    report.ok = not report.findings
    if record_result:
        _record_result(report, actor)
    return report


def _record_result(report: VerificationReport, actor: Any | None) -> None:
    with transaction.atomic():
        audit_record(
            action="audit.verify",
            actor=actor,
            target="audit",
            outcome="success" if report.ok else "failure",
            details={"records": report.records, "streams": report.streams, "findings": len(report.findings)},
        )
    if not report.ok:
        summary = "; ".join(f.message for f in report.findings[:10])
        with transaction.atomic():
            audit_record(
                action="audit.tamper_detected",
                actor=actor,
                target="audit",
                outcome="failure",
                details={"findings": [f.as_dict() for f in report.findings[:200]]},
            )
        raise_alert(
            event="audit.tamper_detected",
            message=f"audit verification found {len(report.findings)} problem(s): {summary}",
            details={"findings": [f.as_dict() for f in report.findings[:50]]},
        )
