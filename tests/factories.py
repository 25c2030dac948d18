"""Shared factory_boy factories. Other areas import these (``from tests.factories import UserFactory``).

They write rows directly (fast, no audit records); tests of behaviour that must be audited build that state
through the services instead.
"""

from __future__ import annotations

import datetime as dt
import functools

import factory
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.utils import timezone
from rest_framework.test import APIClient

from tenants.models import ApiToken, Membership, MembershipRole, PlatformRole, Tenant, TenantKind, TokenScope, User

TEST_PASSWORD = "correct-horse-battery-staple"


def test_password_hash() -> str:
    """The hash of TEST_PASSWORD under the hashers in force (Argon2, or a fast one a test module sets), computed
    once per run for each: a hash cached under one module's hashers does not verify under another's."""
    return _password_hash(tuple(settings.PASSWORD_HASHERS))


@functools.cache
def _password_hash(hashers: tuple[str, ...]) -> str:
    return make_password(TEST_PASSWORD)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.com")
    platform_role = PlatformRole.NONE
    # Argon2 is deliberately slow; hash the shared test password once, not once per user.
    password = factory.LazyFunction(lambda: test_password_hash())


class SystemAdminFactory(UserFactory):
    username = factory.Sequence(lambda n: f"sysadmin{n}")
    platform_role = PlatformRole.SYSTEM_ADMIN


class SecurityAdminFactory(UserFactory):
    username = factory.Sequence(lambda n: f"secadmin{n}")
    platform_role = PlatformRole.SECURITY_ADMIN


class AuditorFactory(UserFactory):
    username = factory.Sequence(lambda n: f"auditor{n}")
    platform_role = PlatformRole.AUDITOR


class TenantFactory(factory.django.DjangoModelFactory):
    """A tenant; pass ``parent=`` for a child (its depth follows the parent's)."""

    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")
    kind = TenantKind.TEAM
    parent = None
    depth = factory.LazyAttribute(lambda tenant: 1 if tenant.parent is None else tenant.parent.depth + 1)


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = MembershipRole.MEMBER


class ApiTokenFactory(factory.django.DjangoModelFactory):
    """An API token row. The secret is on ``token.secret`` (set by ``create``), as the API would show it."""

    class Meta:
        model = ApiToken

    user = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"token-{n}")
    scope = TokenScope.WRITE
    expires_at = factory.LazyFunction(lambda: timezone.now() + dt.timedelta(days=30))
    key_prefix = ""
    key_sha256 = ""

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        from tenants.services.tokens import _new_token_secret, token_hash

        prefix, raw = _new_token_secret()
        kwargs["key_prefix"] = prefix
        kwargs["key_sha256"] = token_hash(raw)
        token = super()._create(model_class, *args, **kwargs)
        token.secret = raw
        return token


def bearer(token: ApiToken) -> dict[str, str]:
    """Headers for an API call with ``token`` (``client.get(url, headers=bearer(token))``)."""
    return {"Authorization": f"Bearer {token.secret}"}


def client_for(user: User | None) -> APIClient:
    """An API client signed in as ``user`` (no token: ``force_authenticate``); anonymous for None."""
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client
