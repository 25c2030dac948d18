"""Only auditors read the audit trail; every refused attempt is itself audited."""

from __future__ import annotations

from rest_framework.permissions import BasePermission

from audit.selectors import is_auditor
from audit.services import audit_record


class IsAuditor(BasePermission):
    message = "Only auditors can read or export the audit trail."

    def has_permission(self, request, view) -> bool:
        if is_auditor(request.user):
            return True
        if request.user is not None and request.user.is_authenticated:
            # An assessor probing with a non-auditor account must leave a trace (DESIGN §12).
            audit_record(
                action="audit.access_denied",
                actor=request.user,
                target=request.path[:200],
                outcome="denied",
                details={"method": request.method},
                request=request,
            )
        return False
