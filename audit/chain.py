"""The hash chain, Merkle roots and signature checks: pure Python + ``cryptography``, no Django.

Both the database verifier (``audit.trail_verifier``) and the offline bundle verifier
(``python -m audit.bundle_verifier``) use this module, so the two can never disagree on how a record hash is computed.

Record hash::

    hash = SHA-256( prev_hash (32 bytes) ‖ len(header) (8 bytes, big-endian) ‖ canonical header ‖ ciphertext )

The length prefix makes the header/ciphertext boundary unambiguous (no two (header, ciphertext) pairs give the
same byte string). The canonical header is JSON with sorted keys, no whitespace, UTF-8.

Merkle roots follow RFC 6962 §2.1: leaf = SHA-256(0x00 ‖ record hash), node = SHA-256(0x01 ‖ left ‖ right),
the left subtree holding the largest power of two smaller than n leaves.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

GENESIS_HASH = "0" * 64
HEADER_VERSION = 1

# The header fields, in the record's stored form. Changing this list changes every hash: bump HEADER_VERSION.
HEADER_FIELDS = (
    "v",
    "stream",
    "seq",
    "event_id",
    "time",
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
    "nonce",
)


def canonical_json(value: Any) -> bytes:
    """The one byte encoding of ``value`` that is hashed and signed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def record_hash(prev_hash: str, header: dict[str, Any], ciphertext: bytes) -> str:
    """Hex SHA-256 of a record, chained to ``prev_hash`` (hex)."""
    header_bytes = canonical_json(header)
    digest = hashlib.sha256()
    digest.update(bytes.fromhex(prev_hash))
    digest.update(len(header_bytes).to_bytes(8, "big"))
    digest.update(header_bytes)
    digest.update(ciphertext)
    return digest.hexdigest()


def _leaf(record_hash_hex: str) -> bytes:
    return hashlib.sha256(b"\x00" + bytes.fromhex(record_hash_hex)).digest()


def _merkle(leaves: Sequence[bytes]) -> bytes:
    if len(leaves) == 1:
        return leaves[0]
    split = _split(len(leaves))
    return hashlib.sha256(b"\x01" + _merkle(leaves[:split]) + _merkle(leaves[split:])).digest()


def merkle_root(record_hashes: Sequence[str]) -> str:
    """RFC 6962 Merkle tree hash (hex) over record hashes in order; SHA-256("") for none."""
    if not record_hashes:
        return hashlib.sha256(b"").hexdigest()
    return _merkle([_leaf(h) for h in record_hashes]).hex()


def _split(size: int) -> int:
    """The number of leaves in the left subtree of an RFC 6962 tree of ``size`` leaves (largest power of 2 < size)."""
    split = 1
    while split * 2 < size:
        split *= 2
    return split


def inclusion_proof(record_hashes: Sequence[str], index: int) -> list[str]:
    """RFC 6962 §2.1.1 audit path (hex, deepest sibling first) of leaf ``index`` in the tree of ``record_hashes``."""

    def path(m: int, leaves: Sequence[bytes]) -> list[bytes]:
        if len(leaves) <= 1:
            return []
        k = _split(len(leaves))
        if m < k:
            return [*path(m, leaves[:k]), _merkle(leaves[k:])]
        return [*path(m - k, leaves[k:]), _merkle(leaves[:k])]

    if not 0 <= index < len(record_hashes):
        raise ValueError(f"leaf {index} is outside a tree of {len(record_hashes)} leaves")
    return [node.hex() for node in path(index, [_leaf(h) for h in record_hashes])]


def root_from_inclusion_proof(record_hash_hex: str, index: int, size: int, proof: Sequence[str]) -> str | None:
    """The Merkle root (hex) that ``proof`` proves leaf ``index`` of a ``size``-leaf tree belongs to; None when the
    proof has the wrong shape. Compare it with a signed checkpoint's ``merkle_root``."""
    siblings = [bytes.fromhex(p) for p in proof]

    def root(m: int, n: int, node: bytes, path: list[bytes]) -> bytes | None:
        if n == 1:
            return node if not path else None
        if not path:
            return None
        k = _split(n)
        sibling, rest = path[-1], path[:-1]
        if m < k:
            left = root(m, k, node, rest)
            return None if left is None else hashlib.sha256(b"\x01" + left + sibling).digest()
        right = root(m - k, n - k, node, rest)
        return None if right is None else hashlib.sha256(b"\x01" + sibling + right).digest()

    if not 0 <= index < size:
        return None
    found = root(index, size, _leaf(record_hash_hex), siblings)
    return found.hex() if found is not None else None


