"""Offline verifier for audit export bundles: ``python -m audit.bundle_verifier bundle.zip [--key-id ID]``.

Standalone on purpose: the standard library and ``cryptography`` only — no Django, no settings, no database —
so an assessor can run it on their own machine. It checks the manifest signature, the SHA-256 of every file,
every record hash and chain link, the signed checkpoints (and their Merkle roots) covering every record, the
tombstones, and that the CSV says what the JSON Lines say. Any changed byte fails it.

It also checks data-key destruction: every record whose details read "[shredded]" must name a key that
``datakeys.json`` lists as destroyed, and every destroyed key must be named, for its own tenant, by an
``audit.key.shred`` record proved (RFC 6962 inclusion proof) to be in a signed checkpoint; a key destroyed by hand
in the database fails, naming the tenant and the key.

Pin the signer with ``--key-id`` (printed by ``manage.py audit_export``) or ``--public-key FILE``: a bundle
re-signed end to end with another key is otherwise internally consistent. Without a pin the verifier FAILS
(exit 1) after checking everything else, unless told ``--unpinned`` (then it says the key is unpinned).
"""

from __future__ import annotations

import argparse
import base64
import csv
import datetime as dt
import hashlib
import io
import json
import sys
import zipfile
from typing import Any

from audit import chain
from audit import transparency as tp
from audit.csvsafe import formula_safe

REQUIRED = (
    "manifest.json",
    "manifest.sig",
    "records.jsonl",
    "records.csv",
    "checkpoints.json",
    "trust.json",
    "witness.json",
    "datakeys.json",
    "public_key.pem",
)
SHREDDED = "[shredded]"
# How far the witness's signed manifest may be from the bundle's creation: it is fetched during the export.
MANIFEST_SKEW_SECONDS = 300


class BundleError(Exception):
    pass


def _read(bundle: zipfile.ZipFile, name: str) -> bytes:
    try:
        return bundle.read(name)
    except KeyError:
        raise BundleError(f"{name} is missing from the bundle") from None


def _json(bodies: dict[str, bytes], name: str) -> Any:
    try:
        return json.loads(bodies[name])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{name} is not JSON: {exc}") from None


def _checkpoint_ok(cp: dict[str, Any], stream: str, keys: dict[str, str], witness_key: tp.VerifierKey, log: str) -> str:
    """The checkpoint's note body, after checking the log's signature (a key of the chain), the JSON signature,
    the note saying what the fields say, and the pinned witness's cosignature."""
    where = f"{stream}: checkpoint at seq {cp.get('seq')}"
    pem = keys.get(cp.get("key_id", ""))
    if pem is None:
        raise BundleError(f"{where} is signed by key {cp.get('key_id')}, which is not in the trust root's key chain")
    if not chain.verify_ed25519(pem, cp["signature"], chain.checkpoint_payload(cp)):
        raise BundleError(f"{where} has a bad signature")
    note = cp.get("note") or ""
    key = tp.VerifierKey(tp.log_key_name(log), tp.ALG_ED25519, tp.raw_public_key(pem))
    try:
        body = tp.split_note(note)[0]
        parsed = tp.parse_checkpoint(body)
    except tp.ProofError as exc:
        raise BundleError(f"{where}: its note is malformed ({exc})") from None
    if not tp.note_signed_by(note, key) or parsed.size != cp["seq"] or parsed.head != cp["head_hash"]:
        raise BundleError(f"{where}: its signed note does not verify or says something else")
    if parsed.root.hex() != cp.get("tree_root") or parsed.stream != stream or parsed.log_id != log:
        raise BundleError(f"{where}: its note names another tree, stream or log")
    if tp.cosignature_time(cp.get("cosignature") or "", body, witness_key) is None:
        raise BundleError(f"{where} is not cosigned by the pinned witness")
    return body


