"""Nodes and devices: a filterable table, and a node page with live per-card charts and the jobs on each card."""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Count, OuterRef, Prefetch, Subquery, Sum
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST
from django_tables2 import RequestConfig

from frontend.access import Section, action_required, section_required
from frontend.export import export_response
from frontend.filtersets import NodeFilterSet
from frontend.service_text import localize
from frontend.summaries import devices_for_charts, node_utilisation
from frontend.tables import NodeTable
from portal.api import DomainError
from portal.policy import Action
from scheduler.models import Allocation, Device, Node
from scheduler.services.nodes import node_cordon, node_drain, node_uncordon
from tenants.policy import allows


def _nodes():
    # Both figures are subqueries: summing allocations in a join with the devices counted each allocation once
    # per card of the node (0.3 shown as 2.4 on an 8-card node).
    allocated = (
        Allocation.objects.active()
        .filter(node=OuterRef("pk"))
        .order_by()
        .values("node")
        .annotate(total=Sum("millis"))
        .values("total")
    )
    cards = Device.objects.filter(node=OuterRef("pk")).order_by().values("node").annotate(n=Count("id")).values("n")
    return (
        Node.objects.annotate(
            device_count=Coalesce(Subquery(cards), 0),
            allocated_millis=Coalesce(Subquery(allocated), 0),
        )
        .prefetch_related(Prefetch("devices", queryset=Device.objects.select_related("flavor")))
        .order_by("name")
    )


@section_required(Section.NODES)
def node_list(request):
    filterset = NodeFilterSet(request.GET, queryset=_nodes())
    nodes = list(filterset.qs)
    table = NodeTable(nodes, utilisation=node_utilisation(nodes))
    export = request.GET.get("export")
    if export in ("csv", "xlsx"):
        RequestConfig(request, paginate=False).configure(table)
        return export_response(table, fmt=export, filename="nodes")
    RequestConfig(request, paginate={"per_page": 50}).configure(table)
    return render(request, "frontend/nodes/list.html", {"section": Section.NODES, "filter": filterset, "table": table})


@section_required(Section.NODES)
def node_detail(request, pk: int):
    node = get_object_or_404(Node, pk=pk)
    devices = list(node.devices.select_related("flavor", "node"))
    active = Allocation.objects.active().filter(node=node).select_related("job", "tenant")
    jobs_by_device: dict[int, list] = {}
    for allocation in active:
        jobs_by_device.setdefault(allocation.device_id, []).append(allocation)
    rows = [{"device": d, "allocations": jobs_by_device.get(d.pk, [])} for d in devices]
    context = {
        "section": Section.NODES,
        "node": node,
        "rows": rows,
        "chart_devices": devices_for_charts(devices),
        "can_operate": allows(request.user, Action.NODE_OPERATE, node),
    }
    return render(request, "frontend/nodes/detail.html", context)


NODE_ACTIONS = {
    "cordon": (node_cordon, _("Node %(name)s cordoned: no new work is placed on it.")),
    "drain": (node_drain, _("Node %(name)s is draining: its jobs checkpoint and move.")),
    "uncordon": (node_uncordon, _("Node %(name)s is back in service.")),
}


@require_POST
@action_required(Action.NODE_OPERATE)
def node_action(request, pk: int):
    node = get_object_or_404(Node, pk=pk)
    action = NODE_ACTIONS.get(request.POST.get("action", ""))
    if action is None:
        messages.error(request, _("Unknown action."))
        return redirect("frontend:node-detail", pk=node.pk)
    service, done = action
    try:
        service(node=node, actor=request.user)
    except DomainError as exc:
        messages.error(request, localize(exc.message))
    else:
        messages.success(request, done % {"name": node.name})
    return redirect("frontend:node-detail", pk=node.pk)