def checkpoint_payload(checkpoint: dict[str, Any]) -> bytes:
    """The bytes a checkpoint's signature covers."""
    return canonical_json(
        {
            "type": "checkpoint",
            "stream": checkpoint["stream"],
            "from_seq": checkpoint["from_seq"],
            "seq": checkpoint["seq"],
            "head_hash": checkpoint["head_hash"],
            "merkle_root": checkpoint["merkle_root"],
            "signed_at": checkpoint["signed_at"],
            "key_id": checkpoint["key_id"],
        }
    )


def tombstone_payload(tombstone: dict[str, Any]) -> bytes:
    """The bytes a tombstone's signature covers."""
    return canonical_json(
        {
            "type": "tombstone",
            "stream": tombstone["stream"],
            "through_seq": tombstone["through_seq"],
            "through_hash": tombstone["through_hash"],
            "purged_count": tombstone["purged_count"],
            "purged_at": tombstone["purged_at"],
            "key_id": tombstone["key_id"],
        }
    )


def verify_ed25519(public_key_pem: str, signature_b64: str, payload: bytes) -> bool:
    """True when ``signature_b64`` is a valid Ed25519 signature of ``payload`` under the PEM public key."""
    try:
        key = load_pem_public_key(public_key_pem.encode("ascii"))
        if not isinstance(key, Ed25519PublicKey):
            return False
        key.verify(base64.b64decode(signature_b64, validate=True), payload)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def public_key_id(public_key_pem: str) -> str:
    """A short, stable id for a public key: the first 16 hex digits of SHA-256 of its PEM text."""
    return hashlib.sha256(public_key_pem.strip().encode("ascii")).hexdigest()[:16]


# --- chain walking --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainRecord:
    """What the chain walk needs of one stored record."""

    seq: int
    header: dict[str, Any]
    ciphertext: bytes
    prev_hash: str
    hash: str


@dataclass
class Finding:
    """One problem found by a verifier. ``kind`` is one of the FINDING_* codes."""

    kind: str
    stream: str
    message: str
    seqs: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "stream": self.stream, "message": self.message, "seqs": self.seqs}


FINDING_EDITED = "edited"
FINDING_DELETED = "deleted"
FINDING_INSERTED = "inserted"
FINDING_REORDERED = "reordered"
FINDING_TRUNCATED = "truncated"
FINDING_CHECKPOINT = "checkpoint"
FINDING_TOMBSTONE = "tombstone"
FINDING_FORGED = "forged"
FINDING_WITNESS = "witness"
FINDING_KEY = "key"  # a data key destroyed without a shred record, shredded under legal hold, or not unwrapping
FINDING_TRUST = "trust"  # the trust root or the signing-key chain does not hold


def _recomputed(record: ChainRecord, seq: int | None = None) -> str:
    header = record.header if seq is None else {**record.header, "seq": seq}
    return record_hash(record.prev_hash, header, record.ciphertext)


def _ranges(seqs: list[int]) -> str:
    return f"seq {seqs[0]}" if len(seqs) == 1 else f"seq {seqs[0]}..{seqs[-1]}"


