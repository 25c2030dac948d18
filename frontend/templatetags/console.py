"""Template helpers for the console: navigation by role, units in words, query strings that keep filters."""

from __future__ import annotations

import shlex

from django import template
from django.utils.translation import gettext as _

from frontend.access import nav_for
from frontend.audit_details import role_words
from frontend.datetimes import format_moment, moment_format
from frontend.service_text import localize as localize_service_text
from scheduler.message_text import localize as localize_scheduler_text
from tenants.models import ApprovalStepRole

register = template.Library()


@register.simple_tag(takes_context=True)
def console_nav(context) -> list:
    request = context.get("request")
    if request is None or not request.user.is_authenticated:
        return []
    return nav_for(request.user)


@register.filter
def cards(millis: int | None) -> str:
    """1500 milli-devices → "1.5"; the console speaks in cards, the API in millis."""
    if millis is None:
        return "—"
    value = millis / 1000
    return f"{value:.1f}".rstrip("0").rstrip(".") if value % 1 else f"{int(value)}"


@register.filter
def gib(mib: int | None) -> str:
    if mib is None:
        return "—"
    return f"{mib / 1024:.1f}"


@register.filter
def percent_of(part: float | None, whole: float | None) -> float:
    """Share of ``whole`` in percent, clamped to 0 to 100 for bar widths."""
    if not part or not whole:
        return 0.0
    return max(0.0, min(100.0, 100.0 * float(part) / float(whole)))


@register.simple_tag(takes_context=True)
def query_with(context, **kwargs) -> str:
    """The current query string with some parameters replaced (filters survive sorting and export)."""
    params = context["request"].GET.copy()
    for key, value in kwargs.items():
        if value is None or value == "":
            params.pop(key, None)
        else:
            params[key] = value
    encoded = params.urlencode()
    return f"?{encoded}" if encoded else ""


@register.filter
def shell_command(argv: list | str | None) -> str:
    """A job's command (an argv list) as a shell would take it back: ``python3 -c 'print(1)'``, quotes kept."""
    if not argv:
        return ""
    if isinstance(argv, str):
        return argv
    return shlex.join(str(word) for word in argv)


@register.filter
def yesno_words(value: bool) -> str:
    return _("yes") if value else _("no")


@register.inclusion_tag("frontend/partials/qbar.html")
def qbar(*, scale: int, used: int = 0, guaranteed: int | None = None, borrowed: int = 0, label: str = "") -> dict:
    """A bar drawn as SVG (no inline styles, so a strict CSP holds): track = ``scale``, a marker at the
    guarantee, green = used within it, orange = borrowed above it."""
    scale = int(scale or 0)
    if scale <= 0:
        # Nothing schedulable (every card cordoned): an empty track, not a full bar for 0.3 of 0.
        return {"label": label, "used_pct": 0.0, "borrowed_start_pct": 0.0, "borrowed_pct": 0.0, "guaranteed_pct": None}
    used = int(used or 0)
    borrowed = int(borrowed or 0)
    in_quota = max(0, used - borrowed)
    return {
        "label": label,
        "used_pct": percent_of(in_quota, scale),
        "borrowed_start_pct": percent_of(in_quota, scale),
        "borrowed_pct": percent_of(borrowed, scale),
        "guaranteed_pct": None if guaranteed is None else percent_of(guaranteed, scale),
    }


@register.filter
def approver_role(value: str | None) -> str:
    """``parent_tenant_admin`` → "tenant admin of the parent tenant" (the approval chain in words)."""
    if not value:
        return "—"
    try:
        return str(ApprovalStepRole(value).label)
    except ValueError:
        return value


@register.filter
def role_label(value: str | None) -> str:
    """Any role code (platform, tenant membership, approver) by its name: ``security_admin`` → "security admin"."""
    return role_words(value or "")


@register.filter
def scheduler_text(value: str | None) -> str:
    """A sentence the scheduler stored (placement, preemption, why a job waits) in the page's language."""
    return localize_scheduler_text(value or "")


@register.filter
def service_text(value: str | None) -> str:
    """A message a service stored or raised (an approval's result, a refusal) in the page's language."""
    return localize_service_text(value or "")


@register.filter
def when(value, precision: str = "") -> str:
    """A moment in the page language's one format (``frontend.datetimes``): ``{{ job.submitted_at|when }}``,
    ``|when:"seconds"`` where the order within a minute matters."""
    return format_moment(value, seconds=precision == "seconds")


@register.simple_tag
def datetime_format_script() -> str:
    """The page language's one format in the charts' tokens, for ``<html data-datetime-format>``."""
    return moment_format().script
