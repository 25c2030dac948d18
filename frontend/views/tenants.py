"""Tenants and quotas: the tenant tree, a tenant's page (members, quota bars per flavor), quota change requests
and the approval inbox."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib import messages
from django.db.models import Count
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from catalog.models import ResourceFlavor
from frontend.access import Section, action_required, section_required, sections_for
from frontend.forms import DecisionForm, QuotaChangeForm
from frontend.service_text import localize
from frontend.summaries import guarantee_overcommit
from frontend.tenant_pages import current_quota_values, flavor_names, quota_form_flavor, quota_rows, tenant_ancestors
from kernel.access_rules import Action
from kernel.api import DomainError, NotFoundError
from tenants import selectors as tenant_selectors
from tenants.access import allows
from tenants.approval_chain import chain_plan, decided_by_sentence
from tenants.models import OPEN_APPROVAL_STATUSES, ApprovalKind, ApprovalStepRole, Quota, Tenant
from tenants.permissions import can_admin_tenant, can_decide_approval, is_approval_override
from tenants.services.approvals import (
    approval_approve,
    approval_reject,
    approval_request_changes,
    quota_change_request_create,
)

# Quota bars in the tree cost a few queries per tenant; past this many tenants the tree shows names only.
TREE_QUOTA_LIMIT = 60


@dataclass
class TreeNode:
    tenant: Tenant
    members: int = 0
    children: list[TreeNode] = field(default_factory=list)
    quotas: list = field(default_factory=list)


def tenant_tree(user) -> list[TreeNode]:
    """The tenants ``user`` may see as a forest: roots are the topmost visible tenants."""
    tenants = list(tenant_selectors.tenants_visible_to(user).annotate(member_count=Count("memberships")))
    nodes = {t.pk: TreeNode(tenant=t, members=t.member_count) for t in tenants}
    if len(tenants) <= TREE_QUOTA_LIMIT:
        for t in tenants:
            nodes[t.pk].quotas = quota_rows(t)
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
    inbox = None
    if Section.APPROVALS in sections_for(request.user):
        inbox = len(tenant_selectors.approvals_awaiting(request.user))
    context = {
        "section": Section.TENANTS,
        "tree": tenant_tree(request.user),
        "inbox_count": inbox,
        "can_create": tenant_selectors.tenants_administered_by(request.user).exists(),
    }
    return render(request, "frontend/tenants/list.html", context)


@section_required(Section.TENANTS)
def tenant_detail(request, pk: int):
    tenant = _tenant_or_404(request, pk)
    memberships = tenant_selectors.memberships_visible_to(request.user).filter(tenant=tenant).order_by("user__username")
    children = tenant_selectors.tenants_visible_to(request.user).filter(parent=tenant).order_by("name")
    context = {
        "section": Section.TENANTS,
        "tenant": tenant,
        "ancestors": tenant_ancestors(tenant),
        "memberships": memberships,
        "children": children,
        "quotas": quota_rows(tenant),
        "can_request": allows(request.user, Action.QUOTA_REQUEST, tenant),
        # The same predicates the tenant-admin pages check (frontend.views.tenant_admin).
        "can_edit": can_admin_tenant(request.user, tenant),
        "can_set_quota": allows(request.user, Action.QUOTA_SET, tenant),
    }
    if context["can_request"]:
        flavors = flavor_names()
        chosen = quota_form_flavor(tenant, request.GET.get("flavor"), flavors)
        context["quota_flavors"] = flavors
        context["quota_flavor"] = chosen
        context["quota_form"] = QuotaChangeForm(
            flavors=flavors, prefix="q", current=current_quota_values(tenant, chosen), initial={"flavor": chosen}
        )
        context["overcommit"] = guarantee_overcommit()
    return render(request, "frontend/tenants/detail.html", context)


@require_POST
@section_required(Section.TENANTS)
@action_required(Action.QUOTA_REQUEST)
def quota_request(request, pk: int):
    tenant = _tenant_or_404(request, pk)
    if not allows(request.user, Action.QUOTA_REQUEST, tenant):
        raise Http404
    flavor_name = request.POST.get("q-flavor")
    form = QuotaChangeForm(
        request.POST, flavors=flavor_names(), prefix="q", current=current_quota_values(tenant, flavor_name)
    )
    if form.is_valid() and not form.changed_values():
        messages.error(request, _("Nothing changed: edit at least one value before sending the request."))
        return redirect(f"{reverse('frontend:tenant-detail', args=[tenant.pk])}?flavor={flavor_name}")
    if form.is_valid():
        flavor = ResourceFlavor.objects.get(name=form.cleaned_data["flavor"])
        try:
            approval = quota_change_request_create(
                actor=request.user,
                tenant=tenant,
                flavor=flavor,
                values=form.changed_values(),
                reason=form.cleaned_data["reason"],
                request=request,
            )
        except DomainError as exc:
            messages.error(request, localize(exc.message))
        else:
            messages.success(
                request,
                _("Quota change request %(id)s sent for approval. It will be decided by: %(chain)s.")
                % {"id": approval.pk, "chain": decided_by_sentence(approval)},
            )
            if approval.escalations:
                messages.warning(
                    request,
                    _("Nobody but you holds the role %(roles)s, so the request goes to the next approver instead.")
                    % {"roles": ", ".join(str(ApprovalStepRole(step["role"]).label) for step in approval.escalations)},
                )
            return redirect("frontend:approval-detail", pk=approval.pk)
    else:
        messages.error(request, " ".join(" ".join(errors) for errors in form.errors.values()))
    return redirect("frontend:tenant-detail", pk=tenant.pk)


# --- approvals ------------------------------------------------------------------------------------------


def _approval_or_404(request, pk):
    try:
        return tenant_selectors.approval_get_visible(user=request.user, pk=pk)
    except NotFoundError:
        raise Http404 from None


@section_required(Section.APPROVALS)
def approval_inbox(request):
    visible = tenant_selectors.approvals_visible_to(request.user)
    context = {
        "section": Section.APPROVALS,
        "awaiting": tenant_selectors.approvals_awaiting(request.user),
        "overridable": tenant_selectors.approvals_overridable(request.user),
        "mine": visible.filter(requester=request.user, status__in=OPEN_APPROVAL_STATUSES),
        "recent": visible.exclude(status__in=OPEN_APPROVAL_STATUSES).order_by("-updated_at")[:20],
    }
    return render(request, "frontend/tenants/approvals.html", context)


@section_required(Section.APPROVALS)
def approval_detail(request, pk: int):
    approval = _approval_or_404(request, pk)
    current = None
    if approval.kind == ApprovalKind.QUOTA_CHANGE and approval.flavor_id:
        current = Quota.objects.filter(tenant=approval.tenant, flavor=approval.flavor).first()
    fields = (
        [
            (
                label,
                quota_value_text(field, current.values().get(field) if current else None, current is not None),
                quota_value_text(field, approval.payload.get(field), True),
                (current.values().get(field) if current else None) != approval.payload.get(field),
            )
            for field, label in QUOTA_FIELD_LABELS
        ]
        if approval.kind == ApprovalKind.QUOTA_CHANGE
        else []
    )
    form = DecisionForm()
    if request.method == "POST":
        form = DecisionForm(request.POST)
        if form.is_valid():
            decide = {
                "approve": approval_approve,
                "reject": approval_reject,
                "request_changes": approval_request_changes,
            }[form.cleaned_data["decision"]]
            try:
                decide(actor=request.user, approval=approval, comment=form.cleaned_data["comment"], request=request)
            except DomainError as exc:
                messages.error(request, localize(exc.message))
            else:
                messages.success(request, _("Decision recorded."))
                return redirect("frontend:approval-detail", pk=approval.pk)
    context = {
        "section": Section.APPROVALS,
        "approval": approval,
        "fields": fields,
        "steps": list(approval.steps.all()),
        "can_decide": can_decide_approval(request.user, approval),
        "overcommit": _overcommit_if_approved(approval, current),
        "is_override": is_approval_override(request.user, approval),
        "plan": chain_plan(approval),
        "form": form,
    }
    return render(request, "frontend/tenants/approval_detail.html", context)


def _overcommit_if_approved(approval, current) -> list:
    """The overcommit the pool would have with this request applied (a top-level tenant's guarantee is what
    adds up against the cards; a lower tenant's must fit inside its parent's)."""
    change: dict[str, int] = {}
    if approval.kind == ApprovalKind.QUOTA_CHANGE and approval.flavor_id and approval.tenant.parent_id is None:
        before = current.guaranteed_millis if current else 0
        change[approval.flavor.name] = (approval.payload.get("guaranteed_millis") or 0) - before
    return guarantee_overcommit(change)


QUOTA_FIELD_LABELS = [
    ("guaranteed_millis", gettext_lazy("Guaranteed (cards)")),
    ("limit_millis", gettext_lazy("Limit (cards)")),
    ("lending_limit_millis", gettext_lazy("Lendable (cards)")),
    ("guaranteed_memory_mib", gettext_lazy("Guaranteed memory (GiB)")),
    ("max_running_jobs", gettext_lazy("Maximum running jobs")),
]


def quota_value_text(field: str, value: int | None, has_quota: bool) -> str:
    """A quota number as people read it: cards, GiB, or "no limit"."""
    if not has_quota:
        return "—"
    if value is None:
        return _("no limit") if field != "lending_limit_millis" else _("all idle")
    if field.endswith("_millis"):
        return f"{value / 1000:g}"
    if field.endswith("_mib"):
        return f"{value / 1024:g}"
    return str(value)