def walk_chain(
    stream: str, records: Sequence[ChainRecord], *, start_seq: int = 1, start_hash: str = GENESIS_HASH
) -> list[Finding]:
    """Check a stream's records (sorted by stored seq) link up from ``(start_seq, start_hash)``.

    Names what went wrong: an *edited* record (its stored fields no longer give its stored hash, or it was
    rehashed but its successor still links to the original), *deleted* records (missing positions), an
    *inserted* record (a second record claiming a position, or one that does not link), *reordered* records
    (a record's hash matches only at another seq). Tail truncation needs an outside reference (checkpoints,
    witness, head row): see the callers.
    """
    findings: list[Finding] = []
    failing = {r.seq: r for r in records if r.header.get("stream") != stream or _recomputed(r) != r.hash}

    # Reordered: a failing record whose hash matches at another position (a swap, or a shift to make room).
    present = {r.seq for r in records}
    last = records[-1].seq if records else start_seq - 1
    missing_now = {s for s in range(start_seq, last + 1) if s not in present}
    reordered: dict[int, int] = {}
    for seq, record in failing.items():
        if record.header.get("stream") != stream:
            continue
        candidates = (set(failing) | missing_now | {seq - 2, seq - 1, seq + 1, seq + 2}) - {seq}
        if len(candidates) > 4000:
            candidates = {seq - 2, seq - 1, seq + 1, seq + 2}
        for other in sorted(candidates):
            if other >= start_seq and _recomputed(record, other) == record.hash:
                reordered[seq] = other
                break

    # Place every record at its original position.
    genuine: dict[int, ChainRecord] = {}
    inserted: list[int] = []
    for record in records:
        position = reordered.get(record.seq, record.seq)
        if position in genuine:
            # Two records claim one position: the one whose hash only fits after moving is the original.
            if record.seq in reordered:
                inserted.append(genuine[position].seq)
                genuine[position] = record
            else:
                inserted.append(record.seq)
        else:
            genuine[position] = record

    moved = sorted(s for s in reordered if s not in inserted)
    if inserted and moved:
        findings.append(
            Finding(
                FINDING_REORDERED,
                stream,
                f"records {_ranges(moved)} were renumbered (to make room for the inserted record)",
                moved,
            )
        )
    else:
        for seq in moved:
            findings.append(
                Finding(
                    FINDING_REORDERED,
                    stream,
                    f"record at seq {seq} was moved: it belongs at seq {reordered[seq]}",
                    [seq],
                )
            )
    for seq in sorted(inserted):
        findings.append(Finding(FINDING_INSERTED, stream, f"record seq {seq} was inserted", [seq]))
    for seq in sorted(set(failing) - set(reordered)):
        why = "belongs to another stream" if failing[seq].header.get("stream") != stream else "its contents changed"
        findings.append(Finding(FINDING_EDITED, stream, f"record seq {seq} was edited: {why}", [seq]))

    # Missing positions, in runs.
    top = max(genuine) if genuine else start_seq - 1
    gone = [s for s in range(start_seq, top + 1) if s not in genuine]
    runs: list[list[int]] = []
    for seq in gone:
        if runs and runs[-1][-1] == seq - 1:
            runs[-1].append(seq)
        else:
            runs.append([seq])
    for run in runs:
        findings.append(
            Finding(
                FINDING_DELETED,
                stream,
                f"{'records' if len(run) > 1 else 'record'} {_ranges(run)} {'were' if len(run) > 1 else 'was'} deleted",
                run,
            )
        )

    # Links between neighbours that are both present and intact.
    for position in sorted(genuine):
        record = genuine[position]
        if record.seq in failing and record.seq not in reordered:
            continue
        if position == start_seq:
            expected = start_hash
        elif position - 1 in genuine:
            expected = genuine[position - 1].hash
        else:
            continue
        if record.prev_hash != expected:
            previous = position - 1
            findings.append(
                Finding(
                    FINDING_EDITED if previous >= start_seq else FINDING_INSERTED,
                    stream,
                    f"record seq {previous} was rewritten: its hash was recomputed, but seq {position} still "
                    "links to the original"
                    if previous >= start_seq
                    else f"record seq {position} does not link to the chain start",
                    [previous if previous >= start_seq else position],
                )
            )
    return findings


def check_checkpoints(
    stream: str,
    checkpoints: Iterable[dict[str, Any]],
    hashes_by_seq: dict[int, str],
    public_keys: dict[str, str],
    *,
    purged_through: int = 0,
) -> list[Finding]:
    """Each checkpoint is signed by a known key, names the stored head hash and the Merkle root of its range.

    Checkpoints wholly inside a purged prefix (``seq <= purged_through``) are only signature-checked.
    """
    findings: list[Finding] = []
    for cp in checkpoints:
        key_pem = public_keys.get(cp["key_id"])
        if key_pem is None or not verify_ed25519(key_pem, cp["signature"], checkpoint_payload(cp)):
            findings.append(
                Finding(FINDING_CHECKPOINT, stream, f"checkpoint at seq {cp['seq']} has a bad signature", [cp["seq"]])
            )
            continue
        if cp["seq"] <= purged_through:
            continue
        head = hashes_by_seq.get(cp["seq"])
        if head is None:
            continue  # reported as truncation/deletion by the caller
        if head != cp["head_hash"]:
            findings.append(
                Finding(
                    FINDING_CHECKPOINT,
                    stream,
                    f"checkpoint at seq {cp['seq']} signed head {cp['head_hash'][:12]}…, but the stored record "
                    f"has {head[:12]}… (records rewritten)",
                    [cp["seq"]],
                )
            )
            continue
        if cp["from_seq"] > purged_through:
            covered = [hashes_by_seq.get(s) for s in range(cp["from_seq"], cp["seq"] + 1)]
            if None not in covered and merkle_root(covered) != cp["merkle_root"]:  # type: ignore[arg-type]
                findings.append(
                    Finding(
                        FINDING_CHECKPOINT,
                        stream,
                        f"Merkle root of seq {cp['from_seq']}..{cp['seq']} does not match its signed checkpoint",
                        [cp["seq"]],
                    )
                )
    return findings
