"""REST endpoints of quotas, approvals, notifications, prices and usage: roles, isolation, exports."""

from __future__ import annotations

import csv
import datetime as dt
import io

import pytest
from django.utils import timezone
from openpyxl import load_workbook

from scheduler.models import Allocation
from tenants.models import ApprovalStatus, MembershipRole, NotificationDelivery, Quota
from tenants.services.quotas import flavor_price_set, quota_set
from tests.factories import MembershipFactory, UserFactory
from tests.scheduler.factories import DeviceFactory, FlavorFactory, JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def flavor(world):
    flavor = FlavorFactory()
    quota_set(actor=None, tenant=world.acme, flavor=flavor, values={"guaranteed_millis": 8000})
    quota_set(actor=None, tenant=world.research, flavor=flavor, values={"guaranteed_millis": 6000})
    quota_set(actor=None, tenant=world.vision, flavor=flavor, values={"guaranteed_millis": 2000})
    quota_set(actor=None, tenant=world.globex, flavor=flavor, values={"guaranteed_millis": 4000})
    vision_admin = UserFactory(username="vadmin")
    MembershipFactory(user=vision_admin, tenant=world.vision, role=MembershipRole.TENANT_ADMIN)
    world.users["vision_admin"] = vision_admin
    return flavor


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        ("member", {"acme-vision"}),
        ("tenant_admin", {"acme-research", "acme-vision"}),
        ("auditor", {"acme", "acme-research", "acme-vision", "globex"}),
    ],
)
def test_quota_list_is_scoped_to_visible_tenants(world, flavor, role, expected):
    body = world.client(role).get("/api/v1/quotas/").json()
    assert {row["tenant_slug"] for row in body["results"]} == expected


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        (None, 401),
        ("member", 403),
        ("viewer", 403),
        ("tenant_admin", 403),
        ("security_admin", 403),
        ("auditor", 403),
        ("system_admin", 200),
    ],
)
def test_only_system_admin_sets_quota_directly(world, flavor, role, expected):
    body = {"tenant": world.nlp.pk, "flavor": flavor.name, "guaranteed_millis": 1000}
    response = world.client(role).post("/api/v1/quotas/", body, format="json")
    if role in ("member", "viewer"):
        expected = 404  # nlp is not visible to vision's members
    assert response.status_code == expected, response.content
    assert Quota.objects.filter(tenant=world.nlp).exists() == (expected == 200)


