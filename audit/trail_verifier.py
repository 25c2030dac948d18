"""Verifying the stored audit trail against its hash chain, signed checkpoints, tombstones and the witness.

Reports OK or exactly which records were edited, deleted, inserted, reordered or truncated at the tail, which
checkpoints were forged or removed, which records do not open under their data key (forged) or cannot be checked
(a data key that does not unwrap: fail closed, never skipped), which data keys were destroyed without an
``audit.key.shred`` record (or shredded or purged under a legal hold), and where the witness contradicts the
database. A failed verification is itself audited (``audit.tamper_detected``) and raises an alert.

Trust comes from outside the database: the trust root (the log's genesis entry in the witness, pinned by its
fingerprint, ``GPUPOOL_AUDIT_TRUST_ROOT``) names the first signing key and the witness's key; later signing keys
count only through rotations signed by their predecessors. No key is trusted because a database row lists it.
The witness's latest cosigned checkpoint of every stream is recomputed from the stored records (RFC 6962 roots),
so a rewrite, a cut tail, a dropped stream or an emptied table is found. Records older than
``GPUPOOL_AUDIT_CHECKPOINT_SECONDS`` + ``GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS`` must be covered by a cosigned
checkpoint; younger ones are the tail window (a warning). ``witness_required=False`` (``audit_verify
--no-witness``) checks the database alone and says so.
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
from audit import messages as audit_messages
from audit import transparency as tp
from audit import witness_service as ws
from audit.chain import Finding
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
from audit.services import audit_record, open_details, raise_alert, record_header
from audit.services.records import raw_data_key
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
    trust_root: str = ""
    trust_root_pinned: bool = False
    witness_key: str = ""

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
            "trust_root": self.trust_root,
            "trust_root_pinned": self.trust_root_pinned,
            "witness_key": self.witness_key,
        }


@dataclass
class Trust:
    """What the verifier trusts, all of it from outside the database."""

    keys: dict[str, str] = field(default_factory=dict)  # signing key id → PEM, from the root through rotations
    witness_key: tp.VerifierKey | None = None
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)  # the witness's latest cosigned checkpoints
    tombstones: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    fingerprint: str = ""
    known: bool = False  # the witness has a genesis for this log


@dataclass(frozen=True)
class _WitnessRule:
    """What the witness must cover: every record older than ``cutoff``."""

    required: bool
    cutoff: dt.datetime
    window_seconds: int
    now: dt.datetime


def _span(seqs: list[int]) -> str:
    return f"seq {seqs[0]}" if len(seqs) == 1 else f"seq {seqs[0]}..{seqs[-1]}"


def load_trust(report: VerificationReport) -> Trust:
    """The pinned trust root, the signing-key chain and the witness's view; problems become findings."""
    trust = Trust()
    try:
        state = witness.get_witness().state(witness.log_id())
    except ws.UnknownLog:
        return trust
    except witness.WitnessError as exc:
        report.findings.append(
            Finding(
                chain.FINDING_WITNESS,
                "",
                audit_messages.FINDING_WITNESS_CANNOT_READ_NOTHING_OUTSIDE(error=exc),
            )
        )
        return trust
    trust.known = True
    pinned = conf.trust_root()
    genesis = state["genesis"]
    trust.fingerprint = tp.trust_root_fingerprint(genesis)
    report.trust_root, report.trust_root_pinned = trust.fingerprint, pinned is not None
    try:
        trust.witness_key, root_pem = tp.check_genesis(genesis, pinned)
        report.witness_key = str(trust.witness_key)
        trust.keys = dict(tp.key_chain(root_pem, state.get("rotations", [])))
    except tp.ProofError as exc:
        report.findings.append(
            Finding(chain.FINDING_TRUST, "", audit_messages.FINDING_TRUST_ROOT_DOES_NOT_HOLD(error=exc))
        )
        return trust
    if pinned is None:
        report.warnings.append(
            f"the trust root is not pinned: using the witness's ({trust.fingerprint}); set "
            f"GPUPOOL_AUDIT_TRUST_ROOT={trust.fingerprint} once you have compared it with the one printed at install"
        )
    signer = get_signer()
    if signer.key_id not in trust.keys:
        report.findings.append(
            Finding(
                chain.FINDING_TRUST,
                "",
                audit_messages.FINDING_CONFIGURED_SIGNING_KEY_NOT_CERTIFIED(
                    key_id=signer.key_id, value=sorted(trust.keys)
                ),
            )
        )
    trust.streams = state.get("streams", {})
    trust.tombstones = state.get("tombstones", {})
    return trust


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


