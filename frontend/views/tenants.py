"""Tenants and quotas: the tenant tree, a tenant's page (members, quota bars per flavor), quota change requests
and the approval inbox."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count
from django.http import Http404
from django.shortcuts import render

from frontend.access import Section, section_required
from portal.api import NotFoundError
from tenants import selectors as tenant_selectors
from tenants.models import Tenant


@dataclass
class TreeNode:
    tenant: Tenant
    members: int = 0
    children: list[TreeNode] = field(default_factory=list)


def tenant_tree(user) -> list[TreeNode]:
    """The tenants ``user`` may see as a forest: roots are the topmost visible tenants."""
    tenants = list(tenant_selectors.tenants_visible_to(user).annotate(member_count=Count("memberships")))
    nodes = {t.pk: TreeNode(tenant=t, members=t.member_count) for t in tenants}
    roots: list[TreeNode] = []
    for t in sorted(tenants, key=lambda t: (t.depth, t.name)):
        parent = nodes.get(t.parent_id)
        (parent.children if parent else roots).append(nodes[t.pk])
    return roots


def _tenant_or_404(request, pk):
    try:
        return tenant_selectors.tenant_get_visible(user=request.user, pk=pk)
    except NotFoundError:
        raise Http404 from None


@section_required(Section.TENANTS)
def tenant_list(request):
    return render(
        request, "frontend/tenants/list.html", {"section": Section.TENANTS, "tree": tenant_tree(request.user)}
    )


@section_required(Section.TENANTS)
def tenant_detail(request, pk: int):
    tenant = _tenant_or_404(request, pk)
    memberships = tenant_selectors.memberships_visible_to(request.user).filter(tenant=tenant).order_by("user__username")
    children = tenant_selectors.tenants_visible_to(request.user).filter(parent=tenant).order_by("name")
    context = {
        "section": Section.TENANTS,
        "tenant": tenant,
        "ancestors": _ancestors(tenant),
        "memberships": memberships,
        "children": children,
    }
    return render(request, "frontend/tenants/detail.html", context)


def _ancestors(tenant: Tenant) -> list[Tenant]:
    chain = []
    node = tenant.parent
    while node is not None:
        chain.append(node)
        node = node.parent
    return list(reversed(chain))
