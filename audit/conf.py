"""Audit settings, read in one place with their defaults and checks.

Every value comes from ``portal.settings`` (``GPUPOOL_AUDIT_*``); tests override them with ``settings``.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger(__name__)

MIN_RETENTION_DAYS = 180  # 网络安全法 Art. 21: network logs are kept at least six months.
CIPHERS = ("aes-256-gcm", "sm4-gcm")
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def _dev_key(purpose: str) -> bytes:
    # Development material derived from the (development) secret key; production settings refuse this.
    return hashlib.sha256(f"gpupool-audit-dev:{purpose}:{settings.SECRET_KEY}".encode()).digest()


def _refuse_development_keys(name: str, shape: str) -> None:
    if getattr(settings, "GPUPOOL_AUDIT_REQUIRE_REAL_KEYS", False):
        raise ImproperlyConfigured(
            f"{name} is unset; production settings refuse the development audit keys. Set {name}={shape} with "
            "32 random bytes: `python -c 'import base64,os; print(base64.b64encode(os.urandom(32)).decode())'`."
        )


def master_keys() -> list[tuple[str, bytes]]:
    """The master key ring as ``[(key_id, 32-byte key), ...]``; the last entry is the active (newest) key.

    ``GPUPOOL_AUDIT_MASTER_KEYS="kid1:BASE64,kid2:BASE64"``. Unset: a development ring derived from the
    secret key (embedded/dev mode only; ``portal.production_settings`` refuses to start without a real ring).
    """
    raw = getattr(settings, "GPUPOOL_AUDIT_MASTER_KEYS", "") or ""
    if not raw.strip():
        _refuse_development_keys("GPUPOOL_AUDIT_MASTER_KEYS", "kid1:BASE64")
        _warn_once("master", "GPUPOOL_AUDIT_MASTER_KEYS is unset: using a development key ring (not for production)")
        return [("dev1", _dev_key("master"))]
    ring: list[tuple[str, bytes]] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        kid, sep, b64 = item.partition(":")
        try:
            key = base64.b64decode(b64, validate=True)
        except ValueError:
            key = b""
        if not sep or not kid or len(key) != 32:
            raise ImproperlyConfigured(
                f"GPUPOOL_AUDIT_MASTER_KEYS entry {kid or item!r} must be 'kid:BASE64' of 32 random bytes; make one "
                "with `python -c 'import base64,os; print(base64.b64encode(os.urandom(32)).decode())'`."
            )
        ring.append((kid, key))
    if len({kid for kid, _ in ring}) != len(ring):
        raise ImproperlyConfigured("GPUPOOL_AUDIT_MASTER_KEYS has a key id twice; give every key its own id.")
    return ring


def cipher() -> str:
    name = (getattr(settings, "GPUPOOL_AUDIT_CIPHER", "") or "aes-256-gcm").lower()
    if name not in CIPHERS:
        raise ImproperlyConfigured(f"GPUPOOL_AUDIT_CIPHER={name!r} is not one of {', '.join(CIPHERS)}.")
    return name


def signing_seed() -> bytes:
    """The 32-byte Ed25519 private key seed (``GPUPOOL_AUDIT_SIGNING_KEY``, base64), dev-derived when unset."""
    raw = getattr(settings, "GPUPOOL_AUDIT_SIGNING_KEY", "") or ""
    if not raw.strip():
        _refuse_development_keys("GPUPOOL_AUDIT_SIGNING_KEY", "BASE64")
        _warn_once("signing", "GPUPOOL_AUDIT_SIGNING_KEY is unset: using a development signing key")
        return _dev_key("signing")
    try:
        seed = base64.b64decode(raw.strip(), validate=True)
    except ValueError:
        seed = b""
    if len(seed) != 32:
        raise ImproperlyConfigured(
            "GPUPOOL_AUDIT_SIGNING_KEY must be base64 of a 32-byte Ed25519 seed; make one with "
            "`python -c 'import base64,os; print(base64.b64encode(os.urandom(32)).decode())'`."
        )
    return seed


def signer_path() -> str:
    return getattr(settings, "GPUPOOL_AUDIT_SIGNER", "") or "audit.signing.Ed25519Signer"


def witness_path() -> Path:
    default = Path(settings.DATA_DIR) / "audit-witness.jsonl"
    return Path(getattr(settings, "GPUPOOL_AUDIT_WITNESS_PATH", "") or default)


def witness_url() -> str:
    return (getattr(settings, "GPUPOOL_AUDIT_WITNESS_URL", "") or "").rstrip("/")


def witness_state_dir() -> Path:
    """The embedded witness's state directory (GPUPOOL_AUDIT_WITNESS_PATH without its suffix, + ``.d``)."""
    path = witness_path()
    return path.with_name(path.stem + ".d") if path.suffix else path


def trust_root() -> str | None:
    """The pinned trust-root fingerprint (GPUPOOL_AUDIT_TRUST_ROOT), or None when unpinned."""
    value = (getattr(settings, "GPUPOOL_AUDIT_TRUST_ROOT", "") or "").strip().lower()
    return value or None


def integrity_check_seconds() -> int:
    return max(5, int(getattr(settings, "GPUPOOL_AUDIT_INTEGRITY_CHECK_SECONDS", 60)))


def checkpoint_every_records() -> int:
    return max(1, int(getattr(settings, "GPUPOOL_AUDIT_CHECKPOINT_RECORDS", 1000)))


def checkpoint_every_seconds() -> int:
    """How often beat seals every changed stream's head to the witness: the tail window a database administrator
    can delete undetected is about this long (``benchmarks/audit.py`` measures it)."""
    return max(1, int(getattr(settings, "GPUPOOL_AUDIT_CHECKPOINT_SECONDS", 1)))


def witness_slack_seconds() -> int:
    """How far past the checkpoint interval the witness may lag before ``audit_verify`` fails: records older
    than interval + slack that no witnessed checkpoint covers mean the sealing stopped (or the tail was cut)."""
    return max(0, int(getattr(settings, "GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS", 25)))


def witness_window_seconds() -> int:
    """The age beyond which every record must be covered by a witnessed checkpoint."""
    return checkpoint_every_seconds() + witness_slack_seconds()


def retention_days() -> int:
    days = int(getattr(settings, "GPUPOOL_AUDIT_RETENTION_DAYS", 365))
    if days < MIN_RETENTION_DAYS:
        raise ImproperlyConfigured(
            f"GPUPOOL_AUDIT_RETENTION_DAYS={days} is below the legal minimum of {MIN_RETENTION_DAYS} days "
            "(网络安全法 Art. 21); set 180 or more (365 is the default)."
        )
    return days


def alert_hook_path() -> str:
    return getattr(settings, "GPUPOOL_AUDIT_ALERT_HOOK", "") or ""


def siem_url() -> str:
    return getattr(settings, "GPUPOOL_AUDIT_SIEM_URL", "") or ""


def trust_forwarded_for() -> bool:
    return bool(getattr(settings, "GPUPOOL_AUDIT_TRUST_FORWARDED_FOR", False))
