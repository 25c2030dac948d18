"""Offline verifier for audit export bundles: ``python -m audit.verify bundle.zip [--key-id ID]``.

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
import hashlib
import io
import json
import sys
import zipfile
from typing import Any

from audit import chain
from audit.csvsafe import formula_safe

REQUIRED = (
    "manifest.json",
    "manifest.sig",
    "records.jsonl",
    "records.csv",
    "checkpoints.json",
    "keys.json",
    "datakeys.json",
    "public_key.pem",
)
SHREDDED = "[shredded]"


class BundleError(Exception):
    pass


def _read(bundle: zipfile.ZipFile, name: str) -> bytes:
    try:
        return bundle.read(name)
    except KeyError:
        raise BundleError(f"{name} is missing from the bundle") from None


def verify_bundle(path: str, *, key_id: str | None = None, public_key_pem: str | None = None) -> dict[str, Any]:
    """Verify the bundle at ``path``; returns a summary, raises BundleError naming the first problem."""
    try:
        bundle = zipfile.ZipFile(path)
        names = set(bundle.namelist())
        bodies = {name: _read(bundle, name) for name in REQUIRED}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise BundleError(f"not a readable bundle: {exc}") from exc
    extra = names - set(REQUIRED)
    if extra:
        raise BundleError(f"unexpected files in the bundle: {sorted(extra)}")

    # 1. The manifest is signed by the bundle's key (pinned by the caller, if given).
    pem = bodies["public_key.pem"].decode("ascii", errors="replace")
    if public_key_pem is not None and public_key_pem.strip() != pem.strip():
        raise BundleError("the bundle is signed by a different public key than the one you pinned")
    bundle_key_id = chain.public_key_id(pem)
    if key_id is not None and key_id != bundle_key_id:
        raise BundleError(f"the bundle is signed by key {bundle_key_id}, not the pinned {key_id}")
    signature = bodies["manifest.sig"].decode("ascii", errors="replace").strip()
    if bodies["manifest.sig"] != (signature + "\n").encode("ascii", errors="replace"):
        raise BundleError("manifest.sig is malformed")
    if not chain.verify_ed25519(pem, signature, bodies["manifest.json"]):
        raise BundleError("the manifest signature does not verify")
    try:
        manifest = json.loads(bodies["manifest.json"])
    except json.JSONDecodeError as exc:
        raise BundleError(f"manifest.json is not JSON: {exc}") from exc
    if manifest.get("signing_key_id") != bundle_key_id:
        raise BundleError("the manifest names another signing key than public_key.pem")

    # 2. Every file is the one the manifest hashed.
    listed = manifest.get("files", {})
    if set(listed) != set(REQUIRED) - {"manifest.json", "manifest.sig"}:
        raise BundleError("the manifest does not list exactly the bundle's files")
    for name, digest in listed.items():
        if hashlib.sha256(bodies[name]).hexdigest() != digest:
            raise BundleError(f"{name} was changed: its SHA-256 does not match the manifest")

    # 3. The chain, per stream, against the signed checkpoints.
    keys: dict[str, str] = json.loads(bodies["keys.json"])
    for kid, key_pem in keys.items():
        if chain.public_key_id(key_pem) != kid:
            raise BundleError(f"keys.json: key {kid} does not match its id")
    signed = json.loads(bodies["checkpoints.json"])
    records_by_stream: dict[str, list[dict]] = {}
    for number, line in enumerate(bodies["records.jsonl"].decode("utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
            records_by_stream.setdefault(record["header"]["stream"], []).append(record)
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise BundleError(f"records.jsonl line {number} is malformed: {exc}") from exc
    streams = manifest.get("streams", {})
    if set(records_by_stream) != set(streams):
        raise BundleError("records.jsonl holds other streams than the manifest lists")
    findings: list[chain.Finding] = []
    total = 0
    for stream, info in streams.items():
        records = sorted(records_by_stream[stream], key=lambda r: r["header"]["seq"])
        if len(records) != info["records"]:
            raise BundleError(f"{stream}: the manifest lists {info['records']} records, the bundle has {len(records)}")
        total += len(records)
        checkpoints = [c for c in signed["checkpoints"] if c["stream"] == stream]
        tombstones = [t for t in signed["tombstones"] if t["stream"] == stream]
        start_seq, start_hash = info["from_seq"], chain.GENESIS_HASH
        if start_seq > 1:
            anchors = [c for c in checkpoints if c["seq"] == start_seq - 1]
            anchors += [
                t | {"seq": t["through_seq"], "head_hash": t["through_hash"]}
                for t in tombstones
                if t["through_seq"] == start_seq - 1
            ]
            if not anchors:
                raise BundleError(f"{stream}: nothing signed anchors the first record (seq {start_seq})")
            start_hash = anchors[0]["head_hash"]
        for tombstone in tombstones:
            tkey = keys.get(tombstone["key_id"])
            if tkey is None or not chain.verify_ed25519(
                tkey, tombstone["signature"], chain.tombstone_payload(tombstone)
            ):
                raise BundleError(f"{stream}: tombstone through seq {tombstone['through_seq']} has a bad signature")
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
        findings.extend(chain.walk_chain(stream, chain_records, start_seq=start_seq, start_hash=start_hash))
        hashes = {r.seq: r.hash for r in chain_records}
        findings.extend(chain.check_checkpoints(stream, checkpoints, hashes, keys, purged_through=start_seq - 1))
        covered = set()
        for checkpoint in checkpoints:
            covered |= set(range(checkpoint["from_seq"], checkpoint["seq"] + 1))
        uncovered = sorted(set(hashes) - covered)
        if uncovered or (chain_records and chain_records[-1].seq != info["to_seq"]):
            raise BundleError(
                f"{stream}: records {uncovered[:5]}… are not covered by a signed checkpoint"
                if uncovered
                else f"{stream}: the records end before seq {info['to_seq']}"
            )
    if findings:
        raise BundleError("; ".join(f"{f.stream}: {f.message}" for f in findings[:10]))

    # 4. No data key was destroyed without a shred record in the chain.
    _check_data_keys(json.loads(bodies["datakeys.json"]), records_by_stream, keys)

    # 5. The CSV says what the JSON Lines say.
    rows = list(csv.DictReader(io.StringIO(bodies["records.csv"].decode("utf-8"))))
    expected = [r for stream in streams for r in sorted(records_by_stream[stream], key=lambda r: r["header"]["seq"])]
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
        "range": manifest.get("range"),
    }


def _proved_shred(shred: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
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
    index, size = header["seq"] - checkpoint["from_seq"], checkpoint["seq"] - checkpoint["from_seq"] + 1
    root = chain.root_from_inclusion_proof(record["hash"], index, size, shred["proof"])
    if root != checkpoint["merkle_root"]:
        raise BundleError(f"datakeys.json: {where} is not in the signed checkpoint at seq {checkpoint['seq']}")
    if not isinstance(record.get("details"), dict):
        raise BundleError(f"datakeys.json: {where} does not open ({record.get('details')!r})")
    return record["details"]


def _check_data_keys(data_keys: dict[str, Any], records_by_stream: dict[str, list[dict]], keys: dict[str, str]) -> None:
    listed: dict[str, dict[str, Any]] = data_keys.get("keys", {})
    named: dict[str, Any] = {}
    for shred in data_keys.get("shreds", []):
        details = _proved_shred(shred, keys)
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
    parser = argparse.ArgumentParser(prog="python -m audit.verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="the export bundle (.zip)")
    parser.add_argument("--key-id", help="the signing key id you expect (from the exporting site)")
    parser.add_argument("--public-key", help="a PEM file with the public key you expect")
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="accept a bundle without a pinned key (checks only that it is internally consistent)",
    )
    args = parser.parse_args(argv)
    pinned = open(args.public_key, encoding="ascii").read() if args.public_key else None
    try:
        summary = verify_bundle(args.bundle, key_id=args.key_id, public_key_pem=pinned)
    except BundleError as exc:
        print(f"FAILED: {exc}")
        return 1
    except Exception as exc:  # any malformed content is a failure, never a traceback that looks like a pass
        print(f"FAILED: the bundle could not be checked: {exc!r}")
        return 1
    pinned_key = bool(args.key_id or args.public_key)
    if not pinned_key and not args.unpinned:
        print(
            f"FAILED: the signing key is not pinned: the bundle is internally consistent and signed by key "
            f"{summary['key_id']}, but anyone can make such a bundle. Compare that id with the exporting site and "
            f"run again with --key-id {summary['key_id']} (or --public-key FILE; --unpinned to accept it as is)"
        )
        return 1
    pin = "" if pinned_key else " (UNPINNED: --unpinned; compare the key id with the exporting site)"
    print(
        f"OK: {summary['records']} records in {summary['streams']} streams, {summary['checkpoints']} checkpoints, "
        f"signed by key {summary['key_id']}{pin}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
