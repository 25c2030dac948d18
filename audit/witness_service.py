"""The audit witness: countersigns checkpoints that extend what it has already signed, and nothing else.

``python -m audit.witness_service serve --state-dir /var/lib/gpupool-witness --listen 127.0.0.1:8470`` — run it
under a user of its own (in production on a host of its own): neither the database's administrators nor the
portal's credentials can write its state. Standard library and ``cryptography`` only, no Django.

It keeps, per log (one gpupool database) and per stream, the latest checkpoint it cosigned, and accepts a new one
only when

- it is signed by the log's *current* signing key: the root key of the log's genesis entry, or the last key a
  chain of rotations signed by their predecessors leads to (so a key planted in the database is refused), and
- an RFC 9162 consistency proof shows it extends the tree it cosigned last (so history it has seen cannot be
  rewritten, and its size never goes back: a cut tail is visible to every verifier that asks it).

The HTTP API follows C2SP ``tlog-witness`` for checkpoints: ``POST /add-checkpoint`` with the body
``old <size>\\n<base64 proof hashes, one a line>\\n\\n<signed checkpoint note>``; 200 with the ``cosignature/v1``
line, 409 with the witness's size (``text/x.tlog.size``) when ``old`` is not what it holds, 403 when the note is
not signed by the log's current key, 422 when the proof does not verify, 404 for an unknown log. The rest is
ours (JSON): ``GET /info``, ``POST /logs/<log>/genesis``, ``POST /logs/<log>/rotations``,
``POST /logs/<log>/tombstones``, ``GET /logs/<log>`` (genesis, rotations, the latest cosigned checkpoint of every
stream, tombstones) and ``GET /logs/<log>/manifest`` (the same streams and sizes, signed by the witness now).

Its state is one journal (``journal.jsonl``): every accepted statement, hash-chained and signed by the witness
key (``witness.key``, 0600). A line that is not signed, or does not link, makes the witness refuse to serve
(fail closed), so appending to the journal forges nothing.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import transparency as tp

GENESIS_HASH = "0" * 64


class WitnessError(Exception):
    status = HTTPStatus.BAD_REQUEST

    def __init__(self, message: str, *, size: int | None = None) -> None:
        super().__init__(message)
        self.size = size


class Conflict(WitnessError):
    status = HTTPStatus.CONFLICT


class Forbidden(WitnessError):
    status = HTTPStatus.FORBIDDEN


class UnknownLog(WitnessError):
    status = HTTPStatus.NOT_FOUND


class BadProof(WitnessError):
    status = HTTPStatus.UNPROCESSABLE_ENTITY


class Corrupt(WitnessError):
    status = HTTPStatus.SERVICE_UNAVAILABLE


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


class Witness:
    """The witness's state, in ``state_dir``. Safe for several processes on one state directory (each call
    re-reads what others appended, under an exclusive lock on the journal)."""

    def __init__(self, state_dir: str | os.PathLike[str], name: str = "gpupool-witness") -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.name = name
        key_path = self.state_dir / "witness.key"
        if not key_path.exists():
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, base64.b64encode(os.urandom(32)) + b"\n")
            finally:
                os.close(fd)
        seed = base64.b64decode(key_path.read_bytes().strip())
        self._signer = tp.CosignatureSigner(name, Ed25519PrivateKey.from_private_bytes(seed))
        self.journal_path = self.state_dir / "journal.jsonl"
        self._lock = threading.Lock()
        self._offset = 0
        self._last_hash = GENESIS_HASH
        self._lines = 0
        self._corrupt: str | None = None
        self.logs: dict[str, dict[str, Any]] = {}

    @property
    def vkey(self) -> str:
        return str(self._signer.vkey)

    # --- the journal --------------------------------------------------------------------------------------

    def _catch_up(self, handle: Any) -> None:
        handle.seek(self._offset)
        for raw in handle:
            if not raw.endswith(b"\n"):
                break  # a write in progress by another process cannot be: we hold the lock; a torn line
            self._lines += 1
            try:
                line = json.loads(raw)
                entry, signature = line["entry"], line["signature"]
                ok = line.get("prev") == self._last_hash and tp.statement_signed(
                    {"prev": line["prev"], "entry": entry}, signature, self._signer.vkey
                )
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                self._corrupt = (
                    f"witness journal line {self._lines} is not signed by the witness or does not link to the line "
                    "before it: the journal was written by someone else"
                )
                self._offset = handle.tell()
                return
            self._apply(entry)
            self._last_hash = hashlib.sha256(raw.rstrip(b"\n")).hexdigest()
            self._offset = handle.tell()

    def _transaction(self, change: Any) -> Any:
        """Run ``change(self)`` with the journal locked and current; it returns (entries to append, answer)."""
        with self._lock:
            fd = os.open(self.journal_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "r+b") as handle:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                self._catch_up(handle)
                if self._corrupt:
                    raise Corrupt(self._corrupt)
                entries, answer = change()
                for entry in entries:
                    line = {"prev": self._last_hash, "entry": entry}
                    line["signature"] = self._signer.sign_statement({"prev": line["prev"], "entry": entry})
                    raw = json.dumps(line, sort_keys=True, separators=(",", ":")).encode("utf-8")
                    handle.write(raw + b"\n")
                    handle.flush()
                    self._apply(entry)
                    self._last_hash = hashlib.sha256(raw).hexdigest()
                    self._lines += 1
                if entries:
                    os.fsync(handle.fileno())
                self._offset = handle.seek(0, os.SEEK_END)
                return answer

    def _apply(self, entry: dict[str, Any]) -> None:
        log = self.logs.setdefault(entry["log"], {"streams": {}, "rotations": [], "tombstones": {}})
        kind = entry["type"]
        if kind == "genesis":
            log["genesis"] = entry["genesis"]
            log["keys"] = [
                (
                    tp.key_id(entry["genesis"]["statement"]["root_key_pem"]),
                    entry["genesis"]["statement"]["root_key_pem"],
                )
            ]
        elif kind == "rotation":
            log["rotations"].append(entry["rotation"])
            log["keys"].append(
                (entry["rotation"]["statement"]["key_id"], entry["rotation"]["statement"]["public_key_pem"])
            )
        elif kind == "checkpoint":
            log["streams"][entry["stream"]] = entry
            log["min_key"] = max(log.get("min_key", 0), entry.get("key_index", 0))
        elif kind == "tombstone":
            log["tombstones"].setdefault(entry["stream"], []).append(entry)

    def read(self) -> None:
        """Bring the in-memory view up to date with the journal (raises Corrupt)."""
        self._transaction(lambda: ([], None))

    # --- the operations -----------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "witness_key": self.vkey, "format": "gpupool-witness/1"}

    def genesis(self, log_id: str, root_key_pem: str) -> dict[str, Any]:
        """The log's genesis entry, made the first time the log calls (idempotent for the same root key)."""
        tp.raw_public_key(root_key_pem)

        def change():
            log = self.logs.get(log_id)
            if log and "genesis" in log:
                if log["genesis"]["statement"]["root_key_pem"].strip() != root_key_pem.strip():
                    raise Forbidden(f"log {log_id} already has a trust root with another key")
                return [], log["genesis"]
            statement = {
                "type": "genesis",
                "log": log_id,
                "root_key_pem": root_key_pem,
                "root_key_id": tp.key_id(root_key_pem),
                "witness_key": self.vkey,
                "created_at": _now_iso(),
            }
            genesis = {"statement": statement, "signature": self._signer.sign_statement(statement)}
            return [{"type": "genesis", "log": log_id, "genesis": genesis}], genesis

        return self._transaction(change)

    def _log(self, log_id: str) -> dict[str, Any]:
        log = self.logs.get(log_id)
        if not log or "genesis" not in log:
            raise UnknownLog(f"the witness has no genesis for log {log_id}")
        return log

    def add_rotation(self, log_id: str, rotation: dict[str, Any]) -> dict[str, Any]:
        def change():
            log = self._log(log_id)
            genesis_pem = log["genesis"]["statement"]["root_key_pem"]
            try:
                tp.key_chain(genesis_pem, [*log["rotations"], rotation])
            except tp.ProofError as exc:
                raise Forbidden(str(exc)) from exc
            return [{"type": "rotation", "log": log_id, "rotation": rotation}], {"keys": len(log["rotations"]) + 2}

        return self._transaction(change)

    def add_checkpoint(self, old_size: int, proof: list[bytes], note: str) -> str:
        """Cosign ``note`` (a signed checkpoint) if it extends the tree cosigned last; the cosignature line."""
        body, _signatures = tp.split_note(note)
        checkpoint = tp.parse_checkpoint(body)

        def change():
            log = self._log(checkpoint.log_id)
            # Any key of the chain from the one that signed the log's newest checkpoint on: checkpoints signed
            # just before a rotation still get in, and once the new key has signed, the old one never again.
            name = tp.log_key_name(checkpoint.log_id)
            signed_by = None
            for index in range(log.get("min_key", 0), len(log["keys"])):
                key = tp.VerifierKey(name, tp.ALG_ED25519, tp.raw_public_key(log["keys"][index][1]))
                if tp.note_signed_by(note, key):
                    signed_by = index
            if signed_by is None:
                raise Forbidden(
                    f"the checkpoint is not signed by the log's current key {log['keys'][-1][0]} (a key is valid "
                    "only through the trust root and rotations signed by its predecessor)"
                )
            latest = log["streams"].get(checkpoint.stream)
            size = latest["size"] if latest else 0
            if latest and checkpoint.size == size:
                if base64.b64decode(latest["root"]) == checkpoint.root:
                    return [], latest["cosignature"]
                raise BadProof(f"{checkpoint.stream}: another root for size {size} than the one cosigned")
            if old_size != size:
                raise Conflict(f"the witness holds size {size} for {checkpoint.stream}", size=size)
            old_root = base64.b64decode(latest["root"]) if latest else tp.EMPTY_ROOT
            if not tp.verify_consistency(size, checkpoint.size, old_root, checkpoint.root, proof):
                raise BadProof(
                    f"{checkpoint.stream}: the checkpoint at size {checkpoint.size} is not consistent with the one "
                    f"cosigned at size {size} (history was rewritten)"
                )
            cosignature = self._signer.cosign(body, int(time.time()))
            entry = {
                "type": "checkpoint",
                "log": checkpoint.log_id,
                "stream": checkpoint.stream,
                "size": checkpoint.size,
                "root": base64.b64encode(checkpoint.root).decode("ascii"),
                "note": note,
                "cosignature": cosignature,
                "key_index": signed_by,
            }
            return [entry], cosignature

        return self._transaction(change)

    def add_tombstone(self, log_id: str, tombstone: dict[str, Any]) -> str:
        """Record a signed purge: it must name a head this witness cosigned; returns the witness's signature."""

        def change():
            log = self._log(log_id)
            stream = str(tombstone.get("stream"))
            latest = log["streams"].get(stream)
            if latest is None or int(tombstone.get("through_seq", -1)) > latest["size"]:
                raise Forbidden(f"{stream}: a purge may only cut what the witness has cosigned")
            keys = dict(log["keys"])
            pem = keys.get(str(tombstone.get("key_id")))
            if pem is None:
                raise Forbidden("the tombstone is signed by a key outside the log's key chain")
            signature = base64.b64decode(str(tombstone.get("signature", "")))
            if not tp.ed25519_verify(tp.raw_public_key(pem), signature, tombstone_payload(tombstone)):
                raise Forbidden("the tombstone's signature does not verify")
            statement = {"type": "tombstone", "log": log_id, "tombstone": tombstone}
            entry = {
                "type": "tombstone",
                "log": log_id,
                "stream": stream,
                "tombstone": tombstone,
                "witness_signature": self._signer.sign_statement(statement),
            }
            return [entry], entry["witness_signature"]

        return self._transaction(change)

    def state(self, log_id: str) -> dict[str, Any]:
        def change():
            log = self._log(log_id)
            streams = {
                stream: {"size": e["size"], "root": e["root"], "note": e["note"], "cosignature": e["cosignature"]}
                for stream, e in log["streams"].items()
            }
            return [], {
                "genesis": log["genesis"],
                "rotations": list(log["rotations"]),
                "streams": streams,
                "tombstones": {
                    s: [t["tombstone"] | {"witness_signature": t["witness_signature"]} for t in ts]
                    for s, ts in log["tombstones"].items()
                },
            }

        return self._transaction(change)

    def manifest(self, log_id: str) -> dict[str, Any]:
        """Every stream the witness has cosigned for the log, with its size and root, signed now."""

        def change():
            log = self._log(log_id)
            statement = {
                "type": "stream_manifest",
                "log": log_id,
                "time": int(time.time()),
                "streams": {s: [e["size"], e["root"]] for s, e in sorted(log["streams"].items())},
            }
            return [], {"statement": statement, "signature": self._signer.sign_statement(statement)}

        return self._transaction(change)


