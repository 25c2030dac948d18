"""The security admin's pages: accounts (create, platform role, activate or deactivate, two-factor reset),
their tenant roles and tokens, and sign-in lockouts.

Each write is one call to the service the API uses (``tenants.services``), which checks the role again and
writes the audit record; a refusal is shown as the service words it.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST
from django_otp import devices_for_user
from django_tables2 import RequestConfig

from frontend.access import Section, action_required, section_required
from frontend.admin_forms import (
    MembershipAddForm,
    MembershipRoleForm,
    PlatformRoleForm,
    UserCreateForm,
    UserFilterSet,
    annotate_account_state,
    attach_domain_error,
    tenant_choices,
)
from frontend.service_text import localize
from frontend.tables import UserTable
from kernel.access_rules import Action
from kernel.api import DomainError, NotFoundError
from tenants import selectors as tenant_selectors
from tenants.models import TOKEN_PREFIX
from tenants.services import identity
from tenants.services.memberships import membership_create, membership_delete, membership_update
from tenants.services.tokens import api_token_revoke


def _user_or_404(request, pk):
    try:
        return tenant_selectors.user_get_visible(user=request.user, pk=pk)
    except NotFoundError:
        raise Http404 from None


def _done(request, call, success: str) -> bool:
    """Run a service call; say how it went. True when it succeeded."""
    try:
        call()
    except DomainError as exc:
        messages.error(request, localize(exc.message))
        return False
    messages.success(request, success)
    return True


@section_required(Section.USERS)
def user_list(request):
    lockouts = tenant_selectors.auth_lockouts_visible_to(request.user)
    accounts = annotate_account_state(tenant_selectors.users_visible_to(request.user), lockouts)
    filterset = UserFilterSet(request.GET, queryset=accounts, request=request)
    table = UserTable(filterset.qs)
    RequestConfig(request, paginate={"per_page": 50}).configure(table)
    context = {"section": Section.USERS, "filter": filterset, "table": table}
    return render(request, "frontend/admin/users.html", context)


@section_required(Section.USERS)
def user_create(request):
    form = UserCreateForm()
    if request.method == "POST":
        form = UserCreateForm(request.POST)
        if form.is_valid():
            try:
                user = identity.user_create(actor=request.user, request=request, **form.service_kwargs())
            except DomainError as exc:
                attach_domain_error(form, exc)
            else:
                messages.success(request, _("Account %(name)s created.") % {"name": user.username})
                return redirect("frontend:user-detail", pk=user.pk)
    return render(request, "frontend/admin/user_new.html", {"section": Section.USERS, "form": form})


@section_required(Section.USERS)
def user_detail(request, pk: int):
    account = _user_or_404(request, pk)
    memberships = tenant_selectors.memberships_visible_to(request.user).filter(user=account).order_by("tenant__slug")
    tenants = list(tenant_selectors.tenants_visible_to(request.user))
    lockouts = tenant_selectors.auth_lockouts_visible_to(request.user).filter(username=account.username)
    context = {
        "section": Section.USERS,
        "account": account,
        "is_self": account.pk == request.user.pk,
        "role_form": PlatformRoleForm(initial={"platform_role": account.platform_role}),
        "mfa_devices": list(devices_for_user(account, confirmed=None)),
        "lockouts": lockouts,
        "memberships": [(m, MembershipRoleForm(initial={"role": m.role}, prefix=f"m{m.pk}")) for m in memberships],
        "membership_form": MembershipAddForm(tenants=tenant_choices(tenants)),
        "tokens": tenant_selectors.tokens_visible_to(request.user).filter(user=account),
        "token_prefix": TOKEN_PREFIX,
    }
    return render(request, "frontend/admin/user_detail.html", context)


@require_POST
@section_required(Section.USERS)
@action_required(Action.USER_PLATFORM_ROLE)
def user_set_role(request, pk: int):
    account = _user_or_404(request, pk)
    form = PlatformRoleForm(request.POST)
    if form.is_valid():
        role = form.cleaned_data["platform_role"]
        _done(
            request,
            lambda: identity.user_set_platform_role(
                actor=request.user, user=account, platform_role=role, request=request
            ),
            _("Platform role of %(name)s saved.") % {"name": account.username},
        )
    return redirect("frontend:user-detail", pk=account.pk)


@require_POST
@section_required(Section.USERS)
def user_set_active(request, pk: int):
    account = _user_or_404(request, pk)
    active = request.POST.get("active") == "true"
    _done(
        request,
        lambda: identity.user_update(actor=request.user, user=account, is_active=active, request=request),
        (_("%(name)s may sign in again.") if active else _("%(name)s is deactivated: no sign-in, no API tokens."))
        % {"name": account.username},
    )
    return redirect("frontend:user-detail", pk=account.pk)


@require_POST
@section_required(Section.USERS)
def user_mfa_reset(request, pk: int):
    account = _user_or_404(request, pk)
    try:
        removed = identity.mfa_reset(actor=request.user, user=account, request=request)
    except DomainError as exc:
        messages.error(request, localize(exc.message))
    else:
        messages.success(
            request,
            _("Two-factor reset for %(name)s: %(count)s device(s) removed. They enrol a new one at their next sign-in.")
            % {"name": account.username, "count": removed},
        )
    return redirect("frontend:user-detail", pk=account.pk)


@require_POST
@section_required(Section.USERS)
@action_required(Action.MEMBERSHIP_MANAGE)
def membership_add(request, pk: int):
    account = _user_or_404(request, pk)
    tenants = list(tenant_selectors.tenants_visible_to(request.user))
    form = MembershipAddForm(request.POST, tenants=tenant_choices(tenants))
    if not form.is_valid():
        messages.error(request, " ".join(" ".join(errors) for errors in form.errors.values()))
        return redirect("frontend:user-detail", pk=account.pk)
    try:
        tenant = tenant_selectors.tenant_get_visible(user=request.user, pk=form.cleaned_data["tenant"])
    except NotFoundError as exc:  # deleted since the page was drawn
        messages.error(request, localize(exc.message))
        return redirect("frontend:user-detail", pk=account.pk)
    _done(
        request,
        lambda: membership_create(
            actor=request.user, user=account, tenant=tenant, role=form.cleaned_data["role"], request=request
        ),
        _("%(name)s added to %(tenant)s.") % {"name": account.username, "tenant": tenant.name},
    )
    return redirect("frontend:user-detail", pk=account.pk)


@require_POST
@section_required(Section.USERS)
@action_required(Action.MEMBERSHIP_MANAGE)
def membership_change(request, pk: int, membership_pk: int):
    """Change a tenant role (``action=save``) or remove the membership (``action=remove``)."""
    account = _user_or_404(request, pk)
    membership = tenant_selectors.memberships_visible_to(request.user).filter(user=account, pk=membership_pk).first()
    if membership is None:
        raise Http404
    if request.POST.get("action") == "remove":
        _done(
            request,
            lambda: membership_delete(actor=request.user, membership=membership, request=request),
            _("%(name)s removed from %(tenant)s.") % {"name": account.username, "tenant": membership.tenant.name},
        )
    else:
        form = MembershipRoleForm(request.POST, prefix=f"m{membership.pk}")
        if form.is_valid():
            _done(
                request,
                lambda: membership_update(
                    actor=request.user, membership=membership, role=form.cleaned_data["role"], request=request
                ),
                _("Role in %(tenant)s saved.") % {"tenant": membership.tenant.name},
            )
    return redirect("frontend:user-detail", pk=account.pk)


@require_POST
@section_required(Section.USERS)
@action_required(Action.TOKEN_REVOKE)
def user_token_revoke(request, pk: int, token_pk: int):
    """A security admin revokes someone's token (a leaked one)."""
    account = _user_or_404(request, pk)
    token = tenant_selectors.tokens_visible_to(request.user).filter(user=account, pk=token_pk).first()
    if token is None:
        raise Http404
    _done(
        request,
        lambda: api_token_revoke(actor=request.user, token=token, request=request),
        _("Token “%(name)s” revoked; it no longer works.") % {"name": token.name},
    )
    return redirect("frontend:user-detail", pk=account.pk)