def _destroyed(data_key: DataKey) -> bool:
    return data_key.destroyed_at is not None or not bytes(data_key.wrapped_key)


def _check_seals(
    stream: str,
    records: list[chain.ChainRecord],
    rows: dict[int, AuditRecord],
    keys: dict[str, DataKey],
    broken: set[int],
) -> list[Finding]:
    """A well-linked record whose ciphertext does not open under its data key and header was forged or rewritten;
    one whose key is unknown or does not unwrap cannot be checked, and that fails too (never skipped). A
    destroyed key passes here only because ``_check_key_destruction`` demands a shred record for it."""
    findings = []
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
                    audit_messages.FINDING_RECORD_SEQ_NAMES_UNKNOWN_DATA(seq=record.seq, key_id=row.key_id),
                    [record.seq],
                )
            )
            continue
        try:
            raw = raw_data_key(data_key)
        except crypto.KeyUnavailable as exc:
            if _destroyed(data_key):
                continue  # crypto-shredded: the hash chain still covers the ciphertext
            findings.append(
                Finding(
                    chain.FINDING_KEY,
                    stream,
                    audit_messages.FINDING_RECORD_SEQ_DATA_KEY_DOES(seq=record.seq, key_id=row.key_id, error=exc),
                    [record.seq],
                )
            )
            continue
        try:
            crypto.open_sealed(
                row.cipher, raw, base64.b64decode(row.nonce), record.ciphertext, chain.canonical_json(record.header)
            )
        except (crypto.SealBroken, ValueError):
            findings.append(
                Finding(
                    chain.FINDING_FORGED,
                    stream,
                    audit_messages.FINDING_RECORD_SEQ_DOES_NOT_OPEN(seq=record.seq),
                    [record.seq],
                )
            )
    return findings


def _check_notes(
    stream: str, db_checkpoints: list[Checkpoint], cosignatures: dict[int, Cosignature], trust: Trust
) -> list[Finding]:
    """Each checkpoint's C2SP note is signed by a trusted key and says what its row says; its cosignature (when
    stored) is the pinned witness's."""
    findings = []
    for cp in db_checkpoints:
        if not cp.note:
            continue  # a checkpoint from before notes: its JSON signature is checked by check_checkpoints
        pem = trust.keys.get(cp.key_id)
        key = tp.VerifierKey(tp.log_key_name(witness.log_id()), tp.ALG_ED25519, tp.raw_public_key(pem)) if pem else None
        try:
            body = tp.split_note(cp.note)[0]
            parsed = tp.parse_checkpoint(body)
        except tp.ProofError:
            body, parsed = "", None
        if (
            key is None
            or parsed is None
            or not tp.note_signed_by(cp.note, key)
            or parsed.size != cp.seq
            or parsed.head != cp.head_hash
            or parsed.root.hex() != cp.tree_root
            or parsed.stream != stream
        ):
            findings.append(
                Finding(
                    chain.FINDING_CHECKPOINT,
                    stream,
                    audit_messages.FINDING_CHECKPOINT_SEQ_SIGNED_NOTE_DOES(seq=cp.seq),
                    [cp.seq],
                )
            )
            continue
        cosignature = cosignatures.get(cp.seq)
        if cosignature is not None and (
            trust.witness_key is None or tp.cosignature_time(cosignature.cosignature, body, trust.witness_key) is None
        ):
            findings.append(
                Finding(
                    chain.FINDING_WITNESS,
                    stream,
                    audit_messages.FINDING_CHECKPOINT_SEQ_STORED_COSIGNATURE_NOT(seq=cp.seq),
                    [cp.seq],
                )
            )
    return findings


