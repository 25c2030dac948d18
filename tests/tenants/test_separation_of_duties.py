"""Separation of duties as invariants (issue 15, item 2), each attack from the issue as a regression test:
a platform account holds no tenant membership and a member gets no platform role, a token mints nothing
wider or longer-lived than itself, "cannot add" reads like "no such user", and the admin changes nothing."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from kernel.api import DomainError, PermissionDeniedError
from tenants.models import ApiToken, Membership, PlatformRole, Tenant
from tenants.services.identity import user_set_platform_role
from tenants.services.memberships import membership_create
from tenants.services.tokens import api_token_create
from tests.factories import (
    ApiTokenFactory,
    AuditorFactory,
    SecurityAdminFactory,
    SystemAdminFactory,
    UserFactory,
    bearer,
)

pytestmark = pytest.mark.django_db


def _api(user, scope: str = "admin") -> APIClient:
    client = APIClient()
    client.credentials(**{"HTTP_AUTHORIZATION": bearer(ApiTokenFactory(user=user, scope=scope))["Authorization"]})
    return client


def test_a_security_admin_cannot_make_himself_or_the_system_admin_a_tenant_admin(world):
    security, system = SecurityAdminFactory(), SystemAdminFactory()
    api = _api(security)
    for user in (security, system):
        response = api.post(
            "/api/v1/memberships/", {"tenant": world.vision.pk, "user": user.pk, "role": "tenant_admin"}, format="json"
        )
        assert response.status_code == 400, response.content
        assert response.json()["code"] == "cannot_add_member"
    assert not Membership.objects.filter(user__in=[security, system]).exists()


def test_a_member_cannot_be_given_a_platform_role(world):
    member = world.users["tenant_admin"]  # tenant admin of acme-research
    response = _api(SecurityAdminFactory()).patch(
        f"/api/v1/users/{member.pk}/", {"platform_role": "auditor"}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "separation_of_duties"
    member.refresh_from_db()
    assert member.platform_role == PlatformRole.NONE


def test_the_service_refuses_both_directions_too(world):
    with pytest.raises(DomainError, match="platform account holds no tenant membership"):
        user_set_platform_role(actor=None, user=world.users["member"], platform_role=PlatformRole.AUDITOR)
    with pytest.raises(DomainError) as refused:
        membership_create(actor=None, user=AuditorFactory(), tenant=world.vision)
    assert refused.value.code == "cannot_add_member"


@pytest.mark.parametrize("platform_role", [PlatformRole.SYSTEM_ADMIN, PlatformRole.SECURITY_ADMIN])
def test_a_write_token_cannot_mint_an_admin_token(world, platform_role):
    admin = SystemAdminFactory() if platform_role == PlatformRole.SYSTEM_ADMIN else SecurityAdminFactory()
    response = _api(admin, scope="write").post("/api/v1/tokens/", {"name": "wider", "scope": "admin"}, format="json")
    assert response.status_code == 403, response.content
    assert not ApiToken.objects.filter(user=admin, name="wider").exists()


def test_a_token_mints_only_tokens_that_expire_no_later_than_itself(world):
    user = world.users["member"]
    parent = ApiTokenFactory(user=user, scope="write", expires_at=timezone.now() + dt.timedelta(days=2))
    child, _secret = api_token_create(actor=user, name="child", scope="read", via_token=parent)
    assert child.expires_at <= parent.expires_at
    with pytest.raises(DomainError, match="expires no later"):
        api_token_create(
            actor=user,
            name="longer",
            scope="read",
            expires_at=parent.expires_at + dt.timedelta(days=1),
            via_token=parent,
        )
    with pytest.raises(PermissionDeniedError):
        api_token_create(actor=user, name="wider", scope="admin", via_token=parent)


def test_cannot_add_reads_exactly_like_no_such_user(world):
    api = _api(world.users["tenant_admin"], scope="write")
    other_tenant_user = world.users["outsider"]

    def add(**who):
        response = api.post("/api/v1/memberships/", {"tenant": world.vision.pk, "role": "member", **who}, format="json")
        return response.status_code, response.json()

    missing = add(username="nobody-here")
    platform = add(username=world.users["security_admin"].username)
    auditor = add(user=world.users["auditor"].pk)
    missing_by_id = add(user=999_999)
    assert missing == platform == auditor == missing_by_id
    assert missing[0] == 400
    # An ordinary user of another tenant may still be added (a tenant admin recruits people).
    assert add(user=other_tenant_user.pk)[0] == 201


def test_the_django_admin_changes_nothing(client, world):
    superuser = UserFactory(is_superuser=True, is_staff=True)
    client.force_login(superuser)
    grandchild = world.vision
    acme = world.acme
    response = client.post(
        f"/admin/tenants/tenant/{acme.pk}/change/",
        {"slug": "acme", "name": "ACME", "kind": "company", "parent": grandchild.pk},
    )
    assert response.status_code == 403
    assert Tenant.objects.get(pk=acme.pk).parent_id is None
    assert client.get("/admin/tenants/membership/add/").status_code == 403
    assert client.get(f"/admin/tenants/tenant/{acme.pk}/change/").status_code == 200  # looking is fine
