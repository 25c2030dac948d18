"""Optional single sign-on through an OpenID Connect provider (mozilla-django-oidc).

Enabled only when the ``GPUPOOL_OIDC_*`` variables are set (see README). New users arrive without roles:
a security admin grants platform roles, tenant admins add them to tenants. Accounts are matched by the
``preferred_username`` claim (falling back to the e-mail address).
"""

from __future__ import annotations

from typing import Any

from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from tenants.models import User
from tenants.services.identity import user_create


def _username_from(claims: dict[str, Any]) -> str:
    return str(claims.get("preferred_username") or claims.get("email") or claims.get("sub", ""))[:150]


class GpupoolOIDCBackend(OIDCAuthenticationBackend):
    def filter_users_by_claims(self, claims: dict[str, Any]):
        username = _username_from(claims)
        if not username:
            return User.objects.none()
        return User.objects.filter(username__iexact=username)

    def create_user(self, claims: dict[str, Any]) -> User:
        return user_create(
            actor=None,
            username=_username_from(claims),
            password=None,
            email=str(claims.get("email", "")),
            first_name=str(claims.get("given_name", ""))[:150],
            last_name=str(claims.get("family_name", ""))[:150],
        )

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        return user