def verify_bundle(path: str, *, trust_root: str | None = None) -> dict[str, Any]:
    """Verify the bundle at ``path`` against the pinned ``trust_root`` fingerprint (None: internally consistent
    only); returns a summary, raises BundleError naming the first problem (malformed content included)."""
    try:
        return _verify_bundle(path, trust_root)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        if isinstance(exc, BundleError):
            raise
        raise BundleError(f"the bundle is malformed: {exc!r}") from exc


def _verify_bundle(path: str, trust_root: str | None) -> dict[str, Any]:
    try:
        bundle = zipfile.ZipFile(path)
        names = set(bundle.namelist())
        bodies = {name: _read(bundle, name) for name in REQUIRED}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise BundleError(f"not a readable bundle: {exc}") from exc
    extra = names - set(REQUIRED)
    if extra:
        raise BundleError(f"unexpected files in the bundle: {sorted(extra)}")

    # 1. The trust root: the genesis entry the auditor pinned, the witness it names, the signing-key chain.
    trust = _json(bodies, "trust.json")
    fingerprint = tp.trust_root_fingerprint(trust["genesis"])
    try:
        witness_key, root_pem = tp.check_genesis(trust["genesis"], trust_root)
        key_chain = tp.key_chain(root_pem, trust.get("rotations", []))
    except (tp.ProofError, KeyError, TypeError) as exc:
        raise BundleError(f"trust.json: {exc}") from None
    keys = dict(key_chain)
    log = str(trust["genesis"]["statement"]["log"])

    # 2. The manifest is signed by a key of that chain.
    pem = bodies["public_key.pem"].decode("ascii", errors="replace")
    bundle_key_id = chain.public_key_id(pem)
    if keys.get(bundle_key_id, "").strip() != pem.strip():
        raise BundleError(f"the bundle is signed by key {bundle_key_id}, which is not in the trust root's key chain")
    signature = bodies["manifest.sig"].decode("ascii", errors="replace").strip()
    if bodies["manifest.sig"] != (signature + "\n").encode("ascii", errors="replace"):
        raise BundleError("manifest.sig is malformed")
    if not chain.verify_ed25519(pem, signature, bodies["manifest.json"]):
        raise BundleError("the manifest signature does not verify")
    try:
        manifest = json.loads(bodies["manifest.json"])
    except json.JSONDecodeError as exc:
        raise BundleError(f"manifest.json is not JSON: {exc}") from exc
    if manifest.get("signing_key_id") != bundle_key_id or manifest.get("log_id") != log:
        raise BundleError("the manifest names another signing key or log than the bundle")
    listed = manifest.get("files", {})
    if set(listed) != set(REQUIRED) - {"manifest.json", "manifest.sig"}:
        raise BundleError("the manifest does not list exactly the bundle's files")
    for name, digest in listed.items():
        if hashlib.sha256(bodies[name]).hexdigest() != digest:
            raise BundleError(f"{name} was changed: its SHA-256 does not match the manifest")

    # 3. Completeness: the witness's signed manifest of streams, fetched during the export.
    witness_info = _json(bodies, "witness.json")
    statement = witness_info["manifest"]["statement"]
    if not tp.statement_signed(statement, witness_info["manifest"]["signature"], witness_key):
        raise BundleError("witness.json: the stream manifest is not signed by the pinned witness")
    created = dt.datetime.fromisoformat(manifest["created_at"]).timestamp()
    if statement.get("log") != log or abs(int(statement["time"]) - created) > MANIFEST_SKEW_SECONDS:
        raise BundleError("witness.json: the witness's stream manifest is of another log or another moment")
    witnessed: dict[str, list] = statement["streams"]
    streams = manifest.get("streams", {})
    tenant_id = manifest.get("tenant_id")
    in_scope = [f"tenant:{tenant_id}"] if tenant_id is not None else list(witnessed)
    for stream in in_scope:
        if stream in witnessed and stream not in streams:
            raise BundleError(
                f"{stream}: the witness cosigned {witnessed[stream][0]} records of this stream, the bundle has none "
                "of them (a stream left out)"
            )

    # 4. Each stream: from its anchor, every record up to the size the witness cosigned, and that tree's root.
    signed = _json(bodies, "checkpoints.json")
    records_by_stream: dict[str, list[dict]] = {}
    for number, line in enumerate(bodies["records.jsonl"].decode("utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
            records_by_stream.setdefault(record["header"]["stream"], []).append(record)
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise BundleError(f"records.jsonl line {number} is malformed: {exc}") from exc
    if set(records_by_stream) - set(streams):
        raise BundleError("records.jsonl holds other streams than the manifest lists")
    range_start = dt.datetime.fromisoformat(manifest["range"]["from"])
    total = 0
    for stream, info in streams.items():
        records = sorted(records_by_stream.get(stream, []), key=lambda r: r["header"]["seq"])
        if len(records) != info["records"]:
            raise BundleError(f"{stream}: the manifest lists {info['records']} records, the bundle has {len(records)}")
        total += len(records)
        if stream not in witnessed or witnessed[stream][0] != info["to_seq"]:
            raise BundleError(
                f"{stream}: the bundle ends at seq {info['to_seq']}, the witness cosigned "
                f"{witnessed.get(stream, [0])[0]} (a cut tail)"
            )
        checkpoints = sorted((c for c in signed["checkpoints"] if c["stream"] == stream), key=lambda c: c["seq"])
        by_seq = {c["seq"]: c for c in checkpoints}
        for cp in checkpoints:
            _checkpoint_ok(cp, stream, keys, witness_key, log)
        anchor_seq = info["from_seq"] - 1
        if anchor_seq:
            anchor = by_seq.get(anchor_seq)
            if anchor is None or not anchor.get("compact_range"):
                raise BundleError(f"{stream}: nothing signed anchors the first record (seq {info['from_seq']})")
            tree = tp.CompactRange.decode(anchor["compact_range"])
            if tree.size != anchor_seq or tree.root().hex() != anchor["tree_root"]:
                raise BundleError(f"{stream}: the anchor's compact range does not give its signed root")
            start_hash = anchor["head_hash"]
            anchor_record = signed.get("anchors", {}).get(stream)
            tombstoned = any(t["stream"] == stream and t["through_seq"] == anchor_seq for t in signed["tombstones"])
            if anchor_record is not None:
                header = anchor_record["header"]
                ciphertext = base64.b64decode(anchor_record["ciphertext"], validate=True)
                if (
                    header.get("seq") != anchor_seq
                    or chain.record_hash(anchor_record["prev_hash"], header, ciphertext) != anchor["head_hash"]
                ):
                    raise BundleError(f"{stream}: the anchor record is not the one its checkpoint signed")
                if dt.datetime.fromisoformat(header["time"]) >= range_start:
                    raise BundleError(f"{stream}: the bundle starts after the range's start (records left out)")
            elif not tombstoned:
                raise BundleError(f"{stream}: the anchor's record is missing")
        else:
            tree, start_hash = tp.CompactRange.empty(), chain.GENESIS_HASH
        for tombstone in (t for t in signed["tombstones"] if t["stream"] == stream):
            tkey = keys.get(tombstone["key_id"])
            if tkey is None or not chain.verify_ed25519(
                tkey, tombstone["signature"], chain.tombstone_payload(tombstone)
            ):
                raise BundleError(f"{stream}: tombstone through seq {tombstone['through_seq']} has a bad signature")
            witnessed_purges = witness_info.get("tombstones", {}).get(stream, [])
            if not any(
                w.get("signature") == tombstone["signature"]
                and tp.statement_signed(
                    {
                        "type": "tombstone",
                        "log": log,
                        "tombstone": {k: v for k, v in w.items() if k != "witness_signature"},
                    },
                    w.get("witness_signature", ""),
                    witness_key,
                )
                for w in witnessed_purges
            ):
                raise BundleError(f"{stream}: tombstone through seq {tombstone['through_seq']} was never witnessed")
        chain_records = [
            chain.ChainRecord(
                seq=r["header"]["seq"],
                header=r["header"],
                ciphertext=base64.b64decode(r["ciphertext"], validate=True),
                prev_hash=r["prev_hash"],
                hash=r["hash"],
            )
            for r in records
        ]
        findings = chain.walk_chain(stream, chain_records, start_seq=info["from_seq"], start_hash=start_hash)
        if findings:
            raise BundleError("; ".join(f"{f.stream}: {f.message}" for f in findings[:10]))
        for expected, record in enumerate(chain_records, start=info["from_seq"]):
            if record.seq != expected:
                raise BundleError(f"{stream}: record seq {expected} is missing")
            tree.append(tp.leaf_hash(record.hash))
            cp = by_seq.get(record.seq)
            if cp is not None and tree.root().hex() != cp["tree_root"]:
                raise BundleError(f"{stream}: the records do not give the tree root checkpoint seq {cp['seq']} signed")
        if tree.size != info["to_seq"] or tree.root() != base64.b64decode(witnessed[stream][1]):
            raise BundleError(f"{stream}: the records do not give the root the witness cosigned at {info['to_seq']}")

    # 5. No data key was destroyed without a shred record in the chain.
    _check_data_keys(_json(bodies, "datakeys.json"), records_by_stream, keys, witness_key, log)

    # 6. The CSV says what the JSON Lines say.
    rows = list(csv.DictReader(io.StringIO(bodies["records.csv"].decode("utf-8"))))
    expected = [
        r for stream in streams for r in sorted(records_by_stream.get(stream, []), key=lambda r: r["header"]["seq"])
    ]
    if len(rows) != len(expected):
        raise BundleError("records.csv has a different number of records than records.jsonl")
    for row, record in zip(rows, expected, strict=True):
        header = record["header"]
        for column, value in row.items():
            if column in header:
                want = "" if header[column] is None else str(formula_safe(header[column]))
            elif column == "details":
                want = json.dumps(record["details"], sort_keys=True, ensure_ascii=False)
            else:
                want = str(formula_safe(record.get(column, "")))
            if value != want:
                raise BundleError(f"records.csv differs from records.jsonl at {header['stream']} seq {header['seq']}")
    return {
        "records": total,
        "streams": len(streams),
        "checkpoints": len(signed["checkpoints"]),
        "key_id": bundle_key_id,
        "trust_root": fingerprint,
        "witness_key": str(witness_key),
        "range": manifest.get("range"),
    }


def _proved_shred(shred: dict[str, Any], keys: dict[str, str], witness_key: tp.VerifierKey, log: str) -> dict[str, Any]:
    """The details of a shred record after checking its hash, its action and its inclusion in a signed
    checkpoint of the platform stream; raises BundleError otherwise."""
    record, checkpoint = shred["record"], shred["checkpoint"]
    header = record["header"]
    where = f"shred record {header.get('stream')} seq {header.get('seq')}"
    ciphertext = base64.b64decode(record["ciphertext"], validate=True)
    if chain.record_hash(record["prev_hash"], header, ciphertext) != record["hash"]:
        raise BundleError(f"datakeys.json: {where} does not hash to its stored hash")
    if header.get("action") != "audit.key.shred" or header.get("stream") != "platform":
        raise BundleError(f"datakeys.json: {where} is not an audit.key.shred record of the platform stream")
    key_pem = keys.get(checkpoint.get("key_id", ""))
    if key_pem is None or not chain.verify_ed25519(
        key_pem, checkpoint["signature"], chain.checkpoint_payload(checkpoint)
    ):
        raise BundleError(f"datakeys.json: the checkpoint proving {where} has a bad signature")
    if checkpoint.get("stream") != "platform":
        raise BundleError(f"datakeys.json: the checkpoint proving {where} is of another stream")
    _checkpoint_ok(checkpoint | {"cosignature": shred.get("cosignature")}, "platform", keys, witness_key, log)
    index, size = header["seq"] - checkpoint["from_seq"], checkpoint["seq"] - checkpoint["from_seq"] + 1
    root = chain.root_from_inclusion_proof(record["hash"], index, size, shred["proof"])
    if root != checkpoint["merkle_root"]:
        raise BundleError(f"datakeys.json: {where} is not in the signed checkpoint at seq {checkpoint['seq']}")
    if not isinstance(record.get("details"), dict):
        raise BundleError(f"datakeys.json: {where} does not open ({record.get('details')!r})")
    return record["details"]


def _check_data_keys(
    data_keys: dict[str, Any],
    records_by_stream: dict[str, list[dict]],
    keys: dict[str, str],
    witness_key: tp.VerifierKey,
    log: str,
) -> None:
    listed: dict[str, dict[str, Any]] = data_keys.get("keys", {})
    named: dict[str, Any] = {}
    for shred in data_keys.get("shreds", []):
        details = _proved_shred(shred, keys, witness_key, log)
        for key_id in details.get("key_ids") or []:
            named[str(key_id)] = details.get("tenant_id")
    for stream, records in records_by_stream.items():
        for record in records:
            key_id = record["header"]["key_id"]
            info = listed.get(key_id)
            if info is None:
                raise BundleError(f"{stream} seq {record['header']['seq']}: data key {key_id} is not in datakeys.json")
            if record.get("details") == SHREDDED and not info.get("destroyed"):
                raise BundleError(
                    f"{stream} seq {record['header']['seq']} reads {SHREDDED} but its data key {key_id} is not listed "
                    "as destroyed"
                )
    for key_id, info in sorted(listed.items()):
        if not info.get("destroyed"):
            continue
        owner = f"tenant {info.get('tenant_id')}" if info.get("tenant_id") is not None else "the platform"
        if key_id not in named:
            raise BundleError(
                f"data key {key_id} of {owner} was destroyed (destroyed_at {info.get('destroyed_at')}) without an "
                "audit.key.shred record naming it: it was shredded outside the shred command"
            )
        if named[key_id] != info.get("tenant_id"):
            raise BundleError(f"data key {key_id} of {owner} is named by a shred record for tenant {named[key_id]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audit.bundle_verifier", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="the export bundle (.zip)")
    parser.add_argument(
        "--trust-root",
        help="the trust-root fingerprint you pinned (printed at install by `gpupool audit_trust_root`, shown on the "
        "console's audit page)",
    )
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="accept a bundle without a pinned trust root (checks only that it is internally consistent)",
    )
    args = parser.parse_args(argv)
    try:
        summary = verify_bundle(args.bundle, trust_root=args.trust_root)
    except BundleError as exc:
        print(f"FAILED: {exc}")
        return 1
    except Exception as exc:  # any malformed content is a failure, never a traceback that looks like a pass
        print(f"FAILED: the bundle could not be checked: {exc!r}")
        return 1
    if not args.trust_root and not args.unpinned:
        print(
            f"FAILED: the trust root is not pinned: the bundle is internally consistent under trust root "
            f"{summary['trust_root']}, but anyone can make such a bundle. Compare that fingerprint with the one you "
            f"pinned at install (the console's audit page shows it) and run again with --trust-root "
            f"{summary['trust_root']} (--unpinned to accept it as is)"
        )
        return 1
    pin = "" if args.trust_root else " (UNPINNED: --unpinned; compare the trust root with the one you pinned)"
    print(
        f"OK: {summary['records']} records in {summary['streams']} streams, {summary['checkpoints']} checkpoints, "
        f"each cosigned by witness {summary['witness_key'].split('+')[0]}; trust root {summary['trust_root']}{pin}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