def _check_tree(
    stream: str,
    records: list[chain.ChainRecord],
    start_seq: int,
    db_checkpoints: list[Checkpoint],
    trust: Trust,
    rows: dict[int, AuditRecord],
    rule: _WitnessRule,
    report: VerificationReport,
) -> list[Finding]:
    """Recompute the stream's RFC 6962 tree from the stored records and hold it against every checkpoint and the
    witness's latest cosigned one; records older than the window must be inside what the witness cosigned."""
    findings: list[Finding] = []
    by_seq = {cp.seq: cp for cp in db_checkpoints}
    if start_seq == 1:
        tree = tp.CompactRange.empty()
    else:
        anchor = by_seq.get(start_seq - 1)
        if anchor is None or not anchor.compact_range:
            return findings  # a purge from before compact ranges: the chain walk from the tombstone still holds
        tree = tp.CompactRange.decode(anchor.compact_range)
        if tree.root().hex() != anchor.tree_root:
            return [
                Finding(
                    chain.FINDING_CHECKPOINT,
                    stream,
                    audit_messages.FINDING_CHECKPOINT_SEQ_COMPACT_RANGE_DOES(seq=anchor.seq),
                    [anchor.seq],
                )
            ]
    latest = trust.streams.get(stream)
    witnessed_size = int(latest["size"]) if latest else 0
    witnessed_root = base64.b64decode(latest["root"]) if latest else None
    if latest and witnessed_size < start_seq - 1:
        witnessed_root = None  # purged past it: the tombstone (witnessed) vouches for the start
    expected = start_seq
    for record in records:
        if record.seq != expected:
            break  # a gap: the chain walk names it; the tree cannot be recomputed past it
        tree.append(tp.leaf_hash(record.hash))
        cp = by_seq.get(record.seq)
        if cp is not None and cp.tree_root and tree.root().hex() != cp.tree_root:
            findings.append(
                Finding(
                    chain.FINDING_CHECKPOINT,
                    stream,
                    audit_messages.FINDING_STORED_RECORDS_DO_NOT_GIVE(seq=cp.seq),
                    [cp.seq],
                )
            )
        if record.seq == witnessed_size and witnessed_root is not None and tree.root() != witnessed_root:
            findings.append(
                Finding(
                    chain.FINDING_WITNESS,
                    stream,
                    audit_messages.FINDING_STORED_RECORDS_DO_NOT_GIVE_ROOT(witnessed_size=witnessed_size),
                    [witnessed_size],
                )
            )
        expected += 1
    last = records[-1].seq if records else start_seq - 1
    if witnessed_size > last:
        missing = list(range(last + 1, witnessed_size + 1))
        findings.append(
            Finding(
                chain.FINDING_TRUNCATED,
                stream,
                audit_messages.FINDING_WITNESS_COSIGNED_RECORDS_DATABASE_HOLDS(
                    size=witnessed_size, last=last, span=_span(missing)
                )
                if records
                else audit_messages.FINDING_WITNESS_COSIGNED_RECORDS_WHOLE_STREAM_GONE(
                    size=witnessed_size, last=last, span=_span(missing)
                ),
                missing,
            )
        )
    if rule.required and trust.known:
        tail = sorted(seq for seq in rows if seq > witnessed_size)
        if tail:
            stale = [seq for seq in tail if rows[seq].created_at < rule.cutoff]
            age = (rule.now - min(rows[seq].created_at for seq in tail)).total_seconds()
            if stale:
                findings.append(
                    Finding(
                        chain.FINDING_WITNESS,
                        stream,
                        audit_messages.FINDING_WITNESS_BEHIND_DATABASE(
                            span=_span(tail), age=f"{age:.0f}", window_seconds=rule.window_seconds
                        ),
                        stale,
                    )
                )
            else:
                report.warnings.append(
                    f"{stream}: records {_span(tail)} (written in the last {max(age, 0):.0f} s) are not witnessed "
                    f"yet (the tail window, up to {rule.window_seconds} s)"
                )
    return findings


