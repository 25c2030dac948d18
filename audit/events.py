"""The audit event registry: every action code is registered once here, with a stable code and a description.

Codes are ``<domain>.<verb>``; never rename one (exports and SIEM rules match on them). ``audit_record``
accepts codes that are not registered yet — other apps add actions as they grow — and logs a warning once
per unknown code so it gets registered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditEvent:
    code: str
    category: str
    description: str


REGISTRY: dict[str, AuditEvent] = {}
_unknown_warned: set[str] = set()


def register(code: str, category: str, description: str) -> AuditEvent:
    """Register ``code`` (idempotent for the same description; a clash is a programming error)."""
    existing = REGISTRY.get(code)
    event = AuditEvent(code, category, description)
    if existing is not None and existing != event:
        raise ValueError(f"audit event {code!r} is already registered as {existing}")
    REGISTRY[code] = event
    return event


def lookup(code: str) -> AuditEvent | None:
    """The registered event, or None (warning once per unknown code, never raising)."""
    event = REGISTRY.get(code)
    if event is None and code not in _unknown_warned:
        _unknown_warned.add(code)
        logger.warning("audit action %r is not registered in audit.events; recording it anyway", code)
    return event


def codes_described_by(text: str) -> list[str]:
    """The registered codes whose description contains ``text`` (any case): a search for the words a person
    uses ("cancelled", "signed in") finds the records of those codes, whose details (sealed) no search reads."""
    wanted = text.strip().casefold()
    if not wanted:
        return []
    return sorted(code for code, event in REGISTRY.items() if wanted in event.description.casefold())


_EVENTS = [
    # Authentication
    ("auth.login", "auth", "A user signed in"),
    ("auth.login.failure", "auth", "A sign-in attempt failed"),
    ("auth.logout", "auth", "A user signed out"),
    ("auth.lockout", "auth", "An account was locked after repeated failures"),
    ("auth.lockout.reset", "auth", "A security admin lifted a sign-in lockout"),
    ("auth.mfa.enrol.begin", "auth", "A user began enrolling a second factor"),
    ("auth.mfa.enrol.confirm", "auth", "A user confirmed a second factor"),
    ("auth.mfa.verify", "auth", "A second factor was checked at sign-in"),
    ("auth.mfa.reset", "auth", "A user's second factor was reset"),
    # Users, roles, tokens, memberships
    ("user.create", "identity", "A user was created"),
    ("user.update", "identity", "A user was changed"),
    ("user.deactivate", "identity", "A user was deactivated"),
    ("user.password.set", "identity", "A password was set"),
    ("user.role.change", "identity", "A platform role was granted or removed"),
    ("token.create", "identity", "An API token was created"),
    ("token.revoke", "identity", "An API token was revoked"),
    ("membership.create", "identity", "A user joined a tenant"),
    ("membership.role.change", "identity", "A tenant role changed"),
    ("membership.delete", "identity", "A user left a tenant"),
    # Tenants, quotas, approvals
    ("tenant.create", "tenancy", "A tenant was created"),
    ("tenant.update", "tenancy", "A tenant was changed"),
    ("tenant.move", "tenancy", "A tenant moved in the tree"),
    ("tenant.delete", "tenancy", "A tenant was deleted"),
    ("quota.create", "tenancy", "A quota was set"),
    ("quota.update", "tenancy", "A quota was changed"),
    ("quota.delete", "tenancy", "A quota was removed"),
    ("quota_request.create", "approval", "A quota change was requested"),
    ("quota_request.approve", "approval", "A quota change request was approved"),
    ("quota_request.reject", "approval", "A quota change request was rejected"),
    ("approval.request", "approval", "An approval was requested"),
    ("approval.approve", "approval", "An approval was granted"),
    ("approval.reject", "approval", "An approval was refused"),
    # Workloads
    ("job.submit", "workload", "A job was submitted"),
    ("job.approve", "workload", "A job waiting for approval was approved"),
    ("job.reject", "workload", "A job waiting for approval was rejected"),
    ("job.cancel", "workload", "A job was cancelled"),
    ("job.preempt", "workload", "A job was preempted (asked to stop and give its cards back, or its node drains)"),
    # Until cancellations and preemptions had codes of their own, they too were recorded as job.transition.
    ("job.transition", "workload", "A job changed state"),
    ("job.output_stored", "workload", "A node agent stored the output a job's replica left"),
    ("job.array.submit", "workload", "A job array was submitted (one record for its N jobs)"),
    ("job.array.cancel", "workload", "The jobs of a job array were cancelled"),
    # Fleet
    ("agent.bootstrap_token.create", "fleet", "A node bootstrap token was made"),
    ("agent.register", "fleet", "A node agent registered"),
    ("agent.credential.revoke", "fleet", "A node credential was revoked"),
    ("node.auth_failed", "fleet", "A node presented a bad credential"),
    ("node.hello", "fleet", "A node agent connected"),
    ("node.ready", "fleet", "A node became ready"),
    ("node.not_ready", "fleet", "A node missed its lease"),
    ("node.jobs_requeued", "fleet", "A lost node's jobs were requeued"),
    ("node.cordon", "fleet", "A node was cordoned"),
    ("node.uncordon", "fleet", "A node was uncordoned"),
    ("node.drain", "fleet", "A node was drained"),
    ("node.device_claim_refused", "fleet", "A node's hello claimed a device another node owns; refused"),
    ("device.rehome", "fleet", "A system admin moved a device to another node"),
    ("flavor.create", "fleet", "A resource flavor was created"),
    ("flavor.update", "fleet", "A resource flavor was changed"),
    # The audit trail itself
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
for _code, _category, _description in _EVENTS:
    register(_code, _category, _description)


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
