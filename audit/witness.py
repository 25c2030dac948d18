"""The portal's side of the witness: one client interface over the witness service (``audit.witness_service``).

``GPUPOOL_AUDIT_WITNESS_URL`` set: the witness service over HTTP — production, where it runs under a user (and on a
host) of its own, so nobody who holds the database or the portal's credentials can write what it has signed.
Unset: the same witness embedded in the process, its state in ``conf.witness_state_dir()`` — development, tests
and the demo, where the portal's user could write it (the docs say so).

The log id names this database in the witness (so test and development databases sharing a witness do not mix).
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from typing import Any, Protocol

from django.db import connection

from audit import conf
from audit import witness_service as ws
from audit.witness_service import Conflict, WitnessError

__all__ = ["Conflict", "WitnessError", "WitnessUnavailable", "database_identity", "get_witness", "log_id"]


class WitnessUnavailable(WitnessError):
    """The witness could not be reached."""


def database_identity() -> str:
    settings_dict = connection.settings_dict
    return f"{settings_dict.get('ENGINE', '')}:{settings_dict.get('HOST', '') or ''}:{settings_dict.get('NAME', '')}"


def log_id() -> str:
    """This database's log id in the witness: 16 hex digits of SHA-256 of its identity."""
    return hashlib.sha256(database_identity().encode("utf-8")).hexdigest()[:16]


class WitnessClient(Protocol):
    def info(self) -> dict[str, Any]: ...
    def genesis(self, log: str, root_key_pem: str) -> dict[str, Any]: ...
    def add_rotation(self, log: str, rotation: dict[str, Any]) -> dict[str, Any]: ...
    def add_checkpoint(self, old_size: int, proof: list[bytes], note: str) -> str: ...
    def add_tombstone(self, log: str, tombstone: dict[str, Any]) -> str: ...
    def state(self, log: str) -> dict[str, Any]: ...
    def manifest(self, log: str) -> dict[str, Any]: ...


class EmbeddedWitness:
    """The witness in this process, on a state directory the processes of one installation share."""

    def __init__(self, state_dir: str) -> None:
        self._witness = ws.Witness(state_dir)

    def info(self) -> dict[str, Any]:
        return self._witness.info()

    def genesis(self, log: str, root_key_pem: str) -> dict[str, Any]:
        return self._witness.genesis(log, root_key_pem)

    def add_rotation(self, log: str, rotation: dict[str, Any]) -> dict[str, Any]:
        return self._witness.add_rotation(log, rotation)

    def add_checkpoint(self, old_size: int, proof: list[bytes], note: str) -> str:
        return self._witness.add_checkpoint(old_size, proof, note)

    def add_tombstone(self, log: str, tombstone: dict[str, Any]) -> str:
        return self._witness.add_tombstone(log, tombstone)

    def state(self, log: str) -> dict[str, Any]:
        return self._witness.state(log)

    def manifest(self, log: str) -> dict[str, Any]:
        return self._witness.manifest(log)


_ERRORS = {403: ws.Forbidden, 404: ws.UnknownLog, 422: ws.BadProof, 503: ws.Corrupt}


class HttpWitness:
    """The witness service over HTTP (``python -m audit.witness_service serve``)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url, self.timeout = url, timeout

    def _call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"):
        request = urllib.request.Request(self.url + path, data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", errors="replace")
            if exc.code == 409:
                raise Conflict("the witness holds another size", size=int(text.strip() or 0)) from None
            try:
                message = json.loads(text).get("error", text)
            except ValueError:
                message = text
            raise _ERRORS.get(exc.code, WitnessError)(f"witness {self.url}: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise WitnessUnavailable(f"the witness {self.url} cannot be reached: {exc}") from exc

    def _json(self, method: str, path: str, value: Any | None = None) -> Any:
        body = None if value is None else json.dumps(value).encode("utf-8")
        return json.loads(self._call(method, path, body))

    def info(self) -> dict[str, Any]:
        return self._json("GET", "/info")

    def genesis(self, log: str, root_key_pem: str) -> dict[str, Any]:
        return self._json("POST", f"/logs/{log}/genesis", {"root_key_pem": root_key_pem})

    def add_rotation(self, log: str, rotation: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", f"/logs/{log}/rotations", rotation)

    def add_checkpoint(self, old_size: int, proof: list[bytes], note: str) -> str:
        body = ws.encode_add_checkpoint(old_size, proof, note)
        return self._call("POST", "/add-checkpoint", body, "text/plain; charset=utf-8").decode("utf-8")

    def add_tombstone(self, log: str, tombstone: dict[str, Any]) -> str:
        return self._json("POST", f"/logs/{log}/tombstones", tombstone)["witness_signature"]

    def state(self, log: str) -> dict[str, Any]:
        return self._json("GET", f"/logs/{log}")

    def manifest(self, log: str) -> dict[str, Any]:
        return self._json("GET", f"/logs/{log}/manifest")


_embedded: dict[str, EmbeddedWitness] = {}


def get_witness() -> WitnessClient:
    """The configured witness."""
    url = conf.witness_url()
    if url:
        return HttpWitness(url)
    state_dir = str(conf.witness_state_dir())
    if state_dir not in _embedded:
        _embedded[state_dir] = EmbeddedWitness(state_dir)
    return _embedded[state_dir]


def describe() -> str:
    """Where the witness is, for messages."""
    return conf.witness_url() or f"the embedded witness in {conf.witness_state_dir()}"
