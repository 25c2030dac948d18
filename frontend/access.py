"""Who may see which part of the console.

The console shows each person only what their role may use. It states no role rule of its own: each section
opens for those the access policy (``kernel.access_rules``, evaluated by ``tenants.access``) gives its action, so an
auditor reads what the API lets them read and changes nothing. Views check the same rules the navigation
uses, so a hidden link is never the only protection: a forbidden page answers 404, like a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext_lazy as _

from kernel.access_rules import Action
from tenants.access import may, principals_of, reaches_all, restrict
from tenants.models import Tenant, User


class Section:
    OVERVIEW = "overview"
    NODES = "nodes"
    TENANTS = "tenants"
    JOBS = "jobs"
    REPORTS = "reports"
    APPROVALS = "approvals"
    AUDIT = "audit"
    ALERTS = "alerts"
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
    NavItem(Section.ALERTS, _("Alerts"), "frontend:alerts"),
    NavItem(Section.USERS, _("Users & roles"), "frontend:user-list"),
    NavItem(Section.LOCKOUTS, _("Sign-in lockouts"), "frontend:lockouts"),
    NavItem(Section.ACCOUNT, _("API tokens"), "frontend:tokens", account=True),
]


#: The policy action that opens each console section: the console asks the same table as the API, so a
#: section is offered to exactly the roles that may take its action somewhere.
SECTION_ACTIONS: dict[str, Action] = {
    Section.OVERVIEW: Action.OVERVIEW_VIEW,
    Section.NODES: Action.FLEET_VIEW,
    Section.TENANTS: Action.QUOTA_VIEW,
    Section.JOBS: Action.JOB_VIEW,
    Section.REPORTS: Action.USAGE_VIEW,
    Section.APPROVALS: Action.APPROVAL_DECIDE,
    Section.AUDIT: Action.AUDIT_VIEW,
    Section.ALERTS: Action.ALERT_VIEW,
    Section.WHATIF: Action.WHATIF_RUN,
    Section.USERS: Action.USER_MANAGE,
    Section.LOCKOUTS: Action.LOCKOUT_VIEW,
    Section.ACCOUNT: Action.TOKEN_CREATE,
}


def visible_tenant_ids(user: User, action: Action = Action.JOB_VIEW) -> set[int] | None:
    """Ids of the tenants where ``user`` may take ``action`` (by default: whose work they see); None = all."""
    if reaches_all(user, action):
        return None
    return set(restrict(Tenant.objects.all(), user, action).values_list("pk", flat=True))


def sections_for(user: User) -> set[str]:
    """The console sections ``user`` may open, read once per request."""
    if not user.is_authenticated:
        return set()
    cached = getattr(user, "_console_sections", None)
    if cached is None:
        held = principals_of(user)
        cached = {section for section, action in SECTION_ACTIONS.items() if may(user, action, principals=held)}
        user._console_sections = cached
    return cached


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

        wrapped.policy_section_action = SECTION_ACTIONS[section]
        if not hasattr(wrapped, "policy_action"):
            wrapped.policy_action = SECTION_ACTIONS[section]
        return login_required(wrapped)

    return decorator


def action_required(action: Action):
    """View decorator for a console page that takes one policy action: log in first; a user whose roles have
    no rule for ``action`` gets a 404 (the object-level rule is the service's)."""

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not may(request.user, action):
                raise Http404
            return view(request, *args, **kwargs)

        wrapped.policy_action = action
        return login_required(wrapped)

    return decorator


def declares_action(action: Action):
    """Marks a console view that checks ``action`` itself, on the objects it offers (the submit page lists the
    tenants ``restrict(…, job.submit)`` leaves and explains a refusal with a 403 instead of hiding)."""

    def decorator(view):
        view.policy_action = action
        return view

    return decorator


def policy_action_of(view: Any) -> Action | None:
    """The policy action a console view answers for: its own (``action_required``, ``declares_action``), else
    its section's (``section_required``)."""
    return getattr(view, "policy_action", None)
