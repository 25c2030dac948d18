"""API authentication: ``Authorization: Bearer gp_...`` personal tokens, and the sign-in backends."""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from rest_framework import authentication, exceptions

from tenants.models import ApiToken, User


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer gp_<prefix>_<secret>``. Expired, revoked or unknown tokens get a 401 with a
    ``code`` saying which (``token_expired``, ``token_revoked``, ``token_invalid``); ``request.auth`` is the
    ApiToken so ``PolicyPermission`` can check its scope."""

    keyword = "Bearer"

    def authenticate(self, request) -> tuple[User, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if parts[0].lower() != self.keyword.lower():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Invalid Authorization header; send 'Authorization: Bearer gp_…'.", code="token_invalid"
            )
        # Imported here: DRF loads this class while rest_framework.views is still importing.
        from tenants.services.tokens import TokenRejected, api_token_authenticate

        try:
            token = api_token_authenticate(raw=parts[1])
        except TokenRejected as exc:
            raise exceptions.AuthenticationFailed(str(exc), code=exc.code) from None
        return token.user, token

    def authenticate_header(self, request) -> str:
        return f'{self.keyword} realm="gpupool"'


class LockoutBackend(AxesStandaloneBackend):
    """django-axes' lockout check for sign-ins that come with a request (the console, OIDC callbacks).

    Calls without a request (``Client.login`` in tests, scripts) cannot be attributed to an address and are
    not counted; every sign-in over HTTP has a request.
    """

    def authenticate(self, request, username: str | None = None, password: str | None = None, **kwargs: Any):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
