"""Bad input is a 400 (or 413) with the {"code", "detail"} shape, and changes nothing."""

from __future__ import annotations

import pytest
from django.test import override_settings

from tenants.models import Tenant, User
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def test_unknown_field_is_rejected(world):
    response = world.client("system_admin").post(
        "/api/v1/tenants/", {"name": "X", "slug": "x", "colour": "red"}, format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid" and "colour" in body["errors"] and "Unknown field" in body["detail"]
    assert not Tenant.objects.filter(slug="x").exists()


def test_cycle_through_api_is_400(world):
    response = world.client("system_admin").patch(
        f"/api/v1/tenants/{world.acme.pk}/", {"parent": world.vision.pk}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "tenant_cycle"
    world.acme.refresh_from_db()
    assert world.acme.parent is None


def test_depth_over_limit_through_api_is_400(world):
    leaf = TenantFactory(parent=world.vision)
    response = world.client("system_admin").post(
        "/api/v1/tenants/", {"name": "Deep", "slug": "deep", "parent": leaf.pk}, format="json"
    )
    assert response.status_code == 400 and response.json()["code"] == "tenant_too_deep"


def test_moved_subtree_too_deep_through_api_is_400(world):
    leaf = TenantFactory(parent=world.globex_team)
    response = world.client("system_admin").patch(
        f"/api/v1/tenants/{world.research.pk}/", {"parent": leaf.pk}, format="json"
    )
    assert response.status_code == 400 and "depth 5" in response.json()["detail"]


def test_duplicate_name_through_api_is_400(world):
    response = world.client("system_admin").post(
        "/api/v1/tenants/", {"name": "NLP", "slug": "nlp-2", "parent": world.research.pk}, format="json"
    )
    assert response.status_code == 400 and response.json()["code"] == "duplicate"


def test_non_object_body_is_400(world):
    response = world.client("system_admin").post("/api/v1/tenants/", [1, 2], format="json")
    assert response.status_code == 400 and response.json()["code"] == "invalid"


def test_malformed_json_is_400(world):
    response = world.client("system_admin").post("/api/v1/tenants/", "{not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] == "parse_error"


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_oversized_body_is_413_with_error_shape(world):
    response = world.client("system_admin").post("/api/v1/tenants/", {"name": "x" * 5000, "slug": "big"}, format="json")
    assert response.status_code == 413
    assert response.json()["code"] == "request_too_large"
    assert not Tenant.objects.filter(slug="big").exists()


def test_weak_password_is_400(world):
    response = world.client("security_admin").post(
        "/api/v1/users/", {"username": "weak", "password": "123"}, format="json"
    )
    assert response.status_code == 400 and response.json()["code"] == "weak_password"
    assert not User.objects.filter(username="weak").exists()


def test_second_platform_role_is_refused(world):
    auditor = world.users["auditor"]
    response = world.client("security_admin").patch(
        f"/api/v1/users/{auditor.pk}/", {"platform_role": "system_admin"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "separation_of_duties"
    auditor.refresh_from_db()
    assert auditor.platform_role == "auditor"


def test_security_admin_cannot_change_own_role(world):
    me = world.users["security_admin"]
    response = world.client("security_admin").patch(f"/api/v1/users/{me.pk}/", {"platform_role": ""}, format="json")
    assert response.status_code == 400 and "your own platform role" in response.json()["detail"]


def test_auditor_cannot_be_a_tenant_member(world):
    response = world.client("security_admin").post(
        "/api/v1/memberships/", {"tenant": world.vision.pk, "username": "aud"}, format="json"
    )
    # Said exactly as for a username that does not exist (no enumeration of accounts or platform roles).
    assert response.status_code == 400 and response.json()["code"] == "cannot_add_member"