def _verify_stream(
    stream: str,
    head: ChainHead | None,
    trust: Trust,
    keys: dict[str, DataKey],
    report: VerificationReport,
    check_seals: bool,
    rule: _WitnessRule,
) -> None:
    findings: list[Finding] = []
    # Where the chain starts: genesis, or the latest tombstone that is signed by a trusted key and witnessed.
    start_seq, start_hash, purged_through = 1, chain.GENESIS_HASH, 0
    witnessed_tombstones = trust.tombstones.get(stream, [])
    signed_fields = ("stream", "through_seq", "through_hash", "purged_count", "purged_at", "key_id", "signature")
    for tombstone in Tombstone.objects.filter(stream=stream).order_by("through_seq"):
        data = tombstone.as_dict()
        pem = trust.keys.get(tombstone.key_id)
        if pem is None or not chain.verify_ed25519(pem, tombstone.signature, chain.tombstone_payload(data)):
            findings.append(
                Finding(
                    chain.FINDING_TOMBSTONE,
                    stream,
                    audit_messages.FINDING_TOMBSTONE_THROUGH_SEQ_NOT_SIGNED(through_seq=tombstone.through_seq),
                    [tombstone.through_seq],
                )
            )
            continue
        if rule.required and not any(all(w.get(k) == data[k] for k in signed_fields) for w in witnessed_tombstones):
            findings.append(
                Finding(
                    chain.FINDING_TOMBSTONE,
                    stream,
                    audit_messages.FINDING_TOMBSTONE_THROUGH_SEQ_NEVER_RECORDED(through_seq=tombstone.through_seq),
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
                    audit_messages.FINDING_WITNESS_HOLDS_TOMBSTONE_THROUGH_SEQ(through_seq=entry["through_seq"]),
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
                audit_messages.FINDING_RECORDS_BEFORE_SEQ_EXIST_ALTHOUGH(start_seq=start_seq),
                [r.seq for r in records if r.seq < start_seq],
            )
        )
        records = [r for r in records if r.seq >= start_seq]
        rows = {seq: row for seq, row in rows.items() if seq >= start_seq}
    findings.extend(chain.walk_chain(stream, records, start_seq=start_seq, start_hash=start_hash))
    broken = {seq for f in findings for seq in f.seqs}
    if check_seals:
        findings.extend(_check_seals(stream, records, rows, keys, broken))

    hashes = {r.seq: r.hash for r in records}
    db_rows = list(Checkpoint.objects.filter(stream=stream).order_by("seq"))
    db_checkpoints = [c.as_dict() for c in db_rows]
    report.checkpoints += len(db_checkpoints)
    findings.extend(chain.check_checkpoints(stream, db_checkpoints, hashes, trust.keys, purged_through=purged_through))
    cosignatures = {c.seq: c for c in Cosignature.objects.filter(stream=stream)}
    findings.extend(_check_notes(stream, db_rows, cosignatures, trust))
    if rule.required:
        findings.extend(_check_tree(stream, records, start_seq, db_rows, trust, rows, rule, report))

    # Tail truncation against the head row and the stored checkpoints (the witness's view is in _check_tree).
    last = records[-1].seq if records else purged_through
    expected_tail = max([head.seq if head else 0] + [c["seq"] for c in db_checkpoints] + [purged_through])
    if expected_tail > last:
        missing = list(range(last + 1, expected_tail + 1))
        findings.append(
            Finding(
                chain.FINDING_TRUNCATED,
                stream,
                audit_messages.FINDING_CHAIN_TRUNCATED_RECORDS_SEQ_MISSING(value=missing[0], value_2=missing[-1]),
                missing,
            )
        )
    elif head is not None and records and head.hash != records[-1].hash and head.seq == last:
        findings.append(
            Finding(
                chain.FINDING_EDITED,
                stream,
                audit_messages.FINDING_CHAIN_HEAD_NAMES_DIFFERENT_HASH(last=last),
                [last],
            )
        )
    seen: set[tuple[str, str]] = set()
    for finding in findings:
        if (finding.kind, finding.message) not in seen:
            seen.add((finding.kind, finding.message))
            report.findings.append(finding)


