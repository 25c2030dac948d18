"""The audit codes the fleet app records (node agents, their credentials and leases, devices):
``(code, category, description)``, registered from ``FleetConfig.ready()``. Never rename a code (exports and SIEM
rules match on them)."""

from __future__ import annotations

EVENTS: list[tuple[str, str, str]] = [
    ("agent.bootstrap_token.create", "fleet", "A node bootstrap token was made"),
    ("agent.register", "fleet", "A node agent registered"),
    ("agent.credential.revoke", "fleet", "A node credential was revoked"),
    ("node.auth_failed", "fleet", "A node presented a bad credential"),
    ("node.hello", "fleet", "A node agent connected"),
    ("node.ready", "fleet", "A node became ready"),
    ("node.not_ready", "fleet", "A node missed its lease"),
    ("node.jobs_requeued", "fleet", "A lost node's jobs were requeued"),
    ("node.device_claim_refused", "fleet", "A node's hello claimed a device another node owns; refused"),
    ("device.rehome", "fleet", "A system admin moved a device to another node"),
]
