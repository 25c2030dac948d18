"""Forwarding audit records to a SIEM as syslog (RFC 5424) or CEF, over UDP or TCP.

``GPUPOOL_AUDIT_SIEM_URL=udp://siem.internal:514?format=rfc5424`` (or ``tcp://…``, ``format=cef``). Records
are sent after their transaction commits, best effort: the database chain is the record of truth, and a SIEM
outage must not fail requests. Details stay sealed (they are never forwarded); header fields are.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.db import transaction

from audit import conf

logger = logging.getLogger(__name__)

FACILITY_AUTHPRIV = 10  # security/authorization messages
SEVERITY = {"success": 6, "failure": 4, "denied": 4, "error": 3}  # informational, warning, warning, error
CEF_SEVERITY = {"success": 3, "failure": 6, "denied": 7, "error": 8}
APP_NAME = "gpupool"
ENTERPRISE_ID = 32473  # the IANA example enterprise number; deployments may set their own


def _fields(record: Any) -> dict[str, Any]:
    created = record.created_at
    return {
        "time": created.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "stream": record.stream,
        "seq": record.seq,
        "event_id": record.event_id,
        "actor_id": record.actor_id,
        "actor": record.actor_username,
        "actor_role": record.actor_role,
        "ip": record.actor_ip or "",
        "tenant_id": record.tenant_id,
        "action": record.action,
        "target": record.target,
        "outcome": record.outcome,
        "request_id": record.request_id,
        "hash": record.hash,
    }


def _sd_escape(value: Any) -> str:
    return str("" if value is None else value).replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def format_rfc5424(record: Any, *, hostname: str | None = None) -> str:
    """One RFC 5424 message: ``<PRI>1 TIMESTAMP HOST APP PROCID MSGID [SD] MSG``."""
    fields = _fields(record)
    pri = FACILITY_AUTHPRIV * 8 + SEVERITY.get(record.outcome, 5)
    host = (hostname or socket.gethostname() or "-")[:255]
    msgid = record.action[:32] or "-"
    params = " ".join(f'{key}="{_sd_escape(value)}"' for key, value in fields.items() if key != "time")
    sd = f"[audit@{ENTERPRISE_ID} {params}]"
    message = f"{fields['actor'] or 'system'} {record.action} {record.target} {record.outcome}"
    return f"<{pri}>1 {fields['time']} {host} {APP_NAME} - {msgid} {sd} {message}"


def _cef_header(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("|", "\\|")


def _cef_ext(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("=", "\\=").replace("\n", "\\n").replace("\r", "\\r")


def format_cef(record: Any) -> str:
    """One ArcSight CEF:0 event."""
    fields = _fields(record)
    created_ms = int(record.created_at.timestamp() * 1000)
    extension = {
        "rt": created_ms,
        "suser": fields["actor"],
        "suid": fields["actor_id"],
        "spriv": fields["actor_role"],
        "src": fields["ip"],
        "outcome": fields["outcome"],
        "act": fields["action"],
        "duser": fields["target"],
        "externalId": fields["event_id"],
        "cs1Label": "tenant",
        "cs1": fields["tenant_id"],
        "cs2Label": "stream",
        "cs2": f"{fields['stream']}#{fields['seq']}",
        "cs3Label": "requestId",
        "cs3": fields["request_id"],
        "cs4Label": "hash",
        "cs4": fields["hash"],
    }
    ext = " ".join(f"{key}={_cef_ext(value)}" for key, value in extension.items() if value not in (None, ""))
    header = "|".join(
        _cef_header(part)
        for part in (
            "CEF:0",
            "gpupool",
            "gpupool",
            "1",
            record.action,
            record.action,
            CEF_SEVERITY.get(record.outcome, 5),
        )
    )
    return f"{header}|{ext}"


class SyslogForwarder:
    """Send formatted records to ``udp://host:port`` or ``tcp://host:port`` (TCP uses octet counting,
    RFC 6587)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("udp", "tcp") or not parts.hostname:
            raise ValueError(f"GPUPOOL_AUDIT_SIEM_URL={url!r}: use udp://host:port or tcp://host:port")
        self.protocol = parts.scheme
        self.address = (parts.hostname, parts.port or 514)
        self.format = parse_qs(parts.query).get("format", ["rfc5424"])[0]
        if self.format not in ("rfc5424", "cef"):
            raise ValueError(f"GPUPOOL_AUDIT_SIEM_URL format {self.format!r}: use rfc5424 or cef")

    def render(self, record: Any) -> bytes:
        if self.format == "cef":
            return format_cef(record).encode("utf-8")
        return format_rfc5424(record).encode("utf-8")

    def send(self, records: Iterable[Any]) -> None:
        messages = [self.render(r) for r in records]
        if self.protocol == "udp":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                for message in messages:
                    sock.sendto(message, self.address)
            return
        with socket.create_connection(self.address, timeout=5) as sock:
            sock.sendall(b"".join(str(len(m)).encode() + b" " + m for m in messages))


def forward(records: Iterable[Any]) -> None:
    url = conf.siem_url()
    if not url:
        return
    try:
        SyslogForwarder(url).send(records)
    except (OSError, ValueError) as exc:
        logger.error("could not forward audit records to the SIEM at %s: %s", url, exc)


def forward_on_commit(records: list[Any], *, after_commit: Any = None) -> None:
    """Forward ``records`` once their transaction has committed (``after_commit`` schedules it; by default
    ``transaction.on_commit``)."""
    (after_commit or transaction.on_commit)(lambda: forward(records))