def _check_size(stream: str, trust: Trust, report: VerificationReport) -> None:
    """The cheap check of a stream that did not change: every record the witness cosigned is still there (one
    indexed count), and the cosigned head is the stored checkpoint's."""
    latest = trust.streams.get(stream)
    if latest is None:
        return
    size = int(latest["size"])
    purged = Tombstone.objects.filter(stream=stream).order_by("-through_seq").values_list("through_seq", flat=True)
    purged_through = purged.first() or 0
    stored = AuditRecord.objects.filter(stream=stream, seq__gt=purged_through, seq__lte=size).count()
    checkpoint = Checkpoint.objects.filter(stream=stream, seq=size).first()
    if stored != size - purged_through:
        report.findings.append(
            Finding(
                chain.FINDING_TRUNCATED,
                stream,
                audit_messages.FINDING_WITNESS_COSIGNED_RECORDS_STREAM_THEM(
                    size=size, value=size - purged_through - stored
                ),
                [],
            )
        )
    elif checkpoint is None or base64.b64decode(latest["root"]).hex() != checkpoint.tree_root:
        report.findings.append(
            Finding(
                chain.FINDING_WITNESS,
                stream,
                audit_messages.FINDING_CHECKPOINT_WITNESS_COSIGNED_SIZE_MISSING(size=size),
                [size],
            )
        )


def _hold_events(tenant_ids: set[int]) -> dict[int, list[AuditRecord]]:
    """The chain's own record of legal holds per tenant (set and release), oldest first, one copy per event."""
    events_by_tenant: dict[int, list[AuditRecord]] = {}
    seen: set[str] = set()
    hold_records = AuditRecord.objects.filter(
        action__in=("audit.legal_hold.set", "audit.legal_hold.release"), tenant_id__in=tenant_ids
    ).order_by("created_at", "id")
    for record in hold_records:
        if record.event_id in seen:  # a platform operator's action is in two streams
            continue
        seen.add(record.event_id)
        events_by_tenant.setdefault(record.tenant_id, []).append(record)
    return events_by_tenant


def _holds_active_at(events: list[AuditRecord], moment: dt.datetime) -> dict[str, dt.datetime]:
    active: dict[str, dt.datetime] = {}
    for event in events:
        if event.created_at > moment:
            break
        if event.action == "audit.legal_hold.set":
            active[event.target] = event.created_at
        else:
            active.pop(event.target, None)
    return active


