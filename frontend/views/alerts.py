"""The platform's alerts (``audit.models.Alert``: a failed audit write, an unreachable witness, a failed integrity
check), newest first, for the platform roles the access policy lets read them; admins acknowledge them here."""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from audit.selectors import alerts_for
from audit.services import alert_acknowledge
from frontend.access import Section, action_required, section_required
from frontend.service_text import localize
from kernel.access_rules import Action
from kernel.api import DomainError
from tenants.access import may

PAGE_SIZE = 50


@section_required(Section.ALERTS)
def alert_list(request):
    show = "all" if request.GET.get("show") == "all" else "open"
    alerts = alerts_for(request.user, open_only=show == "open")
    page = Paginator(alerts, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "section": Section.ALERTS,
        "page": page,
        "show": show,
        "open_count": alerts_for(request.user, open_only=True).count(),
        "can_acknowledge": may(request.user, Action.ALERT_ACKNOWLEDGE),
    }
    return render(request, "frontend/alerts/list.html", context)


@require_POST
@action_required(Action.ALERT_ACKNOWLEDGE)
def alert_acknowledge_view(request):
    """Acknowledge the alert named by the form's ``alert`` (one that is gone is said so, not a 404)."""
    raw = request.POST.get("alert", "")
    alert = alerts_for(request.user).filter(pk=int(raw)).first() if raw.isdigit() else None
    if alert is None:
        messages.error(request, _("No such alert; the list below is current."))
        return redirect("frontend:alerts")
    try:
        alert_acknowledge(alert=alert, actor=request.user, request=request)
    except DomainError as exc:
        messages.error(request, localize(exc.message))
    else:
        messages.success(request, _("Alert acknowledged."))
    return redirect("frontend:alerts")