def tombstone_payload(tombstone: dict[str, Any]) -> bytes:
    """The bytes a tombstone's signature covers (the same as ``audit.chain.tombstone_payload``)."""
    return tp.canonical_json(
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


# --- the add-checkpoint wire format (C2SP tlog-witness) ----------------------------------------------------


def encode_add_checkpoint(old_size: int, proof: list[bytes], note: str) -> bytes:
    lines = [f"old {old_size}", *tp.encode_hashes(proof)]
    return ("\n".join(lines) + "\n\n" + note).encode("utf-8")


def decode_add_checkpoint(body: bytes) -> tuple[int, list[bytes], str]:
    text = body.decode("utf-8")
    head, sep, note = text.partition("\n\n")
    lines = head.split("\n")
    if not sep or not lines[0].startswith("old ") or not lines[0][4:].isdigit():
        raise WitnessError("the body is 'old <size>', the proof lines, a blank line and the checkpoint")
    try:
        proof = tp.decode_hashes(lines[1:])
    except ValueError as exc:
        raise WitnessError("a proof line is not a base64 SHA-256 hash") from exc
    return int(lines[0][4:]), proof, note


# --- HTTP -------------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    witness: Witness
    server_version = "gpupool-witness/1"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet; errors are answered, not logged
        return

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value, sort_keys=True).encode("utf-8"))

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > 4 * 1024 * 1024:
            raise WitnessError("request too large")
        return self.rfile.read(length)

    def _route(self, method: str) -> None:
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        try:
            if method == "GET" and parts == ["info"]:
                return self._json(200, self.witness.info())
            if method == "POST" and parts == ["add-checkpoint"]:
                old, proof, note = decode_add_checkpoint(self._body())
                cosignature = self.witness.add_checkpoint(old, proof, note)
                return self._send(200, cosignature.encode("utf-8"), "text/plain; charset=utf-8")
            if len(parts) >= 2 and parts[0] == "logs":
                log_id = parts[1]
                if method == "GET" and len(parts) == 2:
                    return self._json(200, self.witness.state(log_id))
                if method == "GET" and parts[2:] == ["manifest"]:
                    return self._json(200, self.witness.manifest(log_id))
                if method == "POST" and parts[2:] == ["genesis"]:
                    return self._json(200, self.witness.genesis(log_id, json.loads(self._body())["root_key_pem"]))
                if method == "POST" and parts[2:] == ["rotations"]:
                    return self._json(200, self.witness.add_rotation(log_id, json.loads(self._body())))
                if method == "POST" and parts[2:] == ["tombstones"]:
                    signature = self.witness.add_tombstone(log_id, json.loads(self._body()))
                    return self._json(200, {"witness_signature": signature})
            return self._json(404, {"error": f"no such endpoint: {method} {self.path}"})
        except Conflict as exc:
            return self._send(409, f"{exc.size}\n".encode(), "text/x.tlog.size")
        except WitnessError as exc:
            return self._json(exc.status, {"error": str(exc)})
        except (tp.ProofError, ValueError, KeyError, TypeError) as exc:
            return self._json(400, {"error": f"malformed request: {exc}"})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


def serve(state_dir: str, host: str, port: int) -> ThreadingHTTPServer:
    witness = Witness(state_dir)
    witness.read()
    handler = type("WitnessHandler", (_Handler,), {"witness": witness})
    return ThreadingHTTPServer((host, port), handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audit.witness_service", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="serve the witness over HTTP")
    run.add_argument("--state-dir", required=True, help="its key and journal (only the witness's user may write)")
    run.add_argument("--listen", default="127.0.0.1:8470", help="HOST:PORT (default 127.0.0.1:8470)")
    show = sub.add_parser("info", help="print the witness key (to pin) and each log's trust-root fingerprint")
    show.add_argument("--state-dir", required=True)
    args = parser.parse_args(argv)
    if args.command == "info":
        witness = Witness(args.state_dir)
        witness.read()
        print(f"witness key: {witness.vkey}")
        for log_id, log in sorted(witness.logs.items()):
            if "genesis" in log:
                print(f"log {log_id}: trust root {tp.trust_root_fingerprint(log['genesis'])}")
        return 0
    host, _, port = args.listen.rpartition(":")
    server = serve(args.state_dir, host or "127.0.0.1", int(port))
    print(f"gpupool witness listening on {args.listen} (state {args.state_dir})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
