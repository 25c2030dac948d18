from __future__ import annotations

import pytest

from audit.services import audit_record
from scheduler.fleet.models import NodeStatus
from tenants.models import MembershipRole, PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    return client


def test_node_table_filters_by_status_and_flavor_from_the_url(admin_client):
    a100 = make_flavor("nvidia-a100-40g", memory_mib=40960)
    make_node("gpu-a", devices=2)
    make_node("gpu-b", devices=1, flavor=a100, status=NodeStatus.CORDONED)
    page = admin_client.get("/console/nodes/?status=cordoned").content.decode()
    assert "gpu-b" in page and "gpu-a" not in page
    page = admin_client.get("/console/nodes/?flavor=nvidia-a100-40g").content.decode()
    assert "gpu-b" in page and "gpu-a" not in page


def test_node_table_sorts_by_a_column(admin_client):
    make_node("alpha", devices=1)
    make_node("zulu", devices=3)
    page = admin_client.get("/console/nodes/?sort=-device_count").content.decode()
    assert page.index("zulu") < page.index("alpha")


def test_node_table_exports_csv_with_filters_applied(admin_client):
    make_node("gpu-a", devices=2)
    make_node("gpu-b", devices=1, status=NodeStatus.NOT_READY)
    response = admin_client.get("/console/nodes/?status=ready&export=csv")
    assert response["Content-Type"].startswith("text/csv")
    lines = response.content.decode().strip().splitlines()
    assert lines[0].startswith("Name,Status,Cards")
    assert len(lines) == 2 and lines[1].startswith("gpu-a,ready,2")


def test_node_page_has_a_live_chart_per_card(admin_client):
    node = make_node("gpu-a", devices=3)
    response = admin_client.get(f"/console/nodes/{node.pk}/")
    assert response.status_code == 200
    page = response.content.decode()
    for device in node.devices.all():
        assert f'data-device-chart="{device.uuid}"' in page
    assert 'id="node-devices"' in page


@pytest.mark.parametrize("role", [PlatformRole.AUDITOR, PlatformRole.SECURITY_ADMIN])
def test_nodes_are_hidden_from_platform_roles_that_do_not_run_the_pool(client, role):
    node = make_node("gpu-a")
    client.force_login(make_user(platform_role=role))
    assert client.get("/console/nodes/").status_code == 404
    assert client.get(f"/console/nodes/{node.pk}/").status_code == 404


def test_nodes_are_hidden_from_tenant_members(client):
    client.force_login(make_member(make_tenant(), role=MembershipRole.TENANT_ADMIN))
    assert client.get("/console/nodes/").status_code == 404


def test_audit_trail_is_for_auditors_only(client):
    audit_record(action="console.test", actor=None, target="thing:1")
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    response = client.get("/console/audit/?action=console.")
    assert response.status_code == 200
    assert "thing:1" in response.content.decode()
    for role in (PlatformRole.SYSTEM_ADMIN, PlatformRole.SECURITY_ADMIN):
        client.force_login(make_user(platform_role=role))
        assert client.get("/console/audit/").status_code == 404
        assert client.post("/console/audit/verify/").status_code == 404


def test_auditor_reads_a_records_decrypted_details(client):
    record = audit_record(action="console.test", actor=None, target="thing:2", details={"after": {"colour": "teal"}})
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    page = client.get(f"/console/audit/{record.pk}/").content.decode()
    assert "teal" in page and record.hash in page


def test_auditor_verifies_the_chain_and_sees_the_result(client):
    audit_record(action="console.test", actor=None, target="thing:3")
    auditor = make_user(platform_role=PlatformRole.AUDITOR)
    client.force_login(auditor)
    response = client.post("/console/audit/verify/", follow=True)
    page = response.content.decode()
    assert "The audit trail verifies" in page
    assert 'data-testid="verify-status"><span class="badge ok">' in page
    assert f"by {auditor.username}" in page


def test_audit_search_filters_by_outcome_and_exports_csv(client):
    audit_record(action="console.ok", actor=None, target="ok:1")
    audit_record(action="console.bad", actor=None, target="bad:1", outcome="denied")
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    page = client.get("/console/audit/?outcome=denied").content.decode()
    assert "bad:1" in page and "ok:1" not in page
    body = client.get("/console/audit/?q=console.&export=csv").content.decode()
    assert "ok:1" in body and "bad:1" in body


def test_auditor_downloads_an_export_bundle_that_verifies_offline(client, tmp_path):
    import datetime
    import zipfile

    from audit.bundle_verifier import verify_bundle

    audit_record(action="console.test", actor=None, target="thing:4")
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    response = client.post("/console/audit/export/", {"start": today})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    path = tmp_path / "bundle.zip"
    path.write_bytes(response.content)
    with zipfile.ZipFile(path) as bundle:
        assert "thing:4" in "".join(bundle.read(n).decode(errors="replace") for n in bundle.namelist())
    assert verify_bundle(str(path))["records"] >= 1  # raises BundleError when it does not verify


def test_export_bundle_is_for_auditors_only(client):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    assert client.post("/console/audit/export/", {"start": "2026-01-01"}).status_code == 404


def test_system_admin_cordons_drains_and_returns_a_node(admin_client):
    node = make_node("gpu-a", devices=1)
    url = f"/console/nodes/{node.pk}/action/"
    response = admin_client.post(url, {"action": "cordon"}, follow=True)
    assert "cordoned" in response.content.decode()
    node.refresh_from_db()
    assert node.status == NodeStatus.CORDONED
    admin_client.post(url, {"action": "drain"})
    node.refresh_from_db()
    assert node.status == NodeStatus.DRAINING
    admin_client.post(url, {"action": "uncordon"})
    node.refresh_from_db()
    # No recent heartbeat: back in service, but not ready until its agent reports.
    assert node.status == NodeStatus.NOT_READY


def test_node_actions_are_for_system_admins_only(client):
    node = make_node("gpu-a", devices=1)
    client.force_login(make_member(make_tenant(), role=MembershipRole.TENANT_ADMIN))
    assert client.post(f"/console/nodes/{node.pk}/action/", {"action": "cordon"}).status_code == 404
    client.force_login(make_user(platform_role=PlatformRole.SECURITY_ADMIN))
    assert client.post(f"/console/nodes/{node.pk}/action/", {"action": "cordon"}).status_code == 404
    node.refresh_from_db()
    assert node.status == NodeStatus.READY


def test_unknown_node_action_changes_nothing(admin_client):
    node = make_node("gpu-a", devices=1)
    response = admin_client.post(f"/console/nodes/{node.pk}/action/", {"action": "explode"}, follow=True)
    assert "Unknown action" in response.content.decode()
    node.refresh_from_db()
    assert node.status == NodeStatus.READY


def test_node_table_shows_live_utilisation(admin_client, monkeypatch):
    from scheduler.fleet import telemetry

    store = telemetry.MemoryLatestStore()  # private: leaves nothing in a shared Redis
    monkeypatch.setattr(telemetry, "latest_store", lambda: store)
    node = make_node("gpu-a", devices=2)
    first, second = node.devices.all()
    store.put(node.pk, {first.uuid: {"utilization_pct": 90.0}, second.uuid: {"utilization_pct": 30.0}})
    make_node("gpu-b", devices=1)
    page = admin_client.get("/console/nodes/").content.decode()
    assert "60%" in page
    csv_lines = admin_client.get("/console/nodes/?export=csv").content.decode().splitlines()
    assert ",60.0," in csv_lines[1] and ",60.0," not in csv_lines[2]
