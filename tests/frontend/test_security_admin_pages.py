"""The security admin's pages: accounts, platform and tenant roles, two-factor resets, sign-in lockouts and
other people's tokens, through the same services as the API (audited, same refusals)."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from django.urls import reverse
from django_otp.plugins.otp_totp.models import TOTPDevice

from tenants.models import Membership, MembershipRole, PlatformRole, User
from tenants.services.tokens import api_token_create
from tests.frontend.factories import PASSWORD, make_member, make_tenant, make_user
from tests.tenants.conftest import audited

pytestmark = pytest.mark.django_db


@pytest.fixture
def security_client(client):
    admin = make_user("secadmin", platform_role=PlatformRole.SECURITY_ADMIN)
    client.force_login(admin)
    client.admin = admin
    return client


def _sign_in(username: str, password: str) -> int:
    return Client().post(reverse("login"), {"username": username, "password": password}).status_code


def _lock_out(username: str, failures: int = 3) -> None:
    for _ in range(failures):
        _sign_in(username, "wrong-password")


def _users_listed(client: Client, query: str = "") -> list[str]:
    table = client.get(f"/console/users/?{query}").context["table"]
    return [row.record.username for row in table.paginated_rows]


def test_account_list_filters_by_role_two_factor_and_activity(security_client):
    make_user("alice")
    make_user("sam", platform_role=PlatformRole.SYSTEM_ADMIN)
    bob = make_user("bob")
    TOTPDevice.objects.create(user=bob, name="phone", confirmed=True)
    User.objects.filter(username="alice").update(is_active=False)
    assert {"alice", "bob", "sam", "secadmin"} <= set(_users_listed(security_client))
    assert _users_listed(security_client, "platform_role=system_admin") == ["sam"]
    assert "sam" not in _users_listed(security_client, "platform_role=none")
    assert _users_listed(security_client, "has_mfa=true") == ["bob"]
    assert _users_listed(security_client, "is_active=false") == ["alice"]
    assert _users_listed(security_client, "q=bo") == ["bob"]


def test_security_admin_creates_an_account_that_can_sign_in(security_client):
    response = security_client.post(
        "/console/users/new/",
        {"username": "newbie", "email": "n@example.com", "password": "a-long-enough-passphrase-42"},
    )
    newbie = User.objects.get(username="newbie")
    assert response.status_code == 302 and response["Location"] == f"/console/users/{newbie.pk}/"
    assert _sign_in("newbie", "a-long-enough-passphrase-42") == 302
    assert audited("user.create")[-1]["actor_username"] == "secadmin"


def test_account_creation_refusals_appear_at_the_field(security_client):
    make_user("taken")
    duplicate = security_client.post("/console/users/new/", {"username": "TAKEN", "password": ""})
    assert "A user named 'TAKEN' already exists" in duplicate.context["form"].errors["username"][0]
    weak = security_client.post("/console/users/new/", {"username": "weakling", "password": "123"})
    assert weak.context["form"].errors["password"]
    assert not User.objects.filter(username="weakling").exists()


def test_platform_role_is_granted_and_a_direct_switch_is_refused(security_client):
    target = make_user("rita")
    done = security_client.post(f"/console/users/{target.pk}/role/", {"platform_role": "auditor"}, follow=True)
    target.refresh_from_db()
    assert target.platform_role == PlatformRole.AUDITOR and "saved" in done.content.decode()
    refused = security_client.post(
        f"/console/users/{target.pk}/role/", {"platform_role": "system_admin"}, follow=True
    ).content.decode()
    target.refresh_from_db()
    assert target.platform_role == PlatformRole.AUDITOR
    assert "one account cannot hold two platform roles" in refused
    assert audited("user.role.change")[-1]["details"]["after"] == {"platform_role": "auditor"}


def test_own_platform_role_and_activity_cannot_be_changed(security_client):
    me = security_client.admin
    page = security_client.get(f"/console/users/{me.pk}/").content.decode()
    assert "You cannot change your own platform role" in page
    refused = security_client.post(f"/console/users/{me.pk}/active/", {"active": "false"}, follow=True)
    me.refresh_from_db()
    assert me.is_active and "cannot deactivate your own account" in refused.content.decode()


def test_deactivation_stops_sign_in_and_tokens(security_client):
    target = make_user("dora")
    _token, secret = api_token_create(actor=target, name="ci")
    security_client.post(f"/console/users/{target.pk}/active/", {"active": "false"})
    assert _sign_in("dora", PASSWORD) == 200  # the sign-in form again, not a redirect
    assert Client().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401
    security_client.post(f"/console/users/{target.pk}/active/", {"active": "true"})
    assert _sign_in("dora", PASSWORD) == 302


def test_two_factor_reset_removes_the_devices_and_is_audited(security_client):
    target = make_user("phil", platform_role=PlatformRole.SYSTEM_ADMIN)
    TOTPDevice.objects.create(user=target, name="lost phone", confirmed=True)
    page = security_client.get(f"/console/users/{target.pk}/").content.decode()
    assert "1 device enrolled." in page
    done = security_client.post(f"/console/users/{target.pk}/mfa-reset/", follow=True).content.decode()
    assert not TOTPDevice.objects.filter(user=target).exists()
    assert "1 device(s) removed" in done and "No two-factor device." in done
    [event] = audited("auth.mfa.reset")
    assert event["actor_username"] == "secadmin" and event["details"]["removed"] == 1


@override_settings(AXES_FAILURE_LIMIT=3)
def test_lockout_is_listed_and_lifted_and_the_lift_is_audited(security_client):
    make_user("lena")
    _lock_out("lena")
    assert _sign_in("lena", PASSWORD) != 302  # locked, even with the right password
    page = security_client.get("/console/lockouts/")
    [attempt] = page.context["locked"]
    assert attempt.username == "lena" and attempt.failures_since_start >= 3
    assert _users_listed(security_client, "is_locked=true") == ["lena"]

    done = security_client.post(f"/console/lockouts/{attempt.pk}/reset/", follow=True).content.decode()
    assert "lifted" in done and "Nobody is locked out." in done
    assert _sign_in("lena", PASSWORD) == 302
    [event] = audited("auth.lockout.reset")
    assert event["actor_username"] == "secadmin"
    assert event["details"]["username"] == "lena" and event["details"]["failures"] >= 3


@override_settings(AXES_FAILURE_LIMIT=3)
def test_failures_below_the_limit_are_shown_apart_from_lockouts(security_client):
    make_user("fred")
    _lock_out("fred", failures=1)
    page = security_client.get("/console/lockouts/")
    assert page.context["locked"] == [] and [a.username for a in page.context["failing"]] == ["fred"]


@override_settings(AXES_FAILURE_LIMIT=3)
def test_only_security_admins_see_or_lift_lockouts(client):
    make_user("lars")
    _lock_out("lars")
    from axes.models import AccessAttempt

    attempt = AccessAttempt.objects.get(username="lars")
    for role in (PlatformRole.SYSTEM_ADMIN, PlatformRole.AUDITOR, PlatformRole.NONE):
        client.force_login(make_user(platform_role=role))
        assert client.get("/console/lockouts/").status_code == 404
        assert client.post(f"/console/lockouts/{attempt.pk}/reset/").status_code == 404
    assert AccessAttempt.objects.filter(pk=attempt.pk).exists()


def test_other_roles_cannot_use_the_account_actions(client):
    target = make_user()
    TOTPDevice.objects.create(user=target, name="phone", confirmed=True)
    tenant = make_tenant("acme")
    admin = make_member(tenant, role=MembershipRole.TENANT_ADMIN)
    for actor in (make_user(platform_role=PlatformRole.SYSTEM_ADMIN), admin):
        client.force_login(actor)
        assert client.post(f"/console/users/{target.pk}/mfa-reset/").status_code == 404
        assert client.post(f"/console/users/{target.pk}/role/", {"platform_role": "auditor"}).status_code == 404
        assert client.post(f"/console/users/{target.pk}/active/", {"active": "false"}).status_code == 404
    target.refresh_from_db()
    assert target.is_active and target.platform_role == "" and TOTPDevice.objects.filter(user=target).exists()


def test_tenant_roles_are_added_changed_and_removed(security_client):
    tenant = make_tenant("acme")
    target = make_user("mia")
    page = security_client.get(f"/console/users/{target.pk}/")
    assert (str(tenant.pk), "Acme (acme)") in page.context["membership_form"].fields["tenant"].choices
    security_client.post(f"/console/users/{target.pk}/memberships/", {"tenant": tenant.pk, "role": "viewer"})
    membership = Membership.objects.get(user=target, tenant=tenant)
    assert membership.role == MembershipRole.VIEWER
    security_client.post(
        f"/console/users/{target.pk}/memberships/{membership.pk}/",
        {"action": "save", f"m{membership.pk}-role": "tenant_admin"},
    )
    membership.refresh_from_db()
    assert membership.role == MembershipRole.TENANT_ADMIN
    security_client.post(f"/console/users/{target.pk}/memberships/{membership.pk}/", {"action": "remove"})
    assert not Membership.objects.filter(user=target).exists()
    assert [
        len(audited(action)) for action in ("membership.create", "membership.role.change", "membership.delete")
    ] == [
        1,
        1,
        1,
    ]


def test_a_platform_account_gets_no_tenant_role(security_client):
    tenant = make_tenant("acme")
    auditor = make_user("audrey", platform_role=PlatformRole.AUDITOR)
    page = security_client.get(f"/console/users/{auditor.pk}/").content.decode()
    assert "Add to tenant" not in page and "A platform account holds no tenant role" in page
    done = security_client.post(
        f"/console/users/{auditor.pk}/memberships/", {"tenant": tenant.pk, "role": "member"}, follow=True
    )
    assert "That user cannot be added" in done.content.decode()
    assert not Membership.objects.filter(user=auditor).exists()


def test_a_member_gets_no_platform_role(security_client):
    member = make_member(make_tenant("acme"), username="mo")
    done = security_client.post(f"/console/users/{member.pk}/role/", {"platform_role": "auditor"}, follow=True)
    member.refresh_from_db()
    assert member.platform_role == "" and "a platform account holds no tenant membership" in done.content.decode()


def test_security_admin_revokes_someone_elses_leaked_token(security_client):
    target = make_user("leaky")
    token, secret = api_token_create(actor=target, name="pasted in chat")
    page = security_client.get(f"/console/users/{target.pk}/").content.decode()
    assert "pasted in chat" in page and secret not in page
    security_client.post(f"/console/users/{target.pk}/tokens/{token.pk}/revoke/")
    assert Client().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401
    assert audited("token.revoke")[0]["actor_username"] == "secadmin"
