"""Console pages for two-factor sign-in: verify a code after the password, and enrol a TOTP device."""

from __future__ import annotations

from base64 import b32encode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django_otp import login as otp_login
from django_otp import match_token, user_has_device
from django_otp.plugins.otp_totp.models import TOTPDevice

from kernel.api import DomainError
from tenants.services.identity import mfa_totp_begin, mfa_totp_confirm, mfa_verified


def _next_url(request: HttpRequest) -> str:
    candidate = request.POST.get("next") or request.GET.get("next") or "/"
    if url_has_allowed_host_and_scheme(candidate, allowed_hosts={request.get_host()}):
        return candidate
    return "/"


@login_required
def otp_verify(request: HttpRequest) -> HttpResponse:
    error = ""
    if request.method == "POST":
        device = match_token(request.user, request.POST.get("otp_token", "").strip())
        mfa_verified(user=request.user, success=device is not None, request=request)
        if device is not None:
            otp_login(request, device)
            return redirect(_next_url(request))
        error = _("That code is not valid; enter the current code from your authenticator app.")
    return render(request, "tenants/otp_verify.html", {"error": error, "next": _next_url(request)}, status=200)


@login_required
def otp_enrol(request: HttpRequest) -> HttpResponse:
    user = request.user
    # Someone with only the password must not replace the existing device: verify it first.
    if user_has_device(user, confirmed=True) and not user.is_verified():
        return redirect(f"/accounts/otp/verify/?next={request.path}")
    error = ""
    device = None
    if request.method == "POST":
        device = TOTPDevice.objects.filter(user=user, confirmed=False, pk=request.POST.get("device", 0) or 0).first()
        if device is None:
            error = _("The enrolment expired; start again.")
        else:
            try:
                mfa_totp_confirm(actor=user, device=device, otp=request.POST.get("otp_token", ""), request=request)
            except DomainError as exc:
                error = exc.message
            else:
                otp_login(request, device)
                messages.success(request, _("Two-factor sign-in is on for your account."))
                return redirect(_next_url(request))
    if device is None:
        device = mfa_totp_begin(actor=user, user=user, request=request)
    context = {
        "device": device,
        "secret": b32encode(device.bin_key).decode(),
        "config_url": device.config_url,
        "error": error,
        "next": _next_url(request),
    }
    return render(request, "tenants/otp_enrol.html", context)