def test_quota_violation_names_tenant_and_numbers(world, flavor):
    body = {"tenant": world.nlp.pk, "flavor": flavor.name, "guaranteed_millis": 4500}
    response = world.client("system_admin").post("/api/v1/quotas/", body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "quota_exceeds_parent"
    assert "acme-research" in response.json()["detail"] and "6500" in response.json()["detail"]


def test_quota_usage_endpoint_and_isolation(world, flavor):
    response = world.client("member").get(f"/api/v1/tenants/{world.vision.pk}/quota-usage/")
    assert response.status_code == 200
    [row] = response.json()
    assert row["flavor"] == flavor.name and row["guaranteed"] == 2000 and row["in_use"] == 0
    assert world.client("member").get(f"/api/v1/tenants/{world.globex.pk}/quota-usage/").status_code == 404


def test_quota_change_workflow_over_the_api(world, flavor):
    body = {"tenant": world.vision.pk, "flavor": flavor.name, "guaranteed_millis": 3000, "reason": "more GPUs"}
    created = world.client("vision_admin").post("/api/v1/approvals/quota-change/", body, format="json")
    assert created.status_code == 201, created.content
    approval_id = created.json()["id"]
    assert created.json()["awaiting_role"] == "parent_tenant_admin"

    own = world.client("vision_admin").post(f"/api/v1/approvals/{approval_id}/approve/", {}, format="json")
    assert own.status_code == 403
    inbox = world.client("tenant_admin").get("/api/v1/approvals/", {"awaiting_me": "true"}).json()
    assert [a["id"] for a in inbox["results"]] == [approval_id]

    step1 = world.client("tenant_admin").post(
        f"/api/v1/approvals/{approval_id}/approve/", {"comment": "ok"}, format="json"
    )
    assert step1.status_code == 200 and step1.json()["awaiting_role"] == "system_admin"
    final = world.client("system_admin").post(f"/api/v1/approvals/{approval_id}/approve/", {}, format="json")
    assert final.status_code == 200 and final.json()["status"] == ApprovalStatus.APPROVED
    assert [s["decision"] for s in final.json()["steps"]] == ["approve", "approve"]
    assert Quota.objects.get(tenant=world.vision).guaranteed_millis == 3000
    again = world.client("system_admin").post(f"/api/v1/approvals/{approval_id}/approve/", {}, format="json")
    assert again.status_code == 409


def test_member_cannot_request_and_outsider_cannot_see_request(world, flavor):
    body = {"tenant": world.vision.pk, "flavor": flavor.name, "guaranteed_millis": 3000}
    assert world.client("member").post("/api/v1/approvals/quota-change/", body, format="json").status_code == 403
    approval = world.client("vision_admin").post("/api/v1/approvals/quota-change/", body, format="json").json()
    outsider = world.client("outsider")
    assert outsider.get(f"/api/v1/approvals/{approval['id']}/").status_code == 404
    assert (
        outsider.post(f"/api/v1/approvals/{approval['id']}/reject/", {"comment": "x"}, format="json").status_code == 404
    )
    assert outsider.get("/api/v1/approvals/").json()["count"] == 0


def test_auditor_reads_approvals_but_cannot_decide(world, flavor):
    body = {"tenant": world.vision.pk, "flavor": flavor.name, "guaranteed_millis": 3000}
    approval = world.client("vision_admin").post("/api/v1/approvals/quota-change/", body, format="json").json()
    auditor = world.client("auditor")
    assert auditor.get(f"/api/v1/approvals/{approval['id']}/").status_code == 200
    assert auditor.post(f"/api/v1/approvals/{approval['id']}/approve/", {}, format="json").status_code == 403


def test_request_with_unknown_field_is_400(world, flavor):
    body = {"tenant": world.vision.pk, "flavor": flavor.name, "guaranted_millis": 3000}
    response = world.client("vision_admin").post("/api/v1/approvals/quota-change/", body, format="json")
    assert response.status_code == 400 and "guaranted_millis" in response.json()["errors"]


def test_notifications_are_for_platform_admins(world, flavor):
    body = {"tenant": world.vision.pk, "flavor": flavor.name, "guaranteed_millis": 3000}
    world.client("vision_admin").post("/api/v1/approvals/quota-change/", body, format="json")
    assert NotificationDelivery.objects.count() == 1
    assert world.client("system_admin").get("/api/v1/notifications/").json()["count"] == 1
    # No notification.view rule for a tenant role: a 403, not an empty list (docs/permissions.md).
    assert world.client("tenant_admin").get("/api/v1/notifications/").status_code == 403


def _allocation(tenant, flavor, *, user, hours_ago: float, ended_hours_ago: float | None, millis: int = 500):
    now = timezone.now()
    device = DeviceFactory(flavor=flavor)
    return Allocation.objects.create(
        job=JobFactory(tenant=tenant, submitter=user),
        replica=0,
        tenant=tenant,
        flavor=flavor,
        device=device,
        node=device.node,
        millis=millis,
        memory_mib=1024,
        started_at=now - dt.timedelta(hours=hours_ago),
        ended_at=None if ended_hours_ago is None else now - dt.timedelta(hours=ended_hours_ago),
    )


def test_usage_report_json_csv_and_xlsx(world, flavor):
    flavor_price_set(actor=None, flavor=flavor, price_per_device_hour="10.00")
    _allocation(world.vision, flavor, user=world.users["member"], hours_ago=4, ended_hours_ago=2)  # 0.5 x 2h
    _allocation(world.globex_team, flavor, user=world.users["outsider"], hours_ago=3, ended_hours_ago=1)
    start = (timezone.now() - dt.timedelta(days=1)).isoformat()
    end = (timezone.now() + dt.timedelta(hours=1)).isoformat()
    client = world.client("tenant_admin")
    body = client.get("/api/v1/usage/", {"start": start, "end": end, "period": "month"}).json()
    rolled = {(row["tenant"]): row for row in body["tenants"]}
    assert set(rolled) == {"acme-research", "acme-vision"}  # acme (parent) and globex are not visible
    assert float(rolled["acme-vision"]["own_device_hours"]) == pytest.approx(1.0, abs=0.01)
    assert float(rolled["acme-research"]["subtree_device_hours"]) == pytest.approx(1.0, abs=0.01)
    assert float(rolled["acme-research"]["subtree_cost"]) == pytest.approx(10.0, abs=0.1)
    assert [row["user"] for row in body["rows"]] == ["vmember"]

    response = client.get("/api/v1/usage/", {"start": start, "end": end, "export": "csv", "detail": "true"})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows[0]["tenant"] == "acme-vision" and rows[0]["user"] == "vmember"

    response = client.get("/api/v1/usage/", {"start": start, "end": end, "export": "xlsx"})
    workbook = load_workbook(io.BytesIO(response.content))
    assert workbook.sheetnames == ["tenants", "detail", "about"]
    assert workbook["tenants"]["B1"].value == "tenant"


def test_usage_report_bad_range_is_400(world):
    response = world.client("member").get(
        "/api/v1/usage/", {"start": "2026-12-02T00:00:00Z", "end": "2026-12-01T00:00:00Z"}
    )
    assert response.status_code == 400 and "after" in response.json()["detail"]


def test_flavor_price_set_by_system_admin_only(world, flavor):
    body = {"flavor": flavor.name, "price_per_device_hour": "12.5"}
    assert world.client("tenant_admin").post("/api/v1/flavor-prices/", body, format="json").status_code == 403
    response = world.client("system_admin").post("/api/v1/flavor-prices/", body, format="json")
    assert response.status_code == 200 and response.json()["price_per_device_hour"] == "12.5000"


@pytest.mark.parametrize("role", ["member", "viewer", "tenant_admin", "vision_admin"])
def test_quota_and_approval_objects_of_another_tenant_are_not_found(world, flavor, role):
    globex_admin = UserFactory(username="gadmin")
    MembershipFactory(user=globex_admin, tenant=world.globex, role=MembershipRole.TENANT_ADMIN)
    from tenants.services.approvals import quota_change_request_create

    approval = quota_change_request_create(
        actor=globex_admin, tenant=world.globex_team, flavor=flavor, values={"guaranteed_millis": 1000}
    )
    quota = Quota.objects.get(tenant=world.globex)
    client = world.client(role)
    day = "2026-11-01T00:00:00Z"
    requests = [
        ("get", f"/api/v1/quotas/{quota.pk}/", None),
        ("get", f"/api/v1/tenants/{world.globex.pk}/quota-usage/", None),
        ("post", f"/api/v1/tenants/{world.globex.pk}/approval-threshold/", {"threshold_millis": 1}),
        ("post", "/api/v1/quotas/", {"tenant": world.globex.pk, "flavor": flavor.name, "guaranteed_millis": 0}),
        ("get", f"/api/v1/approvals/{approval.pk}/", None),
        ("post", f"/api/v1/approvals/{approval.pk}/approve/", {}),
        ("post", f"/api/v1/approvals/{approval.pk}/reject/", {"comment": "no"}),
        ("post", f"/api/v1/approvals/{approval.pk}/cancel/", {}),
        (
            "post",
            "/api/v1/approvals/quota-change/",
            {"tenant": world.globex_team.pk, "flavor": flavor.name, "guaranteed_millis": 100},
        ),
        ("get", f"/api/v1/usage/?start={day}&end=2026-11-02T00:00:00Z&tenant={world.globex.pk}", None),
    ]
    for method, url, body in requests:
        response = (
            getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)
        )
        assert response.status_code == 404, (method, url, response.content)
        assert "globex" not in response.content.decode().lower()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert Quota.objects.get(tenant=world.globex).guaranteed_millis == 4000
