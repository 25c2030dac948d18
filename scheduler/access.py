"""Who may see and act on scheduler objects. Thin wrappers over ``tenants.permissions`` / ``tenants.selectors``.

They are imported lazily so this app works on its own; the fallbacks (direct Membership checks) apply only
while the tenants app does not provide the helpers.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet


def _authenticated(user: Any) -> bool:
    return bool(user is not None and getattr(user, "is_authenticated", False) and user.is_active)


def is_system_admin(user: Any) -> bool:
    try:
        from tenants.permissions import is_system_admin as check
    except ImportError:  # pragma: no cover - tenants without permission helpers
        return _authenticated(user) and getattr(user, "platform_role", "") == "system_admin"
    return check(user)


def sees_all_tenants(user: Any) -> bool:
    try:
        from tenants.permissions import sees_all_tenants as check
    except ImportError:  # pragma: no cover
        return _authenticated(user) and bool(getattr(user, "platform_role", ""))
    return check(user)


def visible_tenant_ids(user: Any) -> QuerySet:
    """A ``values("pk")`` queryset of the tenants ``user`` may see (their subtrees; all for platform roles)."""
    try:
        from tenants.selectors import tenant_ids_visible_to
    except ImportError:  # pragma: no cover
        from tenants.models import Membership, Tenant

        if not _authenticated(user):
            return Tenant.objects.none().values("pk")
        if sees_all_tenants(user):
            return Tenant.objects.values("pk")
        roots = list(Membership.objects.filter(user=user).values_list("tenant_id", flat=True))
        return Tenant.objects.filter(pk__in=roots).values("pk")
    return tenant_ids_visible_to(user)


def tenant_role(user: Any, tenant: Any) -> str | None:
    try:
        from tenants.permissions import tenant_role as role_of
    except ImportError:  # pragma: no cover
        from tenants.models import Membership

        if not _authenticated(user):
            return None
        chain = []
        node = tenant
        while node is not None:
            chain.append(node.pk)
            node = node.parent
        roles = set(Membership.objects.filter(user=user, tenant_id__in=chain).values_list("role", flat=True))
        for role in ("tenant_admin", "member", "viewer"):
            if role in roles:
                return role
        return None
    return role_of(user, tenant)


def can_submit_work(user: Any, tenant: Any) -> bool:
    """Members and tenant admins (of the tenant or an ancestor) may submit; viewers and platform roles may not."""
    return tenant_role(user, tenant) in ("member", "tenant_admin")


def can_manage_job(user: Any, job: Any) -> bool:
    """The submitter, a tenant admin above the job, or a system admin may cancel a job."""
    if not _authenticated(user):
        return False
    if is_system_admin(user):
        return True
    role = tenant_role(user, job.tenant)
    if role == "tenant_admin":
        return True
    return role == "member" and job.submitter_id == user.pk
