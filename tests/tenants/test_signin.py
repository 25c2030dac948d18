"""Console sign-in: audit of logins and failures, lockout after repeated failures, TOTP for platform roles,
and the bootstrap / otp_enrol commands."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from tenants.models import PlatformRole, User
from tests.factories import TEST_PASSWORD, SystemAdminFactory, UserFactory
from tests.tenants.conftest import audited

pytestmark = pytest.mark.django_db


def _login(client: Client, username: str, password: str):
    return client.post(reverse("login"), {"username": username, "password": password})


def _code(device: TOTPDevice) -> str:
    return f"{totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits):0{device.digits}d}"


def test_successful_and_failed_logins_are_audited():
    UserFactory(username="dana")
    client = Client()
    assert _login(client, "dana", "wrong-password").status_code == 200
    assert _login(client, "dana", TEST_PASSWORD).status_code == 302
    [failure] = audited("auth.login.failure")
    assert failure["outcome"] == "failure" and failure["details"]["username"] == "dana"
    [success] = audited("auth.login")
    assert success["actor_username"] == "dana"


@override_settings(AXES_FAILURE_LIMIT=3)
def test_repeated_failures_lock_the_account_even_for_the_right_password():
    UserFactory(username="erin")
    client = Client()
    for _ in range(3):
        _login(client, "erin", "wrong-password")
    locked = _login(client, "erin", TEST_PASSWORD)
    assert locked.status_code in (403, 429)
    assert "_auth_user_id" not in client.session
    assert audited("auth.lockout")[0]["details"]["username"] == "erin"
    # Another account from the same address is not affected.
    UserFactory(username="frank")
    assert _login(Client(), "frank", TEST_PASSWORD).status_code == 302


@override_settings(OTP_TOTP_THROTTLE_FACTOR=0)  # django-otp slows retries after a wrong code; not under test here
def test_platform_role_with_device_must_enter_code_before_anything_else():
    admin = SystemAdminFactory(username="root")
    device = TOTPDevice.objects.create(user=admin, name="phone", confirmed=True)
    client = Client()
    assert _login(client, "root", TEST_PASSWORD).status_code == 302
    page = client.get("/")
    assert page.status_code == 302 and page["Location"].startswith("/accounts/otp/verify/")
    api = client.get("/api/v1/me/")
    assert api.status_code == 401 and api.json()["code"] == "mfa_required"

    wrong = client.post("/accounts/otp/verify/", {"otp_token": "000000", "next": "/api/v1/me/"})
    assert wrong.status_code == 200 and b"not valid" in wrong.content
    right = client.post("/accounts/otp/verify/", {"otp_token": _code(device), "next": "/api/v1/me/"})
    assert right.status_code == 302 and right["Location"] == "/api/v1/me/"
    assert client.get("/api/v1/me/").json()["mfa_enrolled"] is True
    assert [e["outcome"] for e in audited("auth.mfa.verify")] == ["failure", "success"]


def test_member_without_platform_role_is_never_asked_for_a_code():
    user = UserFactory(username="gina")
    TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    client = Client()
    _login(client, "gina", TEST_PASSWORD)
    assert client.get("/api/v1/me/").status_code == 200


def test_enrolment_page_confirms_a_device_with_a_first_code():
    admin = SystemAdminFactory(username="hal")
    client = Client()
    client.force_login(admin)
    page = client.get("/accounts/otp/enrol/")
    assert page.status_code == 200
    device = TOTPDevice.objects.get(user=admin, confirmed=False)
    assert device.config_url.encode().replace(b"&", b"&amp;") in page.content
    done = client.post("/accounts/otp/enrol/", {"device": device.pk, "otp_token": _code(device), "next": "/"})
    assert done.status_code == 302
    device.refresh_from_db()
    assert device.confirmed
    assert [e["outcome"] for e in audited("auth.mfa.enrol.confirm")] == ["success"]


def test_enrolment_page_does_not_let_a_password_alone_replace_a_device():
    admin = SystemAdminFactory(username="ivy")
    TOTPDevice.objects.create(user=admin, name="phone", confirmed=True)
    client = Client()
    client.force_login(admin)
    response = client.get("/accounts/otp/enrol/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/otp/verify/")
    assert TOTPDevice.objects.filter(user=admin).count() == 1


@override_settings(GPUPOOL_MFA_REQUIRED=True)
def test_required_mfa_sends_unenrolled_platform_roles_to_enrolment():
    client = Client()
    client.force_login(SystemAdminFactory(username="jon"))
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/otp/enrol/")


def test_security_admin_resets_a_lost_device(world):
    TOTPDevice.objects.create(user=world.users["system_admin"], name="phone", confirmed=True)
    response = world.client("security_admin").post(f"/api/v1/users/{world.users['system_admin'].pk}/mfa-reset/")
    assert response.status_code == 200 and response.json() == {"removed": 1}
    assert not TOTPDevice.objects.filter(user=world.users["system_admin"]).exists()


def test_otp_enrol_command_prints_key_and_confirms(capsys):
    SystemAdminFactory(username="kim")
    call_command("otp_enrol", "kim")
    out = capsys.readouterr().out
    assert "otpauth://totp/" in out
    assert TOTPDevice.objects.get(user__username="kim").confirmed


# --- bootstrap ---------------------------------------------------------------------------------------------


def test_bootstrap_from_environment_is_idempotent(monkeypatch, capsys):
    monkeypatch.setenv("GPUPOOL_BOOTSTRAP_SECURITY_ADMIN", "sec0")
    monkeypatch.setenv("GPUPOOL_BOOTSTRAP_SECURITY_ADMIN_PASSWORD", "first-security-passphrase")
    monkeypatch.setenv("GPUPOOL_BOOTSTRAP_SYSTEM_ADMIN", "sys0")
    monkeypatch.setenv("GPUPOOL_BOOTSTRAP_SYSTEM_ADMIN_PASSWORD", "first-system-passphrase")
    call_command("bootstrap")
    call_command("bootstrap")
    assert User.objects.get(username="sec0").platform_role == PlatformRole.SECURITY_ADMIN
    assert User.objects.get(username="sys0").platform_role == PlatformRole.SYSTEM_ADMIN
    assert User.objects.get(username="sys0").check_password("first-system-passphrase")
    assert "already exists" in capsys.readouterr().out
    assert len(audited("user.create")) == 2


def test_bootstrap_from_flags():
    call_command("bootstrap", "--system-admin", "ops", "--system-admin-password", "an-ops-passphrase-1")
    assert User.objects.get(username="ops").platform_role == PlatformRole.SYSTEM_ADMIN


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "Nothing to do"),
        (["--system-admin", "ops"], "No password"),
        (["--system-admin", "x", "--system-admin-password", "short"], "too short"),
        (
            [
                "--system-admin",
                "same",
                "--system-admin-password",
                "pw-long-enough-1",
                "--security-admin",
                "same",
                "--security-admin-password",
                "pw-long-enough-2",
            ],
            "different accounts",
        ),
    ],
)
def test_bootstrap_errors_are_clear(monkeypatch, args, message):
    for name in ("GPUPOOL_BOOTSTRAP_SECURITY_ADMIN", "GPUPOOL_BOOTSTRAP_SYSTEM_ADMIN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(CommandError, match=message):
        call_command("bootstrap", *args)


def test_bootstrap_refuses_existing_user_with_another_role():
    UserFactory(username="taken", platform_role=PlatformRole.AUDITOR)
    with pytest.raises(CommandError, match="cannot hold two platform roles"):
        call_command("bootstrap", "--system-admin", "taken", "--system-admin-password", "pw-long-enough-1")
