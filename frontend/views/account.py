"""Your API tokens: list, create (the secret is shown on that one page and never again), revoke.

Every signed-in person has this page, whatever their role: the scopes offered are those their role allows
(``tenants.permissions.token_scopes_allowed``), and the service checks again.
"""

from __future__ import annotations

import datetime as dt

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import check_for_language
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from django.views.i18n import set_language

from frontend.access import Section, action_required, section_required
from frontend.admin_forms import TokenCreateForm, attach_domain_error
from frontend.service_text import localize
from kernel.access_rules import Action
from kernel.api import DomainError, NotFoundError
from tenants import selectors as tenant_selectors
from tenants.models import TOKEN_PREFIX
from tenants.permissions import token_scopes_allowed
from tenants.services.identity import user_language_set
from tenants.services.tokens import api_token_create, api_token_revoke


@never_cache
@section_required(Section.ACCOUNT)
def token_list(request):
    """The page and the create form. A successful create answers this page directly (no redirect), with the
    secret in it once: the secret is not kept anywhere, so a reload cannot show it again."""
    scopes = token_scopes_allowed(request.user)
    form = TokenCreateForm(scopes=scopes, prefix="t")
    created = None
    if request.method == "POST":
        form = TokenCreateForm(request.POST, scopes=scopes, prefix="t")
        if form.is_valid():
            data = form.cleaned_data
            try:
                token, secret = api_token_create(
                    actor=request.user,
                    name=data["name"],
                    scope=data["scope"],
                    expires_at=timezone.now() + dt.timedelta(days=data["lifetime_days"]),
                    request=request,
                )
            except DomainError as exc:
                attach_domain_error(form, exc, {"expires_at": "lifetime_days"})
            else:
                created = {"token": token, "secret": secret}
                form = TokenCreateForm(scopes=scopes, prefix="t")
    context = {
        "section": Section.ACCOUNT,
        "tokens": tenant_selectors.tokens_visible_to(request.user).filter(user=request.user),
        "form": form,
        "created": created,
        "token_prefix": TOKEN_PREFIX,
        "now": timezone.now(),
    }
    return render(request, "frontend/account/tokens.html", context)


@require_POST
@section_required(Section.ACCOUNT)
@action_required(Action.TOKEN_REVOKE)
def token_revoke(request, pk: int):
    """Revoke a token (the policy's token.revoke: your own; a security admin any, usually from the account
    page of its owner)."""
    try:
        token = tenant_selectors.token_get_visible(user=request.user, pk=pk)
    except NotFoundError:
        raise Http404 from None
    try:
        api_token_revoke(actor=request.user, token=token, request=request)
    except DomainError as exc:
        messages.error(request, localize(exc.message))
    else:
        messages.success(request, _("Token “%(name)s” revoked; it no longer works.") % {"name": token.name})
    return redirect("frontend:tokens")


def language_set(request):
    """The language menu (Django's ``set_language``, the same form and cookie) that also remembers the choice of a
    signed-in person, so their notifications are written in the language their console shows."""
    response = set_language(request)
    language = request.POST.get("language", "")
    if request.method == "POST" and request.user.is_authenticated and check_for_language(language):
        user_language_set(user=request.user, language=language)
    return response
