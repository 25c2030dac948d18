"""Who may do what, as predicates and DRF permission classes over the one access policy.

The rules are the table in ``kernel.access_rules``; ``tenants.access`` evaluates it (``allows``, ``restrict``). The
predicates here keep the names services, selectors and views call (``can_admin_tenant(user, tenant)``, ...) and
each asks the table for one action; none restates a rule. Tenant roles are inherited down the tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rest_framework.permissions import SAFE_METHODS, BasePermission

from kernel.access_rules import PLATFORM_ROLES, RULES, TOKEN_SCOPE, Action, Principal
from tenants.access import allows, is_active_account, may, platform_role_of, principals_of, tenant_role, token_allows
from tenants.models import ApiToken, ApprovalStepRole, MembershipRole, PlatformRole, TokenScope
from tenants.tree import ancestors_and_self

if TYPE_CHECKING:
    from tenants.models import Tenant

__all__ = [
    "PolicyPermission",
    "ancestors_and_self",
    "can_admin_strict_ancestor",
    "can_admin_tenant",
    "can_decide_approval",
    "can_manage_job",
    "can_manage_memberships",
    "can_submit_work",
    "can_view_tenant",
    "has_platform_role",
    "holds_approval_role",
    "is_approval_override",
    "is_auditor",
    "is_security_admin",
    "is_system_admin",
    "platform_role_of",
    "policy_action_for",
    "tenant_role",
    "token_scopes_allowed",
]


# Who an account *is* (its platform role); what it may do is asked of the policy below.
def is_system_admin(user: Any) -> bool:
    return platform_role_of(user) == PlatformRole.SYSTEM_ADMIN


def is_security_admin(user: Any) -> bool:
    return platform_role_of(user) == PlatformRole.SECURITY_ADMIN


def is_auditor(user: Any) -> bool:
    return platform_role_of(user) == PlatformRole.AUDITOR


def has_platform_role(user: Any) -> bool:
    return platform_role_of(user) != PlatformRole.NONE


def can_view_tenant(user: Any, tenant: Tenant) -> bool:
    return allows(user, Action.TENANT_VIEW, tenant)


def can_admin_tenant(user: Any, tenant: Tenant) -> bool:
    """System admins, and tenant admins of ``tenant`` or an ancestor."""
    return allows(user, Action.TENANT_CHANGE, tenant)


def can_admin_strict_ancestor(user: Any, tenant: Tenant) -> bool:
    """Tenant admin of a tenant *above* ``tenant`` (needed to move or delete it), or system admin."""
    return allows(user, Action.TENANT_MOVE, tenant)


def can_manage_memberships(user: Any, tenant: Tenant) -> bool:
    """Security admins manage roles everywhere; tenant admins within their subtree."""
    return allows(user, Action.MEMBERSHIP_MANAGE, tenant)


def can_submit_work(user: Any, tenant: Tenant) -> bool:
    """Members and tenant admins may submit jobs; viewers and platform roles may not."""
    return allows(user, Action.JOB_SUBMIT, tenant)


def can_manage_job(user: Any, job: Any) -> bool:
    """The submitter (a member), a tenant admin above the job, or a system admin may cancel or scale a job."""
    return allows(user, Action.JOB_MANAGE, job)


def token_scopes_allowed(user: Any) -> list[str]:
    """The scopes ``user`` may give a new token of their own: a scope is offered when the account's roles
    (beyond its own account and tokens) include an action that needs it. So admin for the platform admins who
    have admin operations, read only for an auditor (whose every action reads), read and write for the rest."""
    held = set(principals_of(user)) - {Principal.ANY_USER}
    needed = {TOKEN_SCOPE[rule.action] for rule in RULES if rule.principal in held}
    scopes = [TokenScope.READ]
    if not held & set(PLATFORM_ROLES) or needed - {TokenScope.READ}:
        scopes.append(TokenScope.WRITE)
    if TokenScope.ADMIN in needed:
        scopes.append(TokenScope.ADMIN)
    return scopes


def policy_action_for(view: Any, request: Any) -> Action | None:
    """The policy action a view answers for this request: ``view.policy_actions`` maps a viewset's action
    name (``list``, ``create``, ``cancel``) or, for a plain view, the lower-case HTTP method to an ``Action``.
    None when the view declares none (the role x endpoint test fails for such an endpoint)."""
    actions = getattr(view, "policy_actions", None)
    if not actions:
        return None
    key = getattr(view, "action", None) or request.method.lower()
    if key not in actions and request.method == "HEAD":
        key = getattr(view, "action", None) or "get"
    found = actions.get(key)
    return Action(found) if found is not None else None


# --- DRF permission classes -------------------------------------------------------------------------------


def _names_hidden_object(request, view) -> bool:
    """Whether the request reads tenant-scoped objects or names one (in its URL, or in its body for the
    actions a view lists in ``policy_body_object``): those are hidden per tenant, so what the caller may not
    read must answer 404 before any rule is applied. Views of such objects set ``policy_hides_objects``."""
    if not getattr(view, "policy_hides_objects", False):
        return False
    key = getattr(view, "action", None) or request.method.lower()
    return (
        request.method in SAFE_METHODS
        or bool(getattr(view, "kwargs", None))
        or key in getattr(view, "policy_body_object", ())
    )


class PolicyPermission(BasePermission):
    """The API's one permission check (in the default permission classes), in the policy's order:

    1. the view names the policy action of each request (``policy_actions``); a Bearer token's scope must
       cover it (403);
    2. tenant-scoped objects (``policy_hides_objects``) the caller may not read are missing: lists are
       narrowed and a named one is a 404 (the selectors' ``restrict``);
    3. otherwise the caller's roles need a rule for the action (403), and on a named object the rule must
       reach it (``has_object_permission`` here, or the service's ``allows`` for objects a view fetches
       itself: 403).

    A view that names no action is read-only."""

    message = "You may not do this."

    def has_permission(self, request, view) -> bool:
        action = policy_action_for(view, request)
        token = request.auth if isinstance(request.auth, ApiToken) else None
        if action is None:
            if getattr(view, request.method.lower(), None) is None:
                return True  # no such method here: DRF answers 405, which tells nothing about any object
            # Fail closed: an endpoint missing from the policy only reads.
            return request.method in SAFE_METHODS
        if not self._token_covers(token, action, request):
            return False
        if _names_hidden_object(request, view):
            return True
        if not may(request.user, action):
            self.message = f"Your role does not allow {action.value!r} (see docs/permissions.md)."
            return False
        return True

    def has_object_permission(self, request, view, obj) -> bool:
        action = policy_action_for(view, request)
        if action is None:
            return request.method in SAFE_METHODS
        if allows(request.user, action, obj):
            return True
        self.message = f"Your role does not allow {action.value!r} on this object (see docs/permissions.md)."
        return False

    def _token_covers(self, token, action: Action, request) -> bool:
        if not token_allows(token, action):
            needed = TOKEN_SCOPE[action].value
            if needed == TokenScope.ADMIN and not has_platform_role(request.user):
                self.message = (
                    "This is a platform operation for system admins; your account has no platform role, so no "
                    "token of yours can do it. Ask a system admin."
                )
            else:
                self.message = (
                    f"This API token has scope {str(token.scope)!r}; this request needs scope {needed!r}. Create "
                    f"a token with scope {needed!r} (POST /api/v1/tokens/) and use it instead."
                )
            return False
        return True


def holds_approval_role(user: Any, role: str, tenant: Tenant) -> bool:
    """Whether ``user`` holds approver ``role`` (an ``ApprovalStepRole``) for a request about ``tenant``."""
    if not is_active_account(user):
        return False
    if role == ApprovalStepRole.SYSTEM_ADMIN:
        return is_system_admin(user)
    if role == ApprovalStepRole.TENANT_ADMIN:
        return tenant_role(user, tenant) == MembershipRole.TENANT_ADMIN
    if role == ApprovalStepRole.PARENT_TENANT_ADMIN:
        return tenant.parent is not None and tenant_role(user, tenant.parent) == MembershipRole.TENANT_ADMIN
    return False


def can_decide_approval(user: Any, approval: Any) -> bool:
    """Whether ``user`` may take the decision ``approval`` is waiting for: whoever holds the awaited step's role,
    and any system admin on any step (an override, which must say why: ``is_approval_override``). Nobody decides
    their own request."""
    role = approval.awaiting_role
    if role is None or not allows(user, Action.APPROVAL_DECIDE, approval) or user.pk == approval.requester_id:
        return False
    return is_system_admin(user) or holds_approval_role(user, role, approval.tenant)


def is_approval_override(user: Any, approval: Any) -> bool:
    """A system admin deciding a step that waits for someone else's role (allowed, with a comment)."""
    role = approval.awaiting_role
    return role is not None and is_system_admin(user) and not holds_approval_role(user, role, approval.tenant)
