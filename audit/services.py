"""The one entry point that records an audit event. Call it inside the service's transaction, so the change
and its record commit together (or neither does)."""

from __future__ import annotations

from typing import Any

from audit.models import AuditRecord


def audit_record(
    *,
    action: str,
    actor: Any | None,
    tenant: Any | None = None,
    target: str = "",
    outcome: str = "success",
    details: dict | None = None,
    request: Any | None = None,
) -> AuditRecord:
    """Record that ``actor`` did ``action`` on ``target`` (within ``tenant``) with ``outcome``.

    ``details`` holds before/after values; ``request`` (a Django/DRF request) supplies IP, user agent and
    request id. ``actor`` None means the system itself.
    """
    actor_ip = None
    request_id = ""
    if request is not None:
        meta = getattr(request, "META", {})
        actor_ip = meta.get("REMOTE_ADDR") or None
        request_id = meta.get("HTTP_X_REQUEST_ID", "")[:64]
    return AuditRecord.objects.create(
        actor_id=getattr(actor, "pk", None),
        actor_username=getattr(actor, "username", "") or "",
        actor_ip=actor_ip,
        tenant_id=getattr(tenant, "pk", None),
        action=action,
        target=target,
        outcome=outcome,
        request_id=request_id,
        details=details or {},
    )
