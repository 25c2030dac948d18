"""Who may see which part of the console.

The console shows each person only what their role may use (separation of duties: an auditor sees the audit
trail and nothing else; members see their own tenants). Views check the same rules the navigation uses, so a
hidden link is never the only protection: a forbidden page answers 404, like a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.http import Http404
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext_lazy as _

from tenants.models import Membership, MembershipRole, PlatformRole, User


class Section:
    OVERVIEW = "overview"
    NODES = "nodes"
    TENANTS = "tenants"
    JOBS = "jobs"
    REPORTS = "reports"
    APPROVALS = "approvals"
    AUDIT = "audit"
    WHATIF = "whatif"
    USERS = "users"
    LOCKOUTS = "lockouts"
    ACCOUNT = "account"


@dataclass(frozen=True)
class NavItem:
    section: str
    label: Any
    url_name: str
    # Shown by the person's name (their own account), not in the main menu.
    account: bool = False


NAV_ITEMS = [
    NavItem(Section.OVERVIEW, _("Overview"), "frontend:overview"),
    NavItem(Section.NODES, _("Nodes"), "frontend:node-list"),
    NavItem(Section.TENANTS, _("Tenants & quotas"), "frontend:tenant-list"),
    NavItem(Section.APPROVALS, _("Approvals"), "frontend:approval-inbox"),
    NavItem(Section.JOBS, _("Jobs"), "frontend:job-list"),
    NavItem(Section.REPORTS, _("Reports"), "frontend:reports"),
    NavItem(Section.WHATIF, _("What-if"), "frontend:whatif"),
    NavItem(Section.AUDIT, _("Audit"), "frontend:audit"),
    NavItem(Section.USERS, _("Users & roles"), "frontend:user-list"),
    NavItem(Section.LOCKOUTS, _("Sign-in lockouts"), "frontend:lockouts"),
    NavItem(Section.ACCOUNT, _("API tokens"), "frontend:tokens", account=True),
]


def is_system_admin(user: User) -> bool:
    return bool(user.is_authenticated and user.platform_role == PlatformRole.SYSTEM_ADMIN)


def memberships_of(user: User) -> list[Membership]:
    """The user's own memberships, read once per request."""
    if not user.is_authenticated:
        return []
    cache = getattr(user, "_console_memberships", None)
    if cache is None:
        cache = list(Membership.objects.filter(user=user).select_related("tenant"))
        user._console_memberships = cache
    return cache


def is_tenant_admin(user: User) -> bool:
    return any(m.role == MembershipRole.TENANT_ADMIN for m in memberships_of(user))


def visible_tenant_ids(user: User) -> set[int] | None:
    """Ids of the tenants whose work ``user`` sees in the console; None = all (the system admin)."""
    if is_system_admin(user):
        return None
    if not memberships_of(user):
        return set()
    from scheduler.access import visible_tenant_ids as scheduler_visible_tenant_ids

    return set(scheduler_visible_tenant_ids(user).values_list("pk", flat=True))


def sections_for(user: User) -> set[str]:
    """The console sections ``user`` may open. Everyone has their own account page (API tokens)."""
    if not user.is_authenticated:
        return set()
    return _role_sections(user) | {Section.ACCOUNT}


def _role_sections(user: User) -> set[str]:
    if user.platform_role == PlatformRole.AUDITOR:
        return {Section.AUDIT}
    if user.platform_role == PlatformRole.SYSTEM_ADMIN:
        return {
            Section.OVERVIEW,
            Section.NODES,
            Section.TENANTS,
            Section.APPROVALS,
            Section.JOBS,
            Section.REPORTS,
            Section.WHATIF,
        }
    if user.platform_role == PlatformRole.SECURITY_ADMIN:
        # Runs users, roles, two-factor and lockouts; sees the pool's health but no tenant's work.
        return {Section.OVERVIEW, Section.USERS, Section.LOCKOUTS}
    if not memberships_of(user):
        return {Section.OVERVIEW}
    sections = {Section.OVERVIEW, Section.TENANTS, Section.JOBS}
    if is_tenant_admin(user):
        sections |= {Section.APPROVALS, Section.REPORTS}
    return sections


def nav_for(user: User) -> list[NavItem]:
    allowed = sections_for(user)
    return [item for item in NAV_ITEMS if item.section in allowed and _routed(item.url_name)]


def _routed(url_name: str) -> bool:
    try:
        reverse(url_name)
    except NoReverseMatch:
        return False
    return True


def section_required(section: str):
    """View decorator: log in first; a section the user may not use answers 404 (nothing to discover)."""

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if section not in sections_for(request.user):
                raise Http404
            return view(request, *args, **kwargs)

        from django.contrib.auth.decorators import login_required

        return login_required(wrapped)

    return decorator


def system_admin_required(view):
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not is_system_admin(request.user):
            raise Http404
        return view(request, *args, **kwargs)

    from django.contrib.auth.decorators import login_required

    return login_required(wrapped)
