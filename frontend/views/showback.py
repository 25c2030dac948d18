"""Showback reports: device-hours (and cost, where flavors have a price) per tenant, flavor and period, with a
chart and CSV / XLSX downloads. The numbers come from ``scheduler.showback``, the same code as the API's."""

from __future__ import annotations

import datetime
from collections import defaultdict
from decimal import Decimal

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _

from catalog.models import ResourceFlavor
from frontend.access import Section, action_required, section_required, visible_tenant_ids
from frontend.admin_forms import FlavorPriceForm, attach_domain_error
from frontend.forms import UsageReportForm
from kernel.access_rules import Action
from kernel.api import DomainError
from scheduler import showback
from tenants import selectors as tenant_selectors
from tenants.access import may
from tenants.services.quotas import flavor_price_set

CHART_COLORS = 6


def _tenant_scope(request, slug: str) -> list[int] | None:
    """Tenant ids to report on: the chosen tenant's subtree, or everything the user may see (None = all)."""
    allowed = visible_tenant_ids(request.user, Action.USAGE_VIEW)
    if not slug:
        return None if allowed is None else sorted(allowed)
    tenant = tenant_selectors.tenants_visible_to(request.user).filter(slug=slug).first()
    if tenant is None:
        return []
    subtree = set(tenant_selectors.tenant_subtree_ids(tenant))
    return sorted(subtree if allowed is None else subtree & allowed)


def usage_chart(report: showback.UsageReport) -> dict:
    """Bars per period stacked by flavor, from each tenant's *own* hours (subtree hours would count twice)."""
    totals: dict[datetime.date, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for row in report.tenants:
        totals[row.period_start][row.flavor] += row.own_device_hours
    flavors = sorted({flavor for per in totals.values() for flavor in per})
    periods = sorted(totals)
    peak = max((sum(per.values()) for per in totals.values()), default=Decimal(0)) or Decimal(1)
    width = 100 / max(len(periods), 1)
    bars = []
    for index, period in enumerate(periods):
        y = Decimal(100)
        segments = []
        for position, flavor in enumerate(flavors):
            hours = totals[period].get(flavor, Decimal(0))
            height = hours / peak * 90
            y -= height
            segments.append(
                {
                    "flavor": flavor,
                    "hours": hours,
                    "y": float(y),
                    "height": float(height),
                    "color": position % CHART_COLORS,
                }
            )
        bars.append(
            {
                "period": period,
                "x": index * width + (width - min(width * 0.7, 12)) / 2,
                "width": min(width * 0.7, 12),
                "segments": segments,
                "total": sum(totals[period].values()),
            }
        )
    return {"bars": bars, "flavors": [(f, i % CHART_COLORS) for i, f in enumerate(flavors)], "peak": peak}


@section_required(Section.REPORTS)
def usage_reports(request):
    tenants = [
        (t.slug, f"{t.name} ({t.slug})") for t in tenant_selectors.tenants_visible_to(request.user).order_by("slug")
    ]
    today = timezone.now().date()
    data = (
        request.GET
        if "start" in request.GET
        else {"start": today - datetime.timedelta(days=6), "end": today, "period": "day"}
    )
    form = UsageReportForm(data, tenants=tenants)
    report = chart = None
    if form.is_valid():
        start, end = form.range()
        report = showback.usage_report(
            start=start,
            end=end,
            period=form.cleaned_data["period"],
            tenant_ids=_tenant_scope(request, form.cleaned_data["tenant"]),
        )
        export = request.GET.get("export")
        stamp = f"{form.cleaned_data['start']:%Y%m%d}-{form.cleaned_data['end']:%Y%m%d}"
        if export in ("csv", "detail"):
            body = showback.report_csv(report, kind="tenants" if export == "csv" else "detail")
            response = HttpResponse(body, content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = f'attachment; filename="gpupool-usage-{export}-{stamp}.csv"'
            return response
        if export == "xlsx":
            response = HttpResponse(
                showback.report_xlsx(report),
                content_type="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
            )
            response["Content-Disposition"] = f'attachment; filename="gpupool-usage-{stamp}.xlsx"'
            return response
        chart = usage_chart(report)
    context = {
        "section": Section.REPORTS,
        "form": form,
        "report": report,
        "chart": chart,
        "can_set_prices": may(request.user, Action.PRICE_SET),
    }
    return render(request, "frontend/reports/usage.html", context)


@action_required(Action.PRICE_SET)
def price_list(request):
    """Prices of a card-hour per flavor (what the reports' cost column multiplies by), and the form that sets one
    through the same service as ``POST /api/v1/flavor-prices/``."""
    flavors = list(ResourceFlavor.objects.select_related("price").order_by("name"))
    names = [flavor.name for flavor in flavors]
    form = FlavorPriceForm(flavors=names, initial={"flavor": request.GET.get("flavor", "")})
    if request.method == "POST":
        form = FlavorPriceForm(request.POST, flavors=names)
        if form.is_valid():
            data = form.cleaned_data
            flavor = next(f for f in flavors if f.name == data["flavor"])
            try:
                price = flavor_price_set(
                    actor=request.user,
                    flavor=flavor,
                    price_per_device_hour=data["price_per_device_hour"],
                    currency=data["currency"],
                    request=request,
                )
            except DomainError as exc:
                attach_domain_error(form, exc)
            else:
                messages.success(
                    request,
                    _("A card-hour of %(flavor)s now costs %(price)s %(currency)s.")
                    % {"flavor": flavor.name, "price": price.price_per_device_hour, "currency": price.currency},
                )
                return redirect("frontend:prices")
    context = {"section": Section.REPORTS, "flavors": flavors, "form": form}
    return render(request, "frontend/reports/prices.html", context)
