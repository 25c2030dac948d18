"""Personal API tokens: shown once, stored hashed, expiring, revocable, scoped, last use recorded."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tenants.models import ApiToken
from tests.factories import ApiTokenFactory, UserFactory, bearer
from tests.tenants.conftest import audited

pytestmark = pytest.mark.django_db


def test_create_shows_secret_once_and_stores_only_its_hash(world):
    client = world.client("member")
    response = client.post("/api/v1/tokens/", {"name": "ci", "scope": "write"}, format="json")
    assert response.status_code == 201, response.content
    secret = response.json()["secret"]
    assert secret.startswith("gp_")
    token = ApiToken.objects.get(pk=response.json()["id"])
    assert token.key_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(ApiToken.objects.filter(pk=token.pk).values().get())
    listed = client.get(f"/api/v1/tokens/{token.pk}/").json()
    assert "secret" not in listed and listed["key_prefix"] == token.key_prefix
    assert (token.expires_at - timezone.now()).days in (89, 90)
    [event] = audited("token.create")
    assert event["details"]["after"]["scope"] == "write" and secret not in str(event)


def test_token_authenticates_and_records_last_use(world):
    token = ApiTokenFactory(user=world.users["member"], scope="read")
    response = APIClient().get("/api/v1/me/", headers=bearer(token))
    assert response.status_code == 200 and response.json()["username"] == "vmember"
    token.refresh_from_db()
    assert token.last_used_at is not None


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"expires_at": dt.timedelta(seconds=-1)}, "token_expired"),
        ({"revoked_at": dt.timedelta(0)}, "token_revoked"),
    ],
)
def test_expired_or_revoked_token_is_401_with_clear_code(world, change, code):
    token = ApiTokenFactory(user=world.users["member"])
    for field, offset in change.items():
        setattr(token, field, timezone.now() + offset)
    token.save()
    response = APIClient().get("/api/v1/me/", headers=bearer(token))
    assert response.status_code == 401
    assert response.json()["code"] == code
    assert "create a new one" in response.json()["detail"]


@pytest.mark.parametrize("header", ["Bearer gp_deadbeef_nope", "Bearer nonsense", "Bearer a b"])
def test_unknown_or_malformed_token_is_401(header):
    response = APIClient().get("/api/v1/me/", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response.json()["code"] == "token_invalid"


def test_token_of_deactivated_user_is_401(world):
    token = ApiTokenFactory(user=world.users["member"])
    world.users["member"].is_active = False
    world.users["member"].save()
    assert APIClient().get("/api/v1/me/", headers=bearer(token)).status_code == 401


def test_revoke_through_api_then_token_stops_working(world):
    token = ApiTokenFactory(user=world.users["member"])
    client = APIClient()
    assert client.delete(f"/api/v1/tokens/{token.pk}/", headers=bearer(token)).status_code == 204
    response = client.get("/api/v1/me/", headers=bearer(token))
    assert response.status_code == 401 and response.json()["code"] == "token_revoked"
    assert audited("token.revoke")[0]["actor_username"] == "vmember"


def test_read_scope_allows_only_safe_methods(world):
    token = ApiTokenFactory(user=world.users["tenant_admin"], scope="read")
    client = APIClient()
    assert client.get("/api/v1/tenants/", headers=bearer(token)).status_code == 200
    response = client.patch(
        f"/api/v1/tenants/{world.vision.pk}/", {"description": "x"}, format="json", headers=bearer(token)
    )
    assert response.status_code == 403
    assert "scope" in response.json()["detail"]


def test_write_scope_allows_changes_but_not_admin_operations(world):
    tenant_admin = ApiTokenFactory(user=world.users["tenant_admin"], scope="write")
    security = ApiTokenFactory(user=world.users["security_admin"], scope="write")
    client = APIClient()
    ok = client.patch(
        f"/api/v1/tenants/{world.vision.pk}/", {"description": "x"}, format="json", headers=bearer(tenant_admin)
    )
    assert ok.status_code == 200
    body = {"username": "viatoken", "password": "a-long-enough-passphrase"}
    assert client.post("/api/v1/users/", body, format="json", headers=bearer(security)).status_code == 403
    admin = ApiTokenFactory(user=world.users["security_admin"], scope="admin")
    assert client.post("/api/v1/users/", body, format="json", headers=bearer(admin)).status_code == 201


def test_only_platform_admins_create_admin_tokens(world):
    response = world.client("tenant_admin").post("/api/v1/tokens/", {"name": "x", "scope": "admin"}, format="json")
    assert response.status_code == 400 and "admin-scoped" in response.json()["detail"]


def test_tokens_of_others_are_not_found(world):
    other = ApiTokenFactory(user=UserFactory())
    client = world.client("member")
    assert client.get(f"/api/v1/tokens/{other.pk}/").status_code == 404
    assert client.delete(f"/api/v1/tokens/{other.pk}/").status_code == 404
    assert client.get("/api/v1/tokens/").json()["count"] == 0
    other.refresh_from_db()
    assert other.revoked_at is None


def test_security_admin_revokes_anyones_token(world):
    other = ApiTokenFactory(user=world.users["member"])
    assert world.client("security_admin").delete(f"/api/v1/tokens/{other.pk}/").status_code == 204
    other.refresh_from_db()
    assert other.revoked_at is not None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "x", "expires_at": "2999-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "x", "scope": "root"}, "scope"),
        ({"name": "x", "scopes": "read"}, "scopes"),
    ],
)
def test_bad_token_requests_are_400_and_create_nothing(world, body, field):
    response = world.client("member").post("/api/v1/tokens/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] in ("invalid",) and field in response.json()["errors"]
    assert ApiToken.objects.count() == 0


def test_duplicate_token_name_is_400(world):
    ApiTokenFactory(user=world.users["member"], name="ci")
    response = world.client("member").post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "duplicate"


def test_filter_active_tokens(world):
    ApiTokenFactory(user=world.users["member"], name="live")
    ApiTokenFactory(user=world.users["member"], name="dead", revoked_at=timezone.now())
    body = world.client("member").get("/api/v1/tokens/", {"active": "true"}).json()
    assert [t["name"] for t in body["results"]] == ["live"]


def test_read_token_lists_admin_resources_but_write_token_cannot_administer(world):
    read = ApiTokenFactory(user=world.users["security_admin"], scope="read")
    assert APIClient().get("/api/v1/users/", headers=bearer(read)).status_code == 200
    write = ApiTokenFactory(user=world.users["system_admin"], scope="write")
    body = {"tenant": world.vision.pk, "flavor": "sim-80g", "guaranteed_millis": 1000}
    response = APIClient().post("/api/v1/quotas/", body, format="json", headers=bearer(write))
    assert response.status_code == 403 and "scope" in response.json()["detail"]