# --- sign-in lockouts ---------------------------------------------------------------------------------------


@section_required(Section.LOCKOUTS)
def lockout_list(request):
    cool_off = tenant_selectors.auth_lockout_cool_off()
    attempts = list(tenant_selectors.auth_lockouts_visible_to(request.user))
    known = dict(
        tenant_selectors.users_visible_to(request.user)
        .filter(username__in={a.username for a in attempts if a.username})
        .values_list("username", "pk")
    )
    for attempt in attempts:
        attempt.locked_until = attempt.attempt_time + cool_off if cool_off is not None else None
        # Failures for a username nobody has are shown too (someone guessing names), without a link.
        attempt.account_pk = known.get(attempt.username)
    context = {
        "section": Section.LOCKOUTS,
        "locked": [a for a in attempts if a.locked],
        "failing": [a for a in attempts if not a.locked],
        "cool_off_minutes": int(cool_off.total_seconds() // 60) if cool_off is not None else None,
    }
    return render(request, "frontend/admin/lockouts.html", context)


@require_POST
@section_required(Section.LOCKOUTS)
@action_required(Action.LOCKOUT_RESET)
def lockout_reset(request, pk: int):
    try:
        attempt = tenant_selectors.auth_lockout_get_visible(user=request.user, pk=pk)
    except NotFoundError:
        messages.error(request, _("That lockout has already expired or been lifted."))
        return redirect("frontend:lockouts")
    _done(
        request,
        lambda: identity.auth_lockout_reset(actor=request.user, attempt=attempt, request=request),
        _("Lockout of %(name)s from %(ip)s lifted; they may sign in again.")
        % {"name": attempt.username or "—", "ip": attempt.ip_address or "—"},
    )
    # From an account's page, back to it; from the list, back to the list.
    account = tenant_selectors.users_visible_to(request.user).filter(username=attempt.username).first()
    if request.POST.get("back") == "account" and account is not None:
        return redirect("frontend:user-detail", pk=account.pk)
    return redirect("frontend:lockouts")
