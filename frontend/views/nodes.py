"""Nodes and devices: a filterable table, and a node page with live per-card charts and the jobs on each card."""

from __future__ import annotations

import shlex

from django.conf import settings
from django.contrib import messages
from django.db.models import Count, Exists, OuterRef, Prefetch, Subquery, Sum
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from django_tables2 import RequestConfig

from frontend.access import Section, action_required, section_required
from frontend.admin_forms import BootstrapTokenForm, attach_domain_error
from frontend.export import export_response
from frontend.filtersets import NodeFilterSet
from frontend.service_text import localize
from frontend.summaries import devices_for_charts, node_utilisation
from frontend.tables import NodeTable, node_status_shown
from kernel.access_rules import Action
from kernel.api import DomainError
from scheduler.fleet.models import Device, Node
from scheduler.fleet.selectors import bootstrap_tokens_recent
from scheduler.fleet.services.enrolment import bootstrap_token_create
from scheduler.fleet.services.nodes import node_cordon, node_drain, node_uncordon
from scheduler.models import Allocation
from tenants.access import allows, may


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
            holds_work=Exists(Allocation.objects.active().filter(node=OuterRef("pk"))),
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
    context = {
        "section": Section.NODES,
        "filter": filterset,
        "table": table,
        "can_enrol": may(request.user, Action.FLEET_MANAGE),
    }
    return render(request, "frontend/nodes/list.html", context)


@section_required(Section.NODES)
def node_detail(request, pk: int):
    node = get_object_or_404(Node, pk=pk)
    devices = list(node.devices.select_related("flavor", "node"))
    active = list(Allocation.objects.active().filter(node=node).select_related("job", "tenant"))
    jobs_by_device: dict[int, list] = {}
    for allocation in active:
        jobs_by_device.setdefault(allocation.device_id, []).append(allocation)
    rows = [{"device": d, "allocations": jobs_by_device.get(d.pk, [])} for d in devices]
    context = {
        "section": Section.NODES,
        "node": node,
        "status_shown": node_status_shown(node.status, holds_work=bool(active)),
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


def enrol_commands(*, server: str, secret: str, node_name: str) -> list[str]:
    """The command lines that add a node with ``secret``: register (trade the token for the node's credential),
    then run the agent (it reads the server and credential from the file register wrote)."""
    register = ["gpupool-agent", "register", "--server", server, "--token", secret]
    if node_name:
        register += ["--node-name", node_name]
    return [shlex.join(register), "gpupool-agent run --backend auto"]


@never_cache
@action_required(Action.FLEET_MANAGE)
def node_enrol(request):
    """Add a node: make a one-time bootstrap token (the service ``gpupool agent_bootstrap_token`` and
    ``POST /api/v1/agents/bootstrap-tokens/`` use) and show it, with the command lines to run on the node, on
    this answer only (no redirect): the secret is not kept, so a reload cannot show it again."""
    ttl_default_min = max(1, settings.GPUPOOL_BOOTSTRAP_TOKEN_TTL_S // 60)
    form = BootstrapTokenForm(initial={"ttl_minutes": ttl_default_min})
    created = None
    if request.method == "POST":
        form = BootstrapTokenForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                token, secret = bootstrap_token_create(
                    actor=request.user,
                    ttl_s=data["ttl_minutes"] * 60,
                    description=data["description"] or data["node_name"],
                    request=request,
                )
            except DomainError as exc:
                attach_domain_error(form, exc, {"ttl_s": "ttl_minutes"})
            else:
                server = request.build_absolute_uri("/").rstrip("/")
                created = {
                    "token": token,
                    "secret": secret,
                    "commands": enrol_commands(server=server, secret=secret, node_name=data["node_name"]),
                }
                form = BootstrapTokenForm(initial={"ttl_minutes": ttl_default_min})
    context = {
        "section": Section.NODES,
        "form": form,
        "created": created,
        "tokens": bootstrap_tokens_recent(),
        "now": timezone.now(),
    }
    return render(request, "frontend/nodes/enrol.html", context)
