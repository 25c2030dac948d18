"""Bootstrap tokens and registration: one-time, expiring, hashed; clear 4xx answers; audited."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditRecord
from audit.services import record_details
from scheduler.fleet.models import BootstrapToken, Node, NodeCredential, NodeStatus
from scheduler.fleet.services.enrolment import _hash, bootstrap_token_create, credential_authenticate
from tests.factories import AuditorFactory, SystemAdminFactory, UserFactory

pytestmark = pytest.mark.django_db

REGISTER = "/api/v1/agents/register/"
TOKENS = "/api/v1/agents/bootstrap-tokens/"


def make_token(ttl_s: int = 600) -> str:
    _row, secret = bootstrap_token_create(actor=None, ttl_s=ttl_s)
    return secret


def register(token: str, node_name: str = "gpu-01"):
    return APIClient().post(
        REGISTER,
        {"token": token, "node_name": node_name, "hostname": "gpu-01.lab", "agent_version": "1.2"},
        format="json",
    )


def test_system_admin_creates_a_token_that_is_shown_once_and_stored_hashed():
    client = APIClient()
    admin = SystemAdminFactory()
    client.force_authenticate(admin)
    response = client.post(TOKENS, {"ttl_s": 900, "description": "rack 4"}, format="json")
    assert response.status_code == 201, response.content
    secret = response.json()["token"]
    row = BootstrapToken.objects.get()
    assert secret.startswith("gpb_")
    assert secret not in row.token_hash and row.token_hash == _hash(secret)
    assert row.expires_at - timezone.now() == pytest.approx(timedelta(seconds=900), abs=timedelta(seconds=5))
    assert AuditRecord.objects.filter(action="agent.bootstrap_token.create", actor_id=admin.pk).exists()


@pytest.mark.parametrize("factory", [UserFactory, AuditorFactory])
def test_only_a_system_admin_creates_tokens(factory):
    client = APIClient()
    client.force_authenticate(factory())
    response = client.post(TOKENS, {}, format="json")
    assert response.status_code == 403
    assert not BootstrapToken.objects.exists()


def test_token_ttl_out_of_range_is_a_400_that_names_the_limits():
    client = APIClient()
    client.force_authenticate(SystemAdminFactory())
    response = client.post(TOKENS, {"ttl_s": 5}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_ttl"
    assert "between 60 seconds" in response.json()["detail"]


def test_management_command_prints_a_usable_token():
    out = StringIO()
    call_command("agent_bootstrap_token", "--ttl", "120", stdout=out, stderr=StringIO())
    secret = out.getvalue().strip()
    assert register(secret).status_code == 201


def test_register_trades_the_token_for_a_node_credential():
    response = register(make_token())
    assert response.status_code == 201, response.content
    body = response.json()
    node = Node.objects.get(name="gpu-01")
    assert body["node_id"] == node.pk and body["node_name"] == "gpu-01" and body["ws_url"] == "/ws/agent/"
    assert body["credential"].startswith("gpn_")
    assert node.status == NodeStatus.NOT_READY  # ready only after the agent's hello
    assert node.agent_version == "1.2" and node.agent.hostname == "gpu-01.lab"
    credential = NodeCredential.objects.get(node=node)
    assert body["credential"].split("_")[-1] not in credential.secret_hash
    assert credential_authenticate(credential=body["credential"]).pk == credential.pk
    assert AuditRecord.objects.filter(action="agent.register", outcome="success", target=f"node:{node.pk}").exists()


def test_a_token_works_only_once():
    token = make_token()
    assert register(token, "gpu-01").status_code == 201
    response = register(token, "gpu-02")
    assert response.status_code == 401
    assert response.json()["code"] == "token_used"
    assert "already used" in response.json()["detail"]
    assert not Node.objects.filter(name="gpu-02").exists()


def test_an_expired_token_is_refused_with_its_expiry_time():
    token = make_token()
    BootstrapToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    response = register(token)
    assert response.status_code == 401
    assert response.json()["code"] == "token_expired"
    assert "expired at" in response.json()["detail"]


def test_a_wrong_token_is_refused_and_the_refusal_is_audited():
    make_token()
    response = register("gpb_not-a-real-token")
    assert response.status_code == 401
    assert response.json()["code"] == "invalid_token"
    assert "agent_bootstrap_token" in response.json()["detail"]
    assert AuditRecord.objects.filter(action="agent.register", outcome="failure").exists()
    assert not Node.objects.exists()


def test_missing_fields_and_bad_node_names_are_400():
    assert register(make_token(), node_name="bad name!").json()["code"] == "invalid_node_name"
    response = APIClient().post(REGISTER, {"node_name": "x"}, format="json")
    assert response.status_code == 400
    assert "token" in response.json()["errors"]


def test_registering_a_node_again_revokes_its_old_credential():
    first = register(make_token()).json()["credential"]
    second = register(make_token()).json()["credential"]
    assert credential_authenticate(credential=first) is None
    assert credential_authenticate(credential=second) is not None
    assert Node.objects.count() == 1


def test_revoke_endpoint_is_for_system_admins_and_audited():
    body = register(make_token()).json()
    client = APIClient()
    client.force_authenticate(UserFactory())
    assert client.post(f"/api/v1/agents/nodes/{body['node_id']}/revoke/").status_code == 403
    admin = SystemAdminFactory()
    client.force_authenticate(admin)
    response = client.post(f"/api/v1/agents/nodes/{body['node_id']}/revoke/")
    assert response.status_code == 200 and response.json()["revoked"] == 1
    assert credential_authenticate(credential=body["credential"]) is None
    assert AuditRecord.objects.filter(action="agent.credential.revoke", actor_id=admin.pk).exists()
    assert client.post("/api/v1/agents/nodes/999999/revoke/").status_code == 404


def test_forged_credentials_are_refused_and_audited():
    body = register(make_token()).json()
    key_id = body["credential"].split("_")[1]
    for forged in [f"gpn_{key_id}_wrongsecret", "gpn_0000000000000000_x", "garbage", ""]:
        assert credential_authenticate(credential=forged) is None
    reasons = {record_details(record)["reason"] for record in AuditRecord.objects.filter(action="node.auth_failed")}
    assert {"wrong_secret", "unknown_credential", "malformed", "missing"} <= reasons


def test_admin_lists_nodes_with_agent_state():
    register(make_token())
    client = APIClient()
    client.force_authenticate(SystemAdminFactory())
    response = client.get("/api/v1/agents/nodes/")
    assert response.status_code == 200
    [row] = response.json()["results"]
    assert row["name"] == "gpu-01" and row["status"] == "not_ready" and row["hostname"] == "gpu-01.lab"


def test_one_node_api_shows_agent_fields_to_fleet_readers_only_and_revokes():
    """``/api/v1/nodes/`` is the one Node API: a member reads the node without its agent's host and connection
    times; a system admin reads them too, and the older ``/agents/nodes/`` path answers the same rows."""
    body = register(make_token()).json()
    client = APIClient()
    client.force_authenticate(UserFactory())
    [member_row] = client.get("/api/v1/nodes/").json()["results"]
    assert member_row["name"] == "gpu-01"
    assert not {"hostname", "connected_at", "lost_at"} & set(member_row)
    assert client.get("/api/v1/agents/nodes/").status_code == 403
    assert client.post(f"/api/v1/nodes/{body['node_id']}/revoke/").status_code == 403

    admin = SystemAdminFactory()
    client.force_authenticate(admin)
    [admin_row] = client.get("/api/v1/nodes/").json()["results"]
    assert admin_row["hostname"] == "gpu-01.lab" and "connected_at" in admin_row
    assert client.get("/api/v1/agents/nodes/").json()["results"] == [admin_row]
    assert client.get(f"/api/v1/nodes/{body['node_id']}/").json() == admin_row

    response = client.post(f"/api/v1/nodes/{body['node_id']}/revoke/")
    assert response.status_code == 200 and response.json() == {"node_id": body["node_id"], "revoked": 1}
    assert credential_authenticate(credential=body["credential"]) is None
    assert client.post("/api/v1/nodes/999999/revoke/").status_code == 404
