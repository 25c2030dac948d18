"""Sealing audit details: AES-256-GCM (or SM4-GCM) under per-tenant data keys wrapped by the master key ring.

Data keys are wrapped with AES-256-GCM under the active master key; rotation re-wraps them (the records, sealed
under the data keys, are never re-encrypted). The header of a record is the AEAD's associated data, so a
ciphertext cannot be moved to another record or have its header changed without failing to open.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from audit import conf

NONCE_BYTES = 12
GCM_TAG_BYTES = 16
KEY_BYTES = {"aes-256-gcm": 32, "sm4-gcm": 16}


class KeyUnavailable(Exception):
    """The data key was destroyed (crypto-shredded) or its master key is no longer in the ring."""


class SealBroken(Exception):
    """The ciphertext does not open under its key and header: it was changed or forged."""


def sm4_gcm_available() -> bool:
    """True when the installed ``cryptography``/OpenSSL offers SM4 in GCM mode."""
    if not hasattr(algorithms, "SM4"):
        return False
    try:
        encryptor = Cipher(algorithms.SM4(b"\0" * 16), modes.GCM(b"\0" * NONCE_BYTES)).encryptor()
        encryptor.update(b"x")
        encryptor.finalize()
    except Exception:  # UnsupportedAlgorithm, or an OpenSSL build without SM4
        return False
    return True


def new_data_key(cipher: str) -> bytes:
    return os.urandom(KEY_BYTES[cipher])


def seal(cipher: str, key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """Ciphertext ‖ 16-byte tag."""
    if cipher == "aes-256-gcm":
        return AESGCM(key).encrypt(nonce, plaintext, aad)
    if cipher == "sm4-gcm":
        encryptor = Cipher(algorithms.SM4(key), modes.GCM(nonce)).encryptor()
        encryptor.authenticate_additional_data(aad)
        body = encryptor.update(plaintext) + encryptor.finalize()
        return body + encryptor.tag
    raise ValueError(f"unknown cipher {cipher!r}")


def open_sealed(cipher: str, key: bytes, nonce: bytes, ciphertext: bytes, aad: bytes) -> bytes:
    try:
        if cipher == "aes-256-gcm":
            return AESGCM(key).decrypt(nonce, ciphertext, aad)
        if cipher == "sm4-gcm":
            body, tag = ciphertext[:-GCM_TAG_BYTES], ciphertext[-GCM_TAG_BYTES:]
            decryptor = Cipher(algorithms.SM4(key), modes.GCM(nonce, tag)).decryptor()
            decryptor.authenticate_additional_data(aad)
            return decryptor.update(body) + decryptor.finalize()
    except (InvalidTag, ValueError) as exc:
        raise SealBroken(str(exc) or "authentication tag mismatch") from exc
    raise ValueError(f"unknown cipher {cipher!r}")


def _wrap_aad(key_id: str, tenant_id: int | None, cipher: str) -> bytes:
    return f"gpupool-audit-datakey:{key_id}:{tenant_id if tenant_id is not None else 'platform'}:{cipher}".encode()


def wrap_data_key(*, key_id: str, tenant_id: int | None, cipher: str, data_key: bytes) -> tuple[str, bytes]:
    """Wrap under the active (newest) master key: ``(master_key_id, nonce ‖ ciphertext)``."""
    master_id, master = conf.master_keys()[-1]
    nonce = os.urandom(NONCE_BYTES)
    return master_id, nonce + AESGCM(master).encrypt(nonce, data_key, _wrap_aad(key_id, tenant_id, cipher))


def unwrap_data_key(*, key_id: str, tenant_id: int | None, cipher: str, master_key_id: str, wrapped: bytes) -> bytes:
    ring = dict(conf.master_keys())
    master = ring.get(master_key_id)
    if master is None:
        raise KeyUnavailable(
            f"master key {master_key_id!r} is not in GPUPOOL_AUDIT_MASTER_KEYS; keep retired keys in the ring until "
            "`manage.py audit_rotate_keys` has re-wrapped every data key."
        )
    if not wrapped:
        raise KeyUnavailable(f"data key {key_id} was destroyed")
    try:
        return AESGCM(master).decrypt(
            wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], _wrap_aad(key_id, tenant_id, cipher)
        )
    except InvalidTag as exc:
        raise KeyUnavailable(f"data key {key_id} does not unwrap under master key {master_key_id!r}") from exc
