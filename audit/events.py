"""The audit event registry: every action code is registered once, by the app that records it, with a stable
code and a description.

Codes are ``<domain>.<verb>``; never rename one (exports and SIEM rules match on them). Each app lists its codes in
its ``audit_events.py`` (``EVENTS``: (code, category, description)) and registers them from its
``AppConfig.ready()`` with ``register_app_events``; the audit app's own codes (``audit.*``, ``alert.*``) are the
``EVENTS`` below. ``audit_record`` refuses a code nobody registered (``UnknownAuditEvent``), so a typo or a new
action without a code fails its first test instead of writing records no search or SIEM rule knows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class AuditEvent:
    code: str
    category: str
    description: str
    app: str  # the label of the app that registered the code (and records it)


class UnknownAuditEvent(LookupError):
    """``audit_record`` was called with a code no app registered: a programming error."""


REGISTRY: dict[str, AuditEvent] = {}


def register(code: str, category: str, description: str, *, app: str) -> AuditEvent:
    """Register ``code`` for ``app`` (idempotent for the same registration; a clash, such as a second app claiming
    the code, is a programming error)."""
    existing = REGISTRY.get(code)
    event = AuditEvent(code, category, description, app)
    if existing is not None and existing != event:
        raise ValueError(f"audit event {code!r} is already registered as {existing}")
    REGISTRY[code] = event
    return event


def register_app_events(app: str, events: Iterable[tuple[str, str, str]]) -> None:
    """Register an app's ``(code, category, description)`` list (its ``audit_events.EVENTS``): from its
    ``AppConfig.ready()``."""
    for code, category, description in events:
        register(code, category, description, app=app)


def lookup(code: str) -> AuditEvent:
    """The registered event; raises ``UnknownAuditEvent`` for a code no app registered."""
    event = REGISTRY.get(code)
    if event is None:
        raise UnknownAuditEvent(
            f"audit action {code!r} is not registered: add it to the EVENTS of the audit_events.py of the app that "
            "records it (registered from that app's AppConfig.ready())"
        )
    return event


def codes_described_by(text: str) -> list[str]:
    """The registered codes whose description contains ``text`` (any case): a search for the words a person
    uses ("cancelled", "signed in") finds the records of those codes, whose details (sealed) no search reads."""
    wanted = text.strip().casefold()
    if not wanted:
        return []
    return sorted(code for code, event in REGISTRY.items() if wanted in event.description.casefold())


# The audit app's own codes: the audit trail itself and the operator's alerts (registered from AuditConfig.ready()).
EVENTS: list[tuple[str, str, str]] = [
    ("audit.search", "audit", "An auditor searched audit records"),
    ("audit.read", "audit", "An auditor read an audit record"),
    ("audit.export", "audit", "Audit records were exported"),
    ("audit.verify", "audit", "The audit trail was verified"),
    ("audit.tamper_detected", "audit", "Verification found tampered audit records"),
    ("audit.access_denied", "audit", "A non-auditor tried to read or change the audit trail"),
    ("audit.write_failed", "audit", "An audit record could not be written"),
    ("audit.key.rotate", "audit", "Data keys were re-wrapped under a new master key"),
    ("audit.key.shred", "audit", "A tenant's data keys were destroyed (crypto-shredding)"),
    ("audit.purge", "audit", "Audit records beyond retention were purged"),
    ("audit.legal_hold.set", "audit", "A legal hold was placed"),
    ("audit.legal_hold.release", "audit", "A legal hold was released"),
    ("audit.signing_key.rotate", "audit", "The checkpoint signing key was rotated (signed by its predecessor)"),
    ("audit.integrity_check", "audit", "The scheduled integrity check found a problem"),
    ("alert.acknowledge", "audit", "An operator acknowledged an alert"),
]


# Records that matter most to an auditor are witnessed as soon as their transaction commits (a checkpoint and the
# witness's cosignature right after the COMMIT), not at the next beat: their tail window is one round trip.
WITNESS_AT_COMMIT = frozenset(
    {
        "user.role.change",
        "membership.role.change",
        "token.create",
        "audit.export",
        "audit.tamper_detected",
        "audit.key.rotate",
        "audit.key.shred",
        "audit.purge",
        "audit.legal_hold.set",
        "audit.legal_hold.release",
        "audit.signing_key.rotate",
        "audit.integrity_check",
    }
)
