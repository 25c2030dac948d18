"""The witness file: signed checkpoints and tombstones appended to a file outside the database.

A database administrator can rewrite every table, but cannot produce signatures, and cannot reach this file
(give it to the auditor: another host, an object store with retention lock, or an append-only mount). Without it
a full rewrite or a tail truncation cannot be told from the real thing. Each line is one JSON object with
``type`` (``checkpoint`` or ``tombstone``), the signed fields, the signer's public key and ``db`` (which
database's chain it witnesses, so test and development databases sharing a file do not mix).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from typing import Any

from django.db import connection

from audit import conf

logger = logging.getLogger(__name__)


def database_identity() -> str:
    settings_dict = connection.settings_dict
    return f"{settings_dict.get('ENGINE', '')}:{settings_dict.get('HOST', '') or ''}:{settings_dict.get('NAME', '')}"


def append(entry: dict[str, Any]) -> None:
    """Append one line (see ``append_many``)."""
    append_many([entry])


def append_many(batch: list[dict[str, Any]]) -> None:
    """Append one line per entry in one ``write`` under an exclusive lock, fsynced once."""
    if not batch:
        return
    path = conf.witness_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    me = database_identity()
    body = "".join(json.dumps({**entry, "db": me}, sort_keys=True, separators=(",", ":")) + "\n" for entry in batch)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, body.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def entries() -> list[dict[str, Any]]:
    """This database's witness entries, oldest first (unreadable lines are returned as ``type: corrupt``)."""
    path = conf.witness_path()
    if not path.exists():
        return []
    me = database_identity()
    found: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                found.append({"type": "corrupt", "line": number})
                continue
            if entry.get("db") == me:
                found.append(entry)
    return found
