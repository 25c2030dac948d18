"""The API tokens page: every role has it, the secret is shown once and works against the API, revoking it
stops it, scopes follow the role, and nobody revokes another person's token from here."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tenants.models import ApiToken, PlatformRole, TokenScope
from tenants.services.tokens import api_token_create
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user
from tests.patching import patch_request_cycle
from tests.tenants.conftest import audited

pytestmark = pytest.mark.django_db


def _secret_in(page: str) -> str | None:
    found = re.search(r'value="(gp_[0-9a-f]{8}_[^"]+)"', page)
    return found.group(1) if found else None


def _create(client: Client, name: str, scope: str = "read", days: int = 30):
    return client.post("/console/account/tokens/", {"t-name": name, "t-scope": scope, "t-lifetime_days": days})


def _api_me(secret: str):
    return Client().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {secret}")


@pytest.mark.parametrize(
    "role", [PlatformRole.NONE, PlatformRole.SYSTEM_ADMIN, PlatformRole.SECURITY_ADMIN, PlatformRole.AUDITOR]
)
def test_every_role_has_the_tokens_page_in_its_menu(client, role):
    client.force_login(make_user(platform_role=role))
    page = client.get("/console/account/tokens/")
    assert page.status_code == 200
    assert 'href="/console/account/tokens/"' in page.content.decode()


def test_created_token_is_shown_once_and_authenticates_against_the_api(client):
    user = make_member(make_tenant("acme"), username="tina")
    client.force_login(user)
    response = _create(client, "laptop CLI", "write")
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0") or "no-store" in response["Cache-Control"]
    secret = _secret_in(response.content.decode())
    assert secret is not None
    me = _api_me(secret)
    assert me.status_code == 200 and me.json()["username"] == "tina"

    # Only a hash is kept: the list shows the prefix, never the secret again.
    listing = client.get("/console/account/tokens/").content.decode()
    assert secret not in listing and _secret_in(listing) is None
    token = ApiToken.objects.get(user=user, name="laptop CLI")
    assert f"gp_{token.key_prefix}_…" in listing and token.scope == TokenScope.WRITE
    assert secret not in str(token.__dict__)
    [event] = audited("token.create")
    assert event["actor_username"] == "tina"


def test_last_used_appears_after_the_token_is_used(client):
    user = make_user("uma")
    client.force_login(user)
    secret = _secret_in(_create(client, "ci").content.decode())
    row = re.search(r'<tr data-token="ci">.*?</tr>', client.get("/console/account/tokens/").content.decode(), re.S)
    assert "never" in row.group(0)
    _api_me(secret)
    row = re.search(r'<tr data-token="ci">.*?</tr>', client.get("/console/account/tokens/").content.decode(), re.S)
    assert "never" not in row.group(0)


def test_revoked_token_stops_working_at_once(client):
    user = make_user("vic")
    client.force_login(user)
    secret = _secret_in(_create(client, "script").content.decode())
    token = ApiToken.objects.get(user=user, name="script")
    assert _api_me(secret).status_code == 200
    done = client.post(f"/console/account/tokens/{token.pk}/revoke/", follow=True)
    assert "revoked" in done.content.decode()
    refused = _api_me(secret)
    assert refused.status_code == 401 and refused.json()["code"] == "token_revoked"
    assert audited("token.revoke")[0]["actor_username"] == "vic"


def test_revoke_asks_for_confirmation_first(client):
    user = make_user()
    api_token_create(actor=user, name="ci")
    client.force_login(user)
    page = client.get("/console/account/tokens/").content.decode()
    assert 'data-confirm="Revoke the token “ci”? Programs using it stop working at once."' in page


def test_someone_elses_token_is_revoked_here_only_by_a_security_admin(client):
    owner = make_user()
    token, secret = api_token_create(actor=owner, name="mine")
    client.force_login(make_user())
    assert client.post(f"/console/account/tokens/{token.pk}/revoke/").status_code == 404
    assert _api_me(secret).status_code == 200
    # The policy's token.revoke: a security admin revokes any token, on this page as through the API.
    client.force_login(make_user(platform_role=PlatformRole.SECURITY_ADMIN))
    assert client.post(f"/console/account/tokens/{token.pk}/revoke/").status_code == 302
    assert _api_me(secret).status_code == 401


def test_scopes_offered_follow_the_role_and_the_service_refuses_the_rest(client):
    member = make_user()
    client.force_login(member)
    form = client.get("/console/account/tokens/").context["form"]
    assert [value for value, _label in form.fields["scope"].choices] == ["read", "write"]
    refused = _create(client, "sneaky", "admin")
    assert refused.context["form"].errors["scope"] and not ApiToken.objects.filter(user=member).exists()

    auditor = make_user(platform_role=PlatformRole.AUDITOR)
    client.force_login(auditor)
    form = client.get("/console/account/tokens/").context["form"]
    assert [value for value, _label in form.fields["scope"].choices] == ["read"]

    admin = make_user(platform_role=PlatformRole.SYSTEM_ADMIN)
    client.force_login(admin)
    assert _secret_in(_create(client, "ops", "admin").content.decode())
    assert ApiToken.objects.get(user=admin).scope == TokenScope.ADMIN


def test_service_refusals_appear_at_the_field(client):
    user = make_user()
    api_token_create(actor=user, name="ci")
    client.force_login(user)
    duplicate = _create(client, "ci")
    assert "You already have a token named 'ci'." in duplicate.context["form"].errors["name"]
    too_long = _create(client, "long", days=400)
    assert too_long.context["form"].errors["lifetime_days"]
    assert _secret_in(duplicate.content.decode()) is None


def test_signed_out_visitors_are_sent_to_sign_in(client):
    response = client.get("/console/account/tokens/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def _form_defaults(page: str) -> dict[str, str]:
    """What a browser posts when the token form is sent as it comes: each input's value, and for a select its
    ``selected`` option (a browser sends the first option when none is selected)."""
    form = page.split('id="new-token-title"', 1)[1]
    values = dict(re.findall(r'<input[^>]*name="(t-[a-z_]+)"[^>]*value="([^"]*)"', form))
    select = re.search(r'<select name="t-scope"[^>]*>(.*?)</select>', form, re.S)
    assert select is not None
    options = re.findall(r'<option value="([a-z]+)"( selected)?', select.group(1))
    values["t-scope"] = next((value for value, selected in options if selected), options[0][0])
    return values


def test_a_token_made_with_the_forms_default_scope_submits_and_cancels_a_job(client, settings, monkeypatch):
    """Issue 33: a member who named a token and kept the defaults got a read token, and gpupool-cli's first
    submit was refused."""
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: None)
    flavor = make_flavor()
    make_node(flavor=flavor)
    client.force_login(make_member(make_tenant("acme"), username="newcomer"))
    page = client.get("/console/account/tokens/").content.decode()
    assert "gpupool-cli needs write to submit and cancel jobs" in page  # the form says what each scope is for
    defaults = _form_defaults(page)
    assert defaults["t-scope"] == TokenScope.WRITE
    secret = _secret_in(client.post("/console/account/tokens/", {**defaults, "t-name": "laptop"}).content.decode())
    assert secret is not None

    api = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    spec = {"name": "first", "tenant": "acme", "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]}
    submitted = api.post("/api/v1/jobs/", spec, content_type="application/json")
    assert submitted.status_code == 201, submitted.json()
    cancelled = api.post(f"/api/v1/jobs/{submitted.json()['id']}/cancel/", {}, content_type="application/json")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    me = api.get("/api/v1/me/").json()["token"]
    assert (me["name"], me["scope"], me["submits_jobs"]) == ("laptop", TokenScope.WRITE, True)


def test_the_default_scope_is_write_for_an_admin_too_and_read_where_only_read_is_offered(client):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    page = client.get("/console/account/tokens/").content.decode()
    assert 'value="admin"' in page and _form_defaults(page)["t-scope"] == TokenScope.WRITE  # admin: on purpose
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    assert _form_defaults(client.get("/console/account/tokens/").content.decode())["t-scope"] == TokenScope.READ
