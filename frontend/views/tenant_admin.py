"""Changing the tenant tree and its quotas: create a tenant, rename or move it, delete an empty one, and set a
tenant's quota per flavor.

The same rules as the API, from the same services: a system admin may do all of it; a tenant admin may add,
rename and move tenants inside the subtree they administer (moving needs rights above the moved tenant), and
requests quota changes instead of setting them (the approval form on the tenant's page). There is no
"archive": a tenant with members, sub-tenants, quotas or jobs cannot be deleted, and the page says which.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from catalog.models import ResourceFlavor
from frontend.access import Section, action_required, section_required
from frontend.admin_forms import TOP_LEVEL, QuotaSetForm, TenantForm, attach_domain_error, tenant_choices
from frontend.service_text import localize
from frontend.summaries import guarantee_overcommit
from frontend.tenant_pages import current_quota_values, flavor_names, quota_form_flavor, quota_rows, tenant_ancestors
from kernel.access_rules import Action
from kernel.api import DomainError, NotFoundError
from tenants import selectors as tenant_selectors
from tenants.access import allows, reaches_all
from tenants.models import Tenant
from tenants.permissions import can_admin_strict_ancestor, can_admin_tenant
from tenants.services import quotas, tenancy


def _tenant_or_404(request, pk) -> Tenant:
    try:
        return tenant_selectors.tenant_get_visible(user=request.user, pk=pk)
    except NotFoundError:
        raise Http404 from None


def _parent_choices(user, *, exclude: Tenant | None = None) -> list[tuple[str, str]]:
    """Where ``user`` may put a tenant: the tenants they administer (not ``exclude``'s own subtree, which
    would make a cycle) and, for a system admin, the top level."""
    tenants = list(tenant_selectors.tenants_visible_to(user))
    allowed = set(tenant_selectors.tenants_administered_by(user).values_list("pk", flat=True))
    if exclude is not None:
        allowed -= set(tenant_selectors.tenant_subtree_ids(exclude))
    choices = [choice for choice in tenant_choices(tenants) if int(choice[0]) in allowed]
    if reaches_all(user, Action.TENANT_CREATE):  # a top-level tenant is the system admin's
        choices.insert(0, (TOP_LEVEL, _("— top level —")))
    return choices


def _parent_from(request, value: str) -> Tenant | None:
    return None if value == TOP_LEVEL else _tenant_or_404(request, value)


@section_required(Section.TENANTS)
@action_required(Action.TENANT_CREATE)
def tenant_create(request):
    parents = _parent_choices(request.user)
    if not parents:
        raise Http404  # members and viewers change nothing in the tree
    initial = {"parent": request.GET.get("parent", parents[0][0])}
    form = TenantForm(parents=parents, initial=initial)
    if request.method == "POST":
        form = TenantForm(request.POST, parents=parents)
        if form.is_valid():
            data = form.cleaned_data
            try:
                tenant = tenancy.tenant_create(
                    actor=request.user,
                    name=data["name"],
                    slug=data["slug"],
                    kind=data["kind"],
                    parent=_parent_from(request, data["parent"]),
                    description=data["description"],
                    request=request,
                )
            except DomainError as exc:
                attach_domain_error(form, exc)
            else:
                messages.success(request, _("Tenant %(name)s created.") % {"name": tenant.name})
                return redirect("frontend:tenant-detail", pk=tenant.pk)
    return render(request, "frontend/tenants/tenant_form.html", {"section": Section.TENANTS, "form": form})


@section_required(Section.TENANTS)
@action_required(Action.TENANT_CHANGE)
def tenant_edit(request, pk: int):
    """Rename, re-describe and (with rights above it) move a tenant."""
    tenant = _tenant_or_404(request, pk)
    if not can_admin_tenant(request.user, tenant):
        raise Http404
    may_move = can_admin_strict_ancestor(request.user, tenant)
    parents = _parent_choices(request.user, exclude=tenant) if may_move else None
    current_parent = str(tenant.parent_id) if tenant.parent_id else TOP_LEVEL
    if parents is not None and current_parent not in {value for value, _label in parents}:
        # Under a parent this person cannot choose (e.g. the top level, for a tenant admin): keep it offered.
        parents.insert(0, (current_parent, tenant.parent.name if tenant.parent_id else _("— top level —")))
    initial = {"name": tenant.name, "kind": tenant.kind, "description": tenant.description, "parent": current_parent}
    form = TenantForm(parents=parents, with_slug=False, initial=initial)
    if request.method == "POST":
        form = TenantForm(request.POST, parents=parents, with_slug=False, initial=initial)
        if form.is_valid():
            data = form.cleaned_data
            changes = {"name": data["name"], "kind": data["kind"], "description": data["description"]}
            if parents is not None and data["parent"] != current_parent:
                changes["parent"] = _parent_from(request, data["parent"])
            try:
                tenant = tenancy.tenant_update(actor=request.user, tenant=tenant, request=request, **changes)
            except DomainError as exc:
                attach_domain_error(form, exc)
            else:
                moved = "parent" in changes
                messages.success(
                    request,
                    (_("Tenant %(name)s moved.") if moved else _("Tenant %(name)s saved.")) % {"name": tenant.name},
                )
                return redirect("frontend:tenant-detail", pk=tenant.pk)
    context = {
        "section": Section.TENANTS,
        "form": form,
        "tenant": tenant,
        "ancestors": tenant_ancestors(tenant),
        "may_delete": may_move,
    }
    return render(request, "frontend/tenants/tenant_form.html", context)


@require_POST
@section_required(Section.TENANTS)
@action_required(Action.TENANT_DELETE)
def tenant_delete(request, pk: int):
    tenant = _tenant_or_404(request, pk)
    if not can_admin_strict_ancestor(request.user, tenant):
        raise Http404
    parent_id, name = tenant.parent_id, tenant.name
    try:
        tenancy.tenant_delete(actor=request.user, tenant=tenant, request=request)
    except DomainError as exc:
        messages.error(request, localize(exc.message))
        return redirect("frontend:tenant-edit", pk=tenant.pk)
    messages.success(request, _("Tenant %(name)s deleted.") % {"name": name})
    if parent_id:
        return redirect("frontend:tenant-detail", pk=parent_id)
    return redirect("frontend:tenant-list")


@section_required(Section.TENANTS)
@action_required(Action.QUOTA_SET)
def quota_edit(request, pk: int):
    """A system admin sets a tenant's quota for one flavor at a time (tabs), starting from the current values.
    The service checks the numbers against the whole tree; its message appears at the field it is about."""
    tenant = _tenant_or_404(request, pk)
    if not allows(request.user, Action.QUOTA_SET, tenant):
        raise Http404
    flavors = flavor_names()
    asked = request.POST.get("q-flavor") if request.method == "POST" else request.GET.get("flavor")
    flavor_name = quota_form_flavor(tenant, asked, flavors)
    current = current_quota_values(tenant, flavor_name)
    form = QuotaSetForm(flavors=flavors, prefix="q", current=current, initial={"flavor": flavor_name})
    if request.method == "POST" and flavor_name is not None:
        form = QuotaSetForm(request.POST, flavors=flavors, prefix="q", current=current)
        if form.is_valid():
            flavor = ResourceFlavor.objects.get(name=form.cleaned_data["flavor"])
            try:
                quotas.quota_set(
                    actor=request.user, tenant=tenant, flavor=flavor, values=form.values(), request=request
                )
            except DomainError as exc:
                attach_domain_error(form, exc, QuotaSetForm.SERVICE_FIELD_ALIASES)
            else:
                messages.success(
                    request,
                    _("Quota of %(tenant)s for %(flavor)s saved.") % {"tenant": tenant.name, "flavor": flavor.name},
                )
                return redirect(f"{reverse('frontend:tenant-quotas', args=[tenant.pk])}?flavor={flavor.name}")
    context = {
        "section": Section.TENANTS,
        "tenant": tenant,
        "ancestors": tenant_ancestors(tenant),
        "quotas": quota_rows(tenant),
        "quota_flavors": flavors,
        "quota_flavor": flavor_name,
        "form": form,
        "has_quota": bool(current),
        "overcommit": guarantee_overcommit(),
    }
    return render(request, "frontend/tenants/quota_edit.html", context)
