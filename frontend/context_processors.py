"""Template context every console page gets."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from audit.integrity import latest_failure

# Who is shown the audit integrity banner: the platform roles that answer for the trail.
_AUDIT_BANNER_ROLES = {"auditor", "system_admin", "security_admin"}


def audit_integrity(request: HttpRequest) -> dict[str, Any]:
    """``audit_integrity_failure``: the latest scheduled integrity check's failure, for auditors and administrators
    (one indexed query), until a run finds nothing."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or getattr(user, "platform_role", "") not in _AUDIT_BANNER_ROLES:
        return {}
    return {"audit_integrity_failure": latest_failure()}
