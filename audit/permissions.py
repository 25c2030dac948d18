"""Only those the access policy lets read the audit trail (the auditors) do; every refused attempt is itself
audited."""

from __future__ import annotations

from rest_framework.permissions import BasePermission

from audit.selectors import may_read_trail
from audit.services import audit_record


class AuditTrailPermission(BasePermission):
    """Records a refused attempt on the trail; runs before the default ``PolicyPermission`` (which checks the
    same rule and the token's scope) so that the refusal leaves a trace."""

    message = "Only auditors can read or export the audit trail."

    def has_permission(self, request, view) -> bool:
        action = view.policy_actions[request.method.lower() if request.method != "HEAD" else "get"]
        if may_read_trail(request.user, action):
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
