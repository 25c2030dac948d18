"""Transparency-log formats and proofs, shared by the portal, the witness service and the offline verifier.

Standard library and ``cryptography`` only (no Django), like ``audit.chain``. What is standard here, and where it
is specified:

- **Signed notes** (C2SP ``signed-note``): a UTF-8 text body, a blank line, then one line per signature,
  ``— <key name> <base64(4-byte key hash ‖ signature)>``. The log signs with Ed25519 (key type 0x01).
- **Checkpoints** (C2SP ``tlog-checkpoint``): the body is ``<origin>\\n<tree size>\\n<base64 root hash>\\n``
  followed by extension lines. Every audit stream is a log of its own, origin ``gpupool.audit/<log id>/<stream>``;
  its leaves are the stream's record hashes, in seq order. We add three extension lines: ``head <hex>`` (the
  record hash at the tree size, what the hash chain links to), ``segment <from> <hex>`` (the RFC 6962 root of the
  records since the previous checkpoint, for inclusion proofs) and ``time <ISO 8601>``.
- **Cosignatures** (C2SP ``tlog-cosignature``, ``cosignature/v1``): the witness signs
  ``cosignature/v1\\ntime <unix seconds>\\n<checkpoint body>`` with Ed25519 (key type 0x04); its signature line
  carries ``key hash ‖ 8-byte big-endian time ‖ signature``.
- **Merkle trees** (RFC 6962 / RFC 9162 §2.1): tree hashes, consistency proofs (§2.1.4) and their verification.
  The portal keeps each stream's *compact range* (the roots of the perfect subtrees the tree size decomposes
  into, at most 64 hashes), so a checkpoint costs the records since the last one, never the whole stream.

What is ours: the trust root. A log's genesis entry is written once by the witness: the log's first signing key
and the witness's own key, signed by the witness. Its SHA-256 — the *trust-root fingerprint* — is what an auditor
pins. A later signing key is valid only through a rotation statement signed by its predecessor.

No maintained Python library implements these formats (sigstore-python parses Rekor checkpoints internally, not
as an API; pymerkle's trees have no compact ranges or C2SP notes), so they are written out here, each against
its specification; ``tests/audit/test_transparency.py`` checks the proofs against full recomputation.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

NOTE_DASH = "\u2014"
ALG_ED25519 = 0x01
ALG_COSIGNATURE_V1 = 0x04
ORIGIN_PREFIX = "gpupool.audit"
EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(ValueError):
    """A proof, note or statement that does not verify."""


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- Ed25519 keys -----------------------------------------------------------------------------------------


def raw_public_key(public_key_pem: str) -> bytes:
    key = serialization.load_pem_public_key(public_key_pem.encode("ascii"))
    if not isinstance(key, Ed25519PublicKey):
        raise ProofError("not an Ed25519 public key")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def pem_from_raw(raw: bytes) -> str:
    return (
        Ed25519PublicKey.from_public_bytes(raw)
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode("ascii")
    )


def key_id(public_key_pem: str) -> str:
    """The short id the trail has always used for a signing key: 16 hex digits of SHA-256 of its PEM."""
    return hashlib.sha256(public_key_pem.strip().encode("ascii")).hexdigest()[:16]


def ed25519_verify(public_raw: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# --- signed notes (C2SP signed-note) ----------------------------------------------------------------------


def key_hash(name: str, algorithm: int, public_raw: bytes) -> bytes:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([algorithm]) + public_raw).digest()[:4]


def vkey(name: str, algorithm: int, public_raw: bytes) -> str:
    """The verifier key string ``<name>+<hex key hash>+<base64(type ‖ key)>``."""
    encoded = base64.b64encode(bytes([algorithm]) + public_raw).decode("ascii")
    return f"{name}+{key_hash(name, algorithm, public_raw).hex()}+{encoded}"


@dataclass(frozen=True)
class VerifierKey:
    name: str
    algorithm: int
    public_raw: bytes

    @property
    def hash(self) -> bytes:
        return key_hash(self.name, self.algorithm, self.public_raw)

    def __str__(self) -> str:
        return vkey(self.name, self.algorithm, self.public_raw)


def parse_vkey(text: str) -> VerifierKey:
    try:
        name, hash_hex, encoded = text.strip().split("+", 2)
        blob = base64.b64decode(encoded, validate=True)
    except ValueError as exc:
        raise ProofError(f"not a verifier key: {text[:80]!r}") from exc
    if len(blob) != 33 or blob[0] not in (ALG_ED25519, ALG_COSIGNATURE_V1):
        raise ProofError("a verifier key must be an Ed25519 key (type 0x01 or 0x04)")
    found = VerifierKey(name, blob[0], blob[1:])
    if found.hash.hex() != hash_hex:
        raise ProofError("the verifier key's hash does not match its key")
    return found


class NoteSigner:
    """Signs note bodies with an Ed25519 private key under ``name`` (key type 0x01)."""

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        self.name = name
        self._key = private_key
        self.public_raw = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def signature_line(self, body: str) -> str:
        signature = self._key.sign(body.encode("utf-8"))
        blob = key_hash(self.name, ALG_ED25519, self.public_raw) + signature
        return f"{NOTE_DASH} {self.name} {base64.b64encode(blob).decode('ascii')}\n"

    def sign_note(self, body: str) -> str:
        _check_body(body)
        return body + "\n" + self.signature_line(body)


def _check_body(body: str) -> None:
    if not body.endswith("\n") or "\n\n" in body:
        raise ProofError("a note body ends with a newline and has no blank line")


def split_note(note: str) -> tuple[str, list[tuple[str, bytes]]]:
    """(body, [(key name, signature blob)]) of a signed note."""
    body, sep, signatures = note.partition("\n\n")
    if not sep:
        raise ProofError("a signed note has a blank line before its signatures")
    body += "\n"
    lines: list[tuple[str, bytes]] = []
    for line in signatures.splitlines():
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != NOTE_DASH:
            raise ProofError(f"malformed signature line {line[:60]!r}")
        try:
            lines.append((parts[1], base64.b64decode(parts[2], validate=True)))
        except ValueError as exc:
            raise ProofError("a signature line is not base64") from exc
    return body, lines


def note_signed_by(note: str, key: VerifierKey) -> bool:
    """True when ``note`` carries a valid Ed25519 signature by ``key``."""
    try:
        body, signatures = split_note(note)
    except ProofError:
        return False
    for name, blob in signatures:
        if (
            name == key.name
            and blob[:4] == key.hash
            and len(blob) == 68
            and ed25519_verify(key.public_raw, blob[4:], body.encode("utf-8"))
        ):
            return True
    return False


# --- checkpoints (C2SP tlog-checkpoint) --------------------------------------------------------------------


def origin(log_id: str, stream: str) -> str:
    return f"{ORIGIN_PREFIX}/{log_id}/{stream}"


def log_key_name(log_id: str) -> str:
    return f"{ORIGIN_PREFIX}/{log_id}"


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    head: str = ""
    segment_from: int = 0
    segment_root: str = ""
    time: str = ""

    @property
    def stream(self) -> str:
        return self.origin.split("/", 2)[2]

    @property
    def log_id(self) -> str:
        return self.origin.split("/", 2)[1]

    def body(self) -> str:
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode("ascii")]
        if self.head:
            lines.append(f"head {self.head}")
        if self.segment_root:
            lines.append(f"segment {self.segment_from} {self.segment_root}")
        if self.time:
            lines.append(f"time {self.time}")
        return "\n".join(lines) + "\n"


def parse_checkpoint(body: str) -> Checkpoint:
    lines = body.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise ProofError("a checkpoint body has an origin, a size and a root hash, each on its own line")
    name, size_text, root_text, *extensions = lines[:-1]
    if not name.startswith(ORIGIN_PREFIX + "/") or name.count("/") < 2:
        raise ProofError(f"not a gpupool audit origin: {name[:80]!r}")
    if not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")):
        raise ProofError("the tree size is not a decimal number")
    try:
        root = base64.b64decode(root_text, validate=True)
    except ValueError as exc:
        raise ProofError("the root hash is not base64") from exc
    if len(root) != 32:
        raise ProofError("the root hash is not 32 bytes")
    fields: dict[str, Any] = {}
    for line in extensions:
        word, _, rest = line.partition(" ")
        if word == "head":
            fields["head"] = rest
        elif word == "segment":
            start, _, segment_root = rest.partition(" ")
            fields["segment_from"], fields["segment_root"] = int(start), segment_root
        elif word == "time":
            fields["time"] = rest
    return Checkpoint(origin=name, size=int(size_text), root=root, **fields)


# --- cosignatures (C2SP tlog-cosignature, cosignature/v1) -------------------------------------------------


def cosigned_message(timestamp: int, checkpoint_body: str) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n{checkpoint_body}".encode()


class CosignatureSigner:
    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        self.name = name
        self._key = private_key
        self.public_raw = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.vkey = VerifierKey(name, ALG_COSIGNATURE_V1, self.public_raw)

    def cosign(self, checkpoint_body: str, timestamp: int) -> str:
        signature = self._key.sign(cosigned_message(timestamp, checkpoint_body))
        blob = self.vkey.hash + struct.pack(">Q", timestamp) + signature
        return f"{NOTE_DASH} {self.name} {base64.b64encode(blob).decode('ascii')}\n"

    def sign_statement(self, statement: dict[str, Any]) -> str:
        """A plain Ed25519 signature (base64) over a canonical JSON statement (genesis, manifests, journal)."""
        return base64.b64encode(self._key.sign(b"gpupool-witness-statement\n" + canonical_json(statement))).decode()


def cosignature_time(line: str, checkpoint_body: str, witness: VerifierKey) -> int | None:
    """The time a valid cosignature line by ``witness`` says it was made, or None if it does not verify."""
    parts = line.strip().split(" ")
    if len(parts) != 3 or parts[0] != NOTE_DASH or parts[1] != witness.name:
        return None
    try:
        blob = base64.b64decode(parts[2], validate=True)
    except ValueError:
        return None
    if len(blob) != 76 or blob[:4] != witness.hash:
        return None
    (timestamp,) = struct.unpack(">Q", blob[4:12])
    if not ed25519_verify(witness.public_raw, blob[12:], cosigned_message(timestamp, checkpoint_body)):
        return None
    return timestamp


def statement_signed(statement: dict[str, Any], signature_b64: str, witness: VerifierKey) -> bool:
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (ValueError, TypeError):
        return False
    return ed25519_verify(witness.public_raw, signature, b"gpupool-witness-statement\n" + canonical_json(statement))


# --- the trust root and the signing-key chain --------------------------------------------------------------


def trust_root_fingerprint(genesis: dict[str, Any]) -> str:
    """What an auditor pins: SHA-256 (hex) of the genesis statement, as the witness signed it."""
    return sha256_hex(canonical_json(genesis["statement"]))


def check_genesis(genesis: dict[str, Any], pinned_fingerprint: str | None) -> tuple[VerifierKey, str]:
    """The witness key and the log's root signing key (PEM) of a genesis entry, after checking it is signed by
    the witness it names and (when given) has the pinned fingerprint."""
    statement = genesis.get("statement") or {}
    witness = parse_vkey(str(statement.get("witness_key", "")))
    if pinned_fingerprint is not None and trust_root_fingerprint(genesis) != pinned_fingerprint.strip().lower():
        raise ProofError(
            f"the trust root {trust_root_fingerprint(genesis)} is not the pinned {pinned_fingerprint.strip()}"
        )
    if statement.get("type") != "genesis" or not statement_signed(statement, genesis.get("signature", ""), witness):
        raise ProofError("the genesis entry is not signed by the witness it names")
    return witness, str(statement["root_key_pem"])


def rotation_statement(*, log_id: str, number: int, previous_key_id: str, public_key_pem: str, at: str) -> dict:
    return {
        "type": "key_rotation",
        "log": log_id,
        "number": number,
        "previous_key_id": previous_key_id,
        "key_id": key_id(public_key_pem),
        "public_key_pem": public_key_pem,
        "at": at,
    }


def rotation_payload(statement: dict[str, Any]) -> bytes:
    return b"gpupool-audit-key-rotation\n" + canonical_json(statement)


def key_chain(root_key_pem: str, rotations: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """``[(key id, PEM), ...]`` from the root key through every rotation, in order; raises ProofError at the first
    rotation that is not signed by its predecessor (or is out of order)."""
    chain = [(key_id(root_key_pem), root_key_pem)]
    for number, rotation in enumerate(rotations, start=1):
        statement = rotation.get("statement") or {}
        previous_id, previous_pem = chain[-1]
        if statement.get("number") != number or statement.get("previous_key_id") != previous_id:
            raise ProofError(f"key rotation {number} does not follow key {previous_id}")
        pem = str(statement.get("public_key_pem", ""))
        if key_id(pem) != statement.get("key_id"):
            raise ProofError(f"key rotation {number} names a key that does not match its id")
        try:
            signature = base64.b64decode(rotation.get("signature", ""), validate=True)
            previous_raw = raw_public_key(previous_pem)
        except ValueError as exc:
            raise ProofError(f"key rotation {number} is malformed") from exc
        if not ed25519_verify(previous_raw, signature, rotation_payload(statement)):
            raise ProofError(f"key rotation {number} is not signed by the key it replaces ({previous_id})")
        chain.append((statement["key_id"], pem))
    return chain


# --- RFC 6962 trees, compact ranges and consistency proofs ------------------------------------------------


def leaf_hash(record_hash_hex: str) -> bytes:
    return hashlib.sha256(b"\x00" + bytes.fromhex(record_hash_hex)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(size: int) -> int:
    split = 1
    while split * 2 < size:
        split *= 2
    return split


def tree_hash(leaves: Sequence[bytes]) -> bytes:
    """RFC 6962 MTH over leaf hashes."""
    if not leaves:
        return EMPTY_ROOT
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return node_hash(tree_hash(leaves[:k]), tree_hash(leaves[k:]))


@dataclass
class CompactRange:
    """The perfect subtrees a tree of ``size`` leaves decomposes into, largest first: ``[(leaves, hash), ...]``.
    Enough to extend the tree, compute its root and prove consistency with any larger tree."""

    size: int
    nodes: list[tuple[int, bytes]]

    @classmethod
    def empty(cls) -> CompactRange:
        return cls(0, [])

    def copy(self) -> CompactRange:
        return CompactRange(self.size, list(self.nodes))

    def append(self, leaf: bytes) -> None:
        self.nodes.append((1, leaf))
        self.size += 1
        while len(self.nodes) >= 2 and self.nodes[-1][0] == self.nodes[-2][0]:
            (width, right), (_, left) = self.nodes.pop(), self.nodes.pop()
            self.nodes.append((width * 2, node_hash(left, right)))

    def extend(self, leaves: Iterable[bytes]) -> None:
        for leaf in leaves:
            self.append(leaf)

    def root(self) -> bytes:
        if not self.nodes:
            return EMPTY_ROOT
        root = self.nodes[-1][1]
        for _width, node in reversed(self.nodes[:-1]):
            root = node_hash(node, root)
        return root

    def encode(self) -> str:
        return ",".join(f"{width}:{node.hex()}" for width, node in self.nodes)

    @classmethod
    def decode(cls, text: str) -> CompactRange:
        nodes = []
        for item in filter(None, (text or "").split(",")):
            width, _, node = item.partition(":")
            nodes.append((int(width), bytes.fromhex(node)))
        found = cls(sum(width for width, _ in nodes), nodes)
        widths = [width for width, _ in nodes]
        if any(w & (w - 1) for w in widths) or widths != sorted(set(widths), reverse=True):
            raise ProofError("a compact range holds distinct powers of two, largest first")
        return found


def consistency_proof(old: CompactRange, new_leaves: Sequence[bytes]) -> list[bytes]:
    """RFC 9162 §2.1.4.1 proof that the tree of ``old.size`` leaves is a prefix of the tree extended by
    ``new_leaves``, computed from the old tree's compact range and the new leaves alone."""
    m, n = old.size, old.size + len(new_leaves)
    if m == 0 or m == n:
        return []
    known: dict[tuple[int, int], bytes] = {}
    start = 0
    for width, node in old.nodes:
        known[(start, start + width)] = node
        start += width

    def mth(a: int, b: int) -> bytes:
        if (a, b) in known:
            return known[(a, b)]
        if a >= m:
            return tree_hash(new_leaves[a - m : b - m])
        if b - a == 1:
            raise ProofError(f"leaf {a} of the old tree is not in its compact range")
        k = _split(b - a)
        return node_hash(mth(a, a + k), mth(a + k, b))

    def subproof(count: int, a: int, b: int, complete: bool) -> list[bytes]:
        if count == b - a:
            return [] if complete else [mth(a, b)]
        k = _split(b - a)
        if count <= k:
            return [*subproof(count, a, a + k, complete), mth(a + k, b)]
        return [*subproof(count - k, a + k, b, False), mth(a, a + k)]

    return subproof(m, 0, n, True)


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> bool:
    """RFC 9162 §2.1.4.2."""
    if old_size > new_size:
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    if not path:
        return False
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0


def encode_hashes(hashes: Sequence[bytes]) -> list[str]:
    return [base64.b64encode(h).decode("ascii") for h in hashes]


def decode_hashes(encoded: Sequence[str]) -> list[bytes]:
    found = [base64.b64decode(h, validate=True) for h in encoded]
    if any(len(h) != 32 for h in found):
        raise ProofError("a proof hash is not 32 bytes")
    return found
