"""Who may do what: platform roles (separation of duties), tenant roles, and API token scopes.

Plain predicates (``is_auditor(user)``, ``can_admin_tenant(user, tenant)``) serve services, the console and
other apps alike; the DRF permission classes below wrap them for views. Tenant roles are inherited down the
tree: a role held on a tenant applies to its whole subtree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rest_framework.permissions import SAFE_METHODS, BasePermission

from tenants.models import ApiToken, Membership, MembershipRole, PlatformRole, TokenScope

if TYPE_CHECKING:
    from tenants.models import Tenant

# Higher number = more rights; used to pick the strongest inherited role.
_ROLE_RANK = {MembershipRole.VIEWER: 1, MembershipRole.MEMBER: 2, MembershipRole.TENANT_ADMIN: 3}


def _authenticated(user: Any) -> bool:
    return bool(user is not None and getattr(user, "is_authenticated", False) and user.is_active)


def platform_role_of(user: Any) -> str:
    return user.platform_role if _authenticated(user) else PlatformRole.NONE


def is_system_admin(user: Any) -> bool:
    return platform_role_of(user) == PlatformRole.SYSTEM_ADMIN


def is_security_admin(user: Any) -> bool:
    return platform_role_of(user) == PlatformRole.SECURITY_ADMIN


def is_auditor(user: Any) -> bool:
    return platform_role_of(user) == PlatformRole.AUDITOR


def has_platform_role(user: Any) -> bool:
    return platform_role_of(user) != PlatformRole.NONE


def sees_all_tenants(user: Any) -> bool:
    """Every platform role reads the whole tenant tree; only the system admin may change it."""
    return has_platform_role(user)


def ancestors_and_self(tenant: Tenant) -> list[Tenant]:
    """``tenant`` and its ancestors, nearest first (at most MAX_TENANT_DEPTH rows)."""
    chain = []
    node: Tenant | None = tenant
    while node is not None:
        chain.append(node)
        node = node.parent
    return chain


def tenant_role(user: Any, tenant: Tenant) -> str | None:
    """The strongest membership role ``user`` holds on ``tenant`` or any ancestor, or None."""
    if not _authenticated(user):
        return None
    ids = [node.pk for node in ancestors_and_self(tenant)]
    roles = Membership.objects.filter(user=user, tenant_id__in=ids).values_list("role", flat=True)
    best = None
    for role in roles:
        if best is None or _ROLE_RANK[role] > _ROLE_RANK[best]:
            best = role
    return best


def can_view_tenant(user: Any, tenant: Tenant) -> bool:
    return sees_all_tenants(user) or tenant_role(user, tenant) is not None


def can_admin_tenant(user: Any, tenant: Tenant) -> bool:
    """System admins, and tenant admins of ``tenant`` or an ancestor."""
    return is_system_admin(user) or tenant_role(user, tenant) == MembershipRole.TENANT_ADMIN


def can_admin_strict_ancestor(user: Any, tenant: Tenant) -> bool:
    """Tenant admin of a tenant *above* ``tenant`` (needed to move or delete it), or system admin."""
    if is_system_admin(user):
        return True
    return tenant.parent is not None and tenant_role(user, tenant.parent) == MembershipRole.TENANT_ADMIN


def can_manage_memberships(user: Any, tenant: Tenant) -> bool:
    """Security admins manage roles everywhere; tenant admins within their subtree."""
    return is_security_admin(user) or tenant_role(user, tenant) == MembershipRole.TENANT_ADMIN


def can_submit_work(user: Any, tenant: Tenant) -> bool:
    """Members and tenant admins may submit jobs; viewers and platform roles may not."""
    return tenant_role(user, tenant) in (MembershipRole.MEMBER, MembershipRole.TENANT_ADMIN)


def token_scopes_allowed(user: Any) -> list[str]:
    """The scopes ``user`` may give a new token of their own: admin for system and security admins, read only
    for auditors, read and write for everybody else."""
    if is_auditor(user):
        return [TokenScope.READ]
    if is_system_admin(user) or is_security_admin(user):
        return [TokenScope.READ, TokenScope.WRITE, TokenScope.ADMIN]
    return [TokenScope.READ, TokenScope.WRITE]


def token_scope_allows(token: ApiToken, *, method: str, required_scope: str | None = None) -> bool:
    """Every scope reads; ``write`` also changes things except admin operations; ``admin`` does all."""
    if method in SAFE_METHODS or token.scope == TokenScope.ADMIN:
        return True
    if required_scope == TokenScope.ADMIN:
        return False
    return token.scope == TokenScope.WRITE


# --- DRF permission classes -------------------------------------------------------------------------------


class TokenScopePermission(BasePermission):
    """Enforces the scope of a Bearer token (sessions are unaffected). In the default permission classes, so
    every app's views get it; a view sets ``required_scope = "admin"`` for platform operations."""

    message = "This API token's scope does not allow this request."

    def has_permission(self, request, view) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            return True
        required = getattr(view, "required_scope", None)
        if token_scope_allows(token, method=request.method, required_scope=required):
            return True
        # Say what would fix it: a wider token only helps someone whose role allows the operation.
        if required == TokenScope.ADMIN and not has_platform_role(request.user):
            self.message = (
                "This is a platform operation for system admins; your account has no platform role, so no token "
                "of yours can do it. Ask a system admin."
            )
        else:
            needed = str(TokenScope.ADMIN.value if required == TokenScope.ADMIN else TokenScope.WRITE.value)
            self.message = (
                f"This API token has scope {str(token.scope)!r}; this request needs scope {needed!r}. Create a token "
                f"with scope {needed!r} (POST /api/v1/tokens/) and use it instead."
            )
        return False


class IsSystemAdmin(BasePermission):
    message = "Only a system admin may do this."

    def has_permission(self, request, view) -> bool:
        return is_system_admin(request.user)


class IsSecurityAdmin(BasePermission):
    message = "Only a security admin may do this."

    def has_permission(self, request, view) -> bool:
        return is_security_admin(request.user)


class IsAuditor(BasePermission):
    """Auditors only — the audit trail is closed to system and security admins (separation of duties)."""

    message = "Only an auditor may read the audit trail."

    def has_permission(self, request, view) -> bool:
        return is_auditor(request.user)


class ReadOnlyForAuditor(BasePermission):
    """Auditors read; they change nothing."""

    message = "Auditors have read-only access."

    def has_permission(self, request, view) -> bool:
        return request.method in SAFE_METHODS or not is_auditor(request.user)


class IsTenantAdminOf(BasePermission):
    """Object permission: the caller administers the object's tenant (``obj.tenant`` or the tenant itself)."""

    message = "Only a tenant admin of this tenant (or a parent tenant) may do this."

    def has_object_permission(self, request, view, obj) -> bool:
        tenant = getattr(obj, "tenant", obj)
        return request.method in SAFE_METHODS or can_admin_tenant(request.user, tenant)


def holds_approval_role(user: Any, role: str, tenant: Tenant) -> bool:
    """Whether ``user`` holds approver ``role`` (an ``ApprovalStepRole``) for a request about ``tenant``."""
    from tenants.models import ApprovalStepRole

    if not _authenticated(user):
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
    if role is None or not _authenticated(user) or user.pk == approval.requester_id:
        return False
    return is_system_admin(user) or holds_approval_role(user, role, approval.tenant)


def is_approval_override(user: Any, approval: Any) -> bool:
    """A system admin deciding a step that waits for someone else's role (allowed, with a comment)."""
    role = approval.awaiting_role
    return role is not None and is_system_admin(user) and not holds_approval_role(user, role, approval.tenant)
