"""Verifying the stored audit trail against its hash chain, signed checkpoints, tombstones and the witness file.

Reports OK or exactly which records were edited, deleted, inserted, reordered or truncated at the tail, which
checkpoints were forged or removed, which records do not open under their data key (forged), which data keys were
destroyed without an ``audit.key.shred`` record (or shredded under a legal hold), and where the witness is missing,
behind the database or contradicts it. A failed verification is itself audited (``audit.tamper_detected``) and
raises an alert.

The witness is required: without it a database administrator can rewrite the whole trail consistently, or cut
its tail. Records older than ``GPUPOOL_AUDIT_CHECKPOINT_SECONDS`` + ``GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS`` must be
covered by a witnessed checkpoint; younger ones are the tail window (a warning). ``witness_required=False``
(``audit_verify --no-witness``) checks the database alone and says so.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit import chain, conf, crypto, witness
from audit.chain import Finding
from audit.models import PLATFORM_STREAM, AuditRecord, ChainHead, Checkpoint, DataKey, Tombstone, tenant_stream
from audit.services import _raw_key, audit_record, open_details, raise_alert, record_header
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
    witness_required: bool = True
    witness_entries: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "streams": self.streams,
            "records": self.records,
            "checkpoints": self.checkpoints,
            "findings": [f.as_dict() for f in self.findings],
            "warnings": self.warnings,
            "witness_required": self.witness_required,
            "witness_entries": self.witness_entries,
        }


@dataclass(frozen=True)
class _WitnessRule:
    """What the witness must cover: every record (and checkpoint, tombstone) older than ``cutoff``."""

    required: bool
    cutoff: dt.datetime
    window_seconds: int
    now: dt.datetime


def _signed_moment(value: str) -> dt.datetime | None:
    try:
        moment = dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _span(seqs: list[int]) -> str:
    return f"seq {seqs[0]}" if len(seqs) == 1 else f"seq {seqs[0]}..{seqs[-1]}"


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
    rule: _WitnessRule,
    witness_known: bool,
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
    if rule.required and witness_known:
        findings.extend(_witness_coverage(stream, rows, db_checkpoints, witnessed, purged_through, rule, report))

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


def _witness_coverage(
    stream: str,
    rows: dict[int, AuditRecord],
    db_checkpoints: list[dict],
    witnessed: list[dict],
    purged_through: int,
    rule: _WitnessRule,
    report: VerificationReport,
) -> list[Finding]:
    """The witness must hold every checkpoint and tombstone, and cover every record, older than the window."""
    findings: list[Finding] = []
    witnessed_cps = {e["seq"] for e in witnessed if e.get("type") == "checkpoint"}
    missing_old, missing_new = [], []
    for cp in db_checkpoints:
        if cp["seq"] in witnessed_cps or cp["seq"] <= purged_through:
            continue
        signed = _signed_moment(cp["signed_at"])
        (missing_old if signed is None or signed < rule.cutoff else missing_new).append(cp["seq"])
    if missing_old:
        findings.append(
            Finding(
                chain.FINDING_WITNESS,
                stream,
                f"checkpoints at seq {missing_old} are missing from the witness file (signed more than "
                f"{rule.window_seconds} s ago): the witness was not written, or was rolled back",
                missing_old,
            )
        )
    if missing_new:
        report.warnings.append(f"{stream}: checkpoints at seq {missing_new} are not in the witness file yet")
    witnessed_tombstones = {e["through_seq"] for e in witnessed if e.get("type") == "tombstone"}
    for tombstone in Tombstone.objects.filter(stream=stream, through_seq__gt=0):
        if tombstone.through_seq in witnessed_tombstones:
            continue
        purged = _signed_moment(tombstone.purged_at)
        if purged is None or purged < rule.cutoff:
            findings.append(
                Finding(
                    chain.FINDING_WITNESS,
                    stream,
                    f"the tombstone through seq {tombstone.through_seq} is missing from the witness file",
                    [tombstone.through_seq],
                )
            )
    covered = max(
        [0]
        + [e["seq"] for e in witnessed if e.get("type") == "checkpoint"]
        + [e["through_seq"] for e in witnessed if e.get("type") == "tombstone"]
    )
    tail = sorted(seq for seq in rows if seq > covered)
    if tail:
        stale = [seq for seq in tail if rows[seq].created_at < rule.cutoff]
        oldest = min(rows[seq].created_at for seq in tail)
        age = (rule.now - oldest).total_seconds()
        if stale:
            findings.append(
                Finding(
                    chain.FINDING_WITNESS,
                    stream,
                    f"the witness is behind the database: records {_span(tail)} are covered by no witnessed "
                    f"checkpoint, the oldest written {age:.0f} s ago (allowed: {rule.window_seconds} s = "
                    "GPUPOOL_AUDIT_CHECKPOINT_SECONDS + GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS); is beat running "
                    "audit.checkpoint, and can it write the witness?",
                    stale,
                )
            )
        else:
            report.warnings.append(
                f"{stream}: records {_span(tail)} (written in the last {max(age, 0):.0f} s) are not witnessed yet "
                f"(the tail window, up to {rule.window_seconds} s)"
            )
    return findings


def _check_key_destruction(keys: dict[str, DataKey], report: VerificationReport) -> None:
    """Every destroyed data key must be named by an ``audit.key.shred`` record of the platform stream (sealed
    under the platform key, so it opens after the tenant's keys are gone), for the key's own tenant; and no
    shred record may fall inside a legal hold of its tenant as the chain itself records it (a hold released
    by hand in the table leaves no ``audit.legal_hold.release`` record, so it still counts)."""
    destroyed = [k for k in keys.values() if k.destroyed_at is not None or not bytes(k.wrapped_key)]
    shreds = list(
        AuditRecord.objects.filter(stream=PLATFORM_STREAM, action="audit.key.shred", outcome="success").order_by("seq")
    )
    if not destroyed and not shreds:
        return
    named: dict[str, tuple[Any, AuditRecord]] = {}
    shred_tenants: list[tuple[int, AuditRecord]] = []
    for record in shreds:
        details = open_details(record, keys.get(record.key_id))
        if not isinstance(details, dict):
            continue  # unreadable or forged: it vouches for nothing (the seal check names a forged one)
        for key_id in details.get("key_ids") or []:
            named[str(key_id)] = (details.get("tenant_id"), record)
        if isinstance(details.get("tenant_id"), int):
            shred_tenants.append((details["tenant_id"], record))
    for data_key in sorted(destroyed, key=lambda k: (k.tenant_id or 0, k.key_id)):
        owner = f"tenant {data_key.tenant_id}" if data_key.tenant_id is not None else "the platform"
        stream = tenant_stream(data_key.tenant_id) if data_key.tenant_id is not None else PLATFORM_STREAM
        how = []
        if data_key.destroyed_at is not None:
            how.append(f"destroyed_at {data_key.destroyed_at.isoformat()}")
        if not bytes(data_key.wrapped_key):
            how.append("wrapped key emptied")
        found = named.get(data_key.key_id)
        if found is None:
            report.findings.append(
                Finding(
                    chain.FINDING_KEY,
                    stream,
                    f"data key {data_key.key_id} of {owner} was destroyed ({', '.join(how)}) without an "
                    "audit.key.shred record naming it: it was shredded outside `gpupool audit_shred_tenant`",
                )
            )
        elif found[0] != data_key.tenant_id:
            report.findings.append(
                Finding(
                    chain.FINDING_KEY,
                    stream,
                    f"data key {data_key.key_id} of {owner} is named by the shred record platform seq "
                    f"{found[1].seq} for tenant {found[0]}, not its own tenant",
                    [found[1].seq],
                )
            )
    if not shred_tenants:
        return
    hold_records = AuditRecord.objects.filter(
        action__in=("audit.legal_hold.set", "audit.legal_hold.release"),
        tenant_id__in={tenant for tenant, _ in shred_tenants},
    ).order_by("created_at", "id")
    events_by_tenant: dict[int, list[AuditRecord]] = {}
    seen: set[str] = set()
    for record in hold_records:
        if record.event_id in seen:  # a platform operator's action is in two streams
            continue
        seen.add(record.event_id)
        events_by_tenant.setdefault(record.tenant_id, []).append(record)
    for tenant_id, shred in shred_tenants:
        active: dict[str, dt.datetime] = {}
        for event in events_by_tenant.get(tenant_id, []):
            if event.created_at > shred.created_at:
                break
            if event.action == "audit.legal_hold.set":
                active[event.target] = event.created_at
            else:
                active.pop(event.target, None)
        if active:
            holds = ", ".join(f"{target} (placed {moment.isoformat()})" for target, moment in sorted(active.items()))
            report.findings.append(
                Finding(
                    chain.FINDING_KEY,
                    PLATFORM_STREAM,
                    f"the shred record platform seq {shred.seq} destroyed tenant {tenant_id}'s data keys while "
                    f"the legal hold {holds} was active (no audit.legal_hold.release record before it)",
                    [shred.seq],
                )
            )


def verify_trail(
    *,
    actor: Any | None = None,
    record_result: bool = True,
    check_seals: bool = True,
    witness_required: bool = True,
    now: dt.datetime | None = None,
) -> VerificationReport:
    """Verify every stream. With ``record_result``, the run is audited (``audit.verify``), and a failure also
    records ``audit.tamper_detected`` and raises an alert.

    ``witness_required`` (the default) makes a missing, lagging or contradicting witness a failure; False checks
    the database alone (the report says so in a warning). ``now`` is the moment the window is measured from."""
    now = now or timezone.now()
    window = conf.witness_window_seconds()
    rule = _WitnessRule(
        required=witness_required, cutoff=now - dt.timedelta(seconds=window), window_seconds=window, now=now
    )
    report = VerificationReport(ok=True, witness_required=witness_required)
    entries = witness.entries() if witness_required else []
    report.witness_entries = len(entries)
    if not witness_required:
        report.warnings.append(
            "NO WITNESS: verified the database alone (--no-witness). A database administrator can rewrite the "
            "whole trail consistently or cut its tail, and this run cannot tell."
        )
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
    witness_known = any(e.get("type") in ("checkpoint", "tombstone") for e in entries)
    if witness_required and not witness_known:
        _no_witness_entries(heads, rule, report)
    for stream in sorted(streams):
        stream_entries = [e for e in entries if e.get("stream") == stream]
        _verify_stream(
            stream, heads.get(stream), trusted, stream_entries, keys, report, check_seals, rule, witness_known
        )
    _check_key_destruction(keys, report)
    report.streams = len(streams)
    report.ok = not report.findings
    if record_result:
        _record_result(report, actor)
    return report


def _no_witness_entries(heads: dict[str, ChainHead], rule: _WitnessRule, report: VerificationReport) -> None:
    """The witness holds nothing for this database. Fine for a new installation whose first records are younger
    than the window; a failure once anything should have been witnessed (a checkpoint or tombstone exists, a
    head was ever checkpointed, or a record is older than the window) — e.g. every audit table truncated."""
    old_records = AuditRecord.objects.filter(created_at__lt=rule.cutoff).count()
    checkpoints = Checkpoint.objects.count()
    tombstones = Tombstone.objects.count()
    checkpointed_heads = sum(1 for head in heads.values() if head.checkpoint_seq > 0)
    if not (old_records or checkpoints or tombstones or checkpointed_heads):
        if AuditRecord.objects.exists():
            report.warnings.append(
                "the witness holds no entries for this database yet; its records are younger than "
                f"{rule.window_seconds} s (a new installation)"
            )
        return
    report.findings.append(
        Finding(
            chain.FINDING_WITNESS,
            "",
            f"the witness file {conf.witness_path()} holds no entries for this database "
            f"({witness.database_identity()}), but the database has {old_records} records older than "
            f"{rule.window_seconds} s, {checkpoints} checkpoints, {tombstones} tombstones and {checkpointed_heads} "
            "checkpointed chain heads: the witness was lost or never written, or the database was replaced. Point "
            "GPUPOOL_AUDIT_WITNESS_PATH at the witness (or run with --no-witness, which cannot detect a rewrite)",
        )
    )


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