def _check_purges_under_hold(report: VerificationReport) -> None:
    """No tenant stream may be purged while the chain shows its tenant under a legal hold."""
    tombstones = [t for t in Tombstone.objects.filter(stream__startswith="tenant:")]
    tenants = {int(t.stream.split(":", 1)[1]): t for t in tombstones}
    if not tenants:
        return
    events = _hold_events(set(tenants))
    for tombstone in tombstones:
        tenant_id = int(tombstone.stream.split(":", 1)[1])
        moment = dt.datetime.fromisoformat(tombstone.purged_at)
        active = _holds_active_at(events.get(tenant_id, []), moment)
        if active:
            report.findings.append(
                Finding(
                    chain.FINDING_TOMBSTONE,
                    tombstone.stream,
                    audit_messages.FINDING_TOMBSTONE_THROUGH_SEQ_PURGED_TENANT(
                        through_seq=tombstone.through_seq, tenant_id=tenant_id, items=", ".join(sorted(active))
                    ),
                    [tombstone.through_seq],
                )
            )


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
                    audit_messages.FINDING_DATA_KEY_DESTROYED_WITHOUT_AUDIT(
                        key_id=data_key.key_id, owner=owner, items=", ".join(how)
                    ),
                )
            )
        elif found[0] != data_key.tenant_id:
            report.findings.append(
                Finding(
                    chain.FINDING_KEY,
                    stream,
                    audit_messages.FINDING_DATA_KEY_NAMED_SHRED_RECORD(
                        key_id=data_key.key_id, owner=owner, seq=found[1].seq, value=found[0]
                    ),
                    [found[1].seq],
                )
            )
    if not shred_tenants:
        return
    events_by_tenant = _hold_events({tenant for tenant, _ in shred_tenants})
    for tenant_id, shred in shred_tenants:
        active = _holds_active_at(events_by_tenant.get(tenant_id, []), shred.created_at)
        if active:
            holds = ", ".join(f"{target} (placed {moment.isoformat()})" for target, moment in sorted(active.items()))
            report.findings.append(
                Finding(
                    chain.FINDING_KEY,
                    PLATFORM_STREAM,
                    audit_messages.FINDING_SHRED_RECORD_PLATFORM_SEQ_DESTROYED(
                        seq=shred.seq, tenant_id=tenant_id, holds=holds
                    ),
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
    only_streams: set[str] | None = None,
) -> VerificationReport:
    """Verify every stream (or, with ``only_streams``, those; the trust root and every witnessed stream's size are
    checked either way). With ``record_result``, the run is audited (``audit.bundle_verifier``), and a failure also
    records ``audit.tamper_detected`` and raises an alert.

    ``witness_required`` (the default) makes a missing, lagging or contradicting witness a failure; False checks
    the database alone (the report says so in a warning). ``now`` is the moment the window is measured from."""
    now = now or timezone.now()
    window = conf.witness_window_seconds()
    rule = _WitnessRule(
        required=witness_required, cutoff=now - dt.timedelta(seconds=window), window_seconds=window, now=now
    )
    report = VerificationReport(ok=True, witness_required=witness_required)
    if witness_required:
        trust = load_trust(report)
    else:
        report.warnings.append(
            "NO WITNESS: verified the database alone (--no-witness). A database administrator can rewrite the "
            "whole trail consistently or cut its tail, and this run cannot tell."
        )
        # Without the witness there is no trust root: the configured key is all there is (and proves little).
        trust = Trust(keys={get_signer().key_id: get_signer().public_key_pem()})
    report.witness_entries = sum(1 for _ in trust.streams)
    heads = {h.stream: h for h in ChainHead.objects.all()}
    streams = (
        set(heads)
        | set(AuditRecord.objects.values_list("stream", flat=True).distinct())
        | set(Checkpoint.objects.values_list("stream", flat=True).distinct())
        | (set(trust.streams) if witness_required else set())
    )
    keys = {k.key_id: k for k in DataKey.objects.all()}
    if witness_required and not trust.known:
        _no_witness_entries(heads, rule, report)
    for stream in sorted(streams):
        if only_streams is not None and stream not in only_streams:
            _check_size(stream, trust, report)
            continue
        _verify_stream(stream, heads.get(stream), trust, keys, report, check_seals, rule)
    _check_key_destruction(keys, report)
    _check_purges_under_hold(report)
    report.streams = len(streams)
    report.ok = not report.findings
    if record_result:
        _record_result(report, actor)
    return report


def _no_witness_entries(heads: dict[str, ChainHead], rule: _WitnessRule, report: VerificationReport) -> None:
    """The witness has never heard of this database. Fine for a new installation whose first records are younger
    than the window; a failure once anything should have been witnessed (a checkpoint or tombstone exists, a
    head was ever checkpointed, or a record is older than the window)."""
    old_records = AuditRecord.objects.filter(created_at__lt=rule.cutoff).count()
    checkpoints = Checkpoint.objects.count()
    tombstones = Tombstone.objects.count()
    checkpointed_heads = sum(1 for head in heads.values() if head.checkpoint_seq > 0)
    if not (old_records or checkpoints or tombstones or checkpointed_heads):
        if AuditRecord.objects.exists():
            report.warnings.append(
                "the witness holds nothing for this database yet; its records are younger than "
                f"{rule.window_seconds} s (a new installation)"
            )
        return
    report.findings.append(
        Finding(
            chain.FINDING_WITNESS,
            "",
            audit_messages.FINDING_NO_TRUST_ROOT_DATABASE_LOG(
                value=witness.describe(),
                value_2=witness.database_identity(),
                value_3=witness.log_id(),
                old_records=old_records,
                window_seconds=rule.window_seconds,
                checkpoints=checkpoints,
                tombstones=tombstones,
                checkpointed_heads=checkpointed_heads,
            ),
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
