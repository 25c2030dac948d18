"""Who may see and act on scheduler objects. The rules about roles and tenants are ``tenants.permissions``
and ``tenants.selectors`` (the one place that states them); this module only adds the job-specific rule of who
may manage a job, in those terms."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from tenants.models import MembershipRole
from tenants.permissions import can_submit_work, is_system_admin, sees_all_tenants, tenant_role
from tenants.selectors import tenant_ids_visible_to

__all__ = ["can_manage_job", "can_submit_work", "is_system_admin", "sees_all_tenants", "visible_tenant_ids"]


def visible_tenant_ids(user: Any) -> QuerySet:
    """A ``values("pk")`` queryset of the tenants ``user`` may see (their subtrees; all for platform roles)."""
    return tenant_ids_visible_to(user)


def can_manage_job(user: Any, job: Any) -> bool:
    """The submitter (a member), a tenant admin above the job, or a system admin may cancel or scale a job."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    if is_system_admin(user):
        return True
    role = tenant_role(user, job.tenant)
    if role == MembershipRole.TENANT_ADMIN:
        return True
    return role == MembershipRole.MEMBER and job.submitter_id == user.pk
