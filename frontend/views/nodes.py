"""Nodes and devices: a filterable table, and a node page with live per-card charts and the jobs on each card."""

from __future__ import annotations

from django.db.models import Count, Prefetch, Q, Sum
from django.shortcuts import get_object_or_404, render
from django_tables2 import RequestConfig

from frontend.access import Section, is_system_admin, section_required
from frontend.export import export_response
from frontend.filtersets import NodeFilterSet
from frontend.summaries import devices_for_charts
from frontend.tables import NodeTable
from scheduler.models import Allocation, Device, Node


def _nodes():
    return (
        Node.objects.annotate(
            device_count=Count("devices", distinct=True),
            allocated_millis=Sum("allocations__millis", filter=Q(allocations__ended_at__isnull=True)),
        )
        .prefetch_related(Prefetch("devices", queryset=Device.objects.select_related("flavor")))
        .order_by("name")
    )


@section_required(Section.NODES)
def node_list(request):
    filterset = NodeFilterSet(request.GET, queryset=_nodes())
    table = NodeTable(filterset.qs)
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
        "can_operate": is_system_admin(request.user),
    }
    return render(request, "frontend/nodes/detail.html", context)
