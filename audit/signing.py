"""Checkpoint signers behind one Protocol, chosen by ``GPUPOOL_AUDIT_SIGNER`` (a dotted path).

Ed25519 is the default. A 国密 deployment plugs in an SM2 signer (a maintained library or a certified crypto
device) with the same four members; ``cryptography`` has no SM2.
"""

from __future__ import annotations

import base64
from functools import lru_cache
from typing import Protocol, runtime_checkable

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.utils.module_loading import import_string

from audit import chain, conf


@runtime_checkable
class Signer(Protocol):
    algorithm: str
    key_id: str

    def sign(self, payload: bytes) -> str:
        """Base64 signature of ``payload``."""

    def public_key_pem(self) -> str:
        """The public key, PEM (SubjectPublicKeyInfo), for verifiers."""


class Ed25519Signer:
    algorithm = "ed25519"

    def __init__(self, seed: bytes | None = None) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(seed if seed is not None else conf.signing_seed())
        self._pem = (
            self._key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode("ascii")
        )
        self.key_id = chain.public_key_id(self._pem)

    def sign(self, payload: bytes) -> str:
        return base64.b64encode(self._key.sign(payload)).decode("ascii")

    def public_key_pem(self) -> str:
        return self._pem


@lru_cache(maxsize=8)
def _signer(path: str, seed: bytes) -> Signer:
    cls = import_string(path)
    return cls(seed) if path == "audit.signing.Ed25519Signer" else cls()


def get_signer() -> Signer:
    """The configured signer (cached per configuration)."""
    return _signer(conf.signer_path(), conf.signing_seed())
