"""The overview dashboard: pool capacity, allocation and live utilisation per flavor; nodes; the queue."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from frontend.access import Section, section_required, sections_for, visible_tenant_ids
from frontend.summaries import (
    HEAT_STEPS,
    devices_for_charts,
    fleet_heatmap,
    guarantee_overcommit,
    job_counts,
    pool_summary,
)
from scheduler.fleet.models import Device


@login_required
def home(request):
    """Send each person to the first page their role may use (the auditor straight to the audit trail)."""
    sections = sections_for(request.user)
    if Section.AUDIT in sections:
        return redirect("frontend:audit")
    if Section.OVERVIEW in sections:
        return redirect("frontend:overview")
    return render(request, "frontend/empty.html", {})


def _context(request, *, full_page: bool = True) -> dict:
    summary = pool_summary()
    tenant_ids = visible_tenant_ids(request.user)
    own_queued, own_running = job_counts(tenant_ids) if tenant_ids else (None, None)
    sees_nodes = Section.NODES in sections_for(request.user)
    devices = Device.objects.select_related("node", "flavor")
    if sees_nodes:
        devices = list(devices)
        subscribe = [{"subscribe": {"node": node_id}} for node_id in sorted({d.node_id for d in devices})]
    elif tenant_ids:
        # Tenant users see the telemetry of the cards their tenants hold now; the socket sends just those.
        devices = list(
            devices.filter(allocations__ended_at__isnull=True, allocations__tenant_id__in=tenant_ids).distinct()
        )
        subscribe = []
    else:
        devices, subscribe = [], []
    return {
        "subscribe_json": json.dumps(subscribe),
        "heatmap": fleet_heatmap() if sees_nodes and full_page else [],
        "heat_levels": range(HEAT_STEPS + 1),
        "section": Section.OVERVIEW,
        "overcommit": guarantee_overcommit() if sees_nodes else [],
        "summary": summary,
        "chart_devices": devices_for_charts(devices),
        "sees_nodes": sees_nodes,
        "own_jobs": None if not tenant_ids else {"queued": own_queued, "running": own_running},
    }


@section_required(Section.OVERVIEW)
def overview(request):
    return render(request, "frontend/overview.html", _context(request))


@section_required(Section.OVERVIEW)
def overview_numbers(request):
    """The numbers block alone: htmx swaps it in every few seconds, so the dashboard stays current."""
    return render(request, "frontend/partials/overview_numbers.html", _context(request, full_page=False))
