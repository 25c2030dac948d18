"""Second factor for platform roles in the console.

After the password step, a system admin, security admin or auditor who has a confirmed TOTP device must
enter a code before any other page (or session-authenticated API call) works. With
``GPUPOOL_MFA_REQUIRED`` on, platform-role accounts without a device are sent to enrolment first.
Bearer-token API calls are not affected: a token is its own credential, created from a verified session.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django_otp import user_has_device

from tenants.permissions import has_platform_role

EXEMPT_PREFIXES = ("/accounts/otp/", "/accounts/logout/", "/static/", "/healthz", "/i18n/")


class RequireSecondFactorMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        blocked = self._blocked(request)
        return blocked if blocked is not None else self.get_response(request)

    def _blocked(self, request: HttpRequest) -> HttpResponse | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or not has_platform_role(user):
            return None
        if getattr(user, "is_verified", lambda: False)():
            return None
        if request.path.startswith(EXEMPT_PREFIXES):
            return None
        if user_has_device(user, confirmed=True):
            url_name, detail = "otp-verify", "Enter your two-factor code first (at /accounts/otp/verify/)."
        elif getattr(settings, "GPUPOOL_MFA_REQUIRED", False):
            url_name, detail = "otp-enrol", "Enrol a two-factor device first (at /accounts/otp/enrol/)."
        else:
            return None
        if request.path.startswith("/api/"):
            return JsonResponse({"code": "mfa_required", "detail": detail}, status=401)
        return redirect(f"{reverse(url_name)}?{urlencode({'next': request.get_full_path()})}")
