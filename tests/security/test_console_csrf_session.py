"""CSRF and session fixation on the console (and the API used with a console session).

- Every state-changing POST made with a signed-in session but without the CSRF token is refused (403) and
  changes nothing; the very same request with the token goes through (so the refusal is the token's doing).
- Every console URL refuses a token-less POST, found from the URL configuration (a new page is covered).
- Signing in rotates the session id: a session id planted before sign-in is worthless afterwards; signing out
  ends the session.

No test elsewhere covers these (tests/tenants/test_signin.py covers sign-in, lockout and MFA).
"""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from scheduler.fleet.models import Node, NodeStatus
from scheduler.models import Job, JobState
from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole, PlatformRole
from tests.factories import TEST_PASSWORD as PASSWORD
from tests.frontend.factories import make_flavor, make_node, make_tenant
from tests.security.conftest import assert_unchanged, state_fingerprint
from tests.security.conftest import fast_member as make_member
from tests.security.conftest import fast_user as make_user

pytestmark = pytest.mark.django_db


def spec(tenant: str) -> dict:
    resources = {"flavors": ["nvidia-h100-80g"], "gpus": 1}
    return {"name": "csrf", "tenant": tenant, "resources": resources, "command": ["x"]}


def signed_in(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/console/overview/")  # sets the CSRF cookie, as any page does
    return client


def csrf_token(client: Client) -> str:
    return client.cookies["csrftoken"].value


@pytest.fixture
def world():
    make_flavor()
    node = make_node("csrf-node")
    tenant = make_tenant("csrf-co")
    member = make_member(tenant, role=MembershipRole.MEMBER)
    admin = make_user(platform_role=PlatformRole.SYSTEM_ADMIN)
    auditor = make_user(platform_role=PlatformRole.AUDITOR)
    job = job_submit(actor=member, spec=spec("csrf-co"))
    return {"node": node, "tenant": tenant, "member": member, "admin": admin, "auditor": auditor, "job": job}


def _attempts(world):
    """(who, url, form data or JSON body, how to tell it worked) for the console's and API's state changes."""
    job, node = world["job"], world["node"]
    return [
        (
            "member",
            "/console/jobs/submit/",
            {"j-spec_json": json.dumps(spec("csrf-co")), "submit_json": "1"},
            lambda: Job.objects.count() == 2,
        ),
        ("member", f"/console/jobs/{job.pk}/cancel/", {"reason": "x"}, lambda: _state(job) == JobState.CANCELLED),
        (
            "admin",
            f"/console/nodes/{node.pk}/action/",
            {"action": "cordon"},
            lambda: Node.objects.get(pk=node.pk).status == NodeStatus.CORDONED,
        ),
        ("member", "/api/v1/jobs/", {"json": spec("csrf-co")}, lambda: Job.objects.count() == 2),
        ("member", "/api/v1/tokens/", {"json": {"name": "stolen", "scope": "write"}}, _token_made),
        ("member", f"/api/v1/jobs/{job.pk}/cancel/", {"json": {"reason": "x"}}, lambda: _state(job) == "cancelled"),
    ]


def _state(job) -> str:
    return Job.objects.get(pk=job.pk).state


def _token_made() -> bool:
    from tenants.models import ApiToken

    return ApiToken.objects.filter(name="stolen").exists()


def _post(client: Client, url: str, data: dict, token: str | None):
    headers = {"X-CSRFToken": token} if token else {}
    if "json" in data:
        return client.post(url, data["json"], content_type="application/json", headers=headers)
    return client.post(url, data, headers=headers)


@pytest.mark.parametrize("index", range(6))
def test_a_state_change_without_the_csrf_token_is_refused(world, index):
    who, url, data, worked = _attempts(world)[index]
    client = signed_in(world[who])
    before = state_fingerprint()
    response = _post(client, url, data, token=None)
    assert response.status_code == 403, (url, response.status_code)
    assert_unchanged(before, state_fingerprint(), f"POST {url} without a CSRF token")
    assert not worked()
    # The same request with the token is accepted: the token, not the data, made the difference.
    response = _post(client, url, data, token=csrf_token(client))
    assert response.status_code < 400, (url, response.status_code, response.content[:300])
    assert worked(), url


def _console_urls(world) -> list[str]:
    ids = {"pk": world["job"].pk}
    urls = []

    def walk(patterns, prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith(("console/", "accounts/", "i18n/")):
                # Every id in the path (<int:pk>, <int:token_pk>, …) gets a real one: a 404 would hide the check.
                path = re.sub(r"<int:\w+>", str(ids["pk"]), route)
                urls.append("/" + path.replace("^", "").replace("$", ""))

    walk(get_resolver().url_patterns, "")
    return urls


def test_every_console_url_refuses_a_post_without_the_token(world):
    urls = _console_urls(world)
    assert len(urls) >= 20 and "/console/audit/export/" in urls, urls
    for who in ("admin", "member", "auditor"):
        client = signed_in(world[who])
        before = state_fingerprint()
        refused = {url: client.post(url, {"action": "cordon", "reason": "x"}).status_code for url in urls}
        assert {url: code for url, code in refused.items() if code != 403} == {}, who
        assert_unchanged(before, state_fingerprint(), f"token-less POSTs by {who}")


def test_signing_in_rotates_the_session_id_and_a_planted_one_is_worthless():
    user = make_user("fixation-victim")
    planted = SessionStore()
    planted["planted_by"] = "attacker"
    planted.create()
    victim = Client(enforce_csrf_checks=True)
    victim.cookies["sessionid"] = planted.session_key
    victim.get("/accounts/login/")
    response = victim.post(
        "/accounts/login/",
        {"username": user.username, "password": PASSWORD, "csrfmiddlewaretoken": csrf_token(victim)},
    )
    assert response.status_code == 302  # signed in
    new_key = victim.cookies["sessionid"].value
    assert new_key and new_key != planted.session_key
    assert victim.get("/api/v1/me/").status_code == 200
    # The attacker's copy of the old id is not signed in.
    attacker = Client()
    attacker.cookies["sessionid"] = planted.session_key
    assert attacker.get("/api/v1/me/").status_code in (401, 403)
    assert attacker.get("/console/overview/").status_code == 302
    assert not SessionStore().exists(planted.session_key)


def test_signing_out_ends_the_session_for_every_holder_of_the_id():
    user = make_user("signout-user")
    client = Client(enforce_csrf_checks=True)
    client.get("/accounts/login/")
    client.post(
        "/accounts/login/", {"username": user.username, "password": PASSWORD, "csrfmiddlewaretoken": csrf_token(client)}
    )
    key = client.cookies["sessionid"].value
    copy = Client()
    copy.cookies["sessionid"] = key
    assert copy.get("/api/v1/me/").status_code == 200
    response = client.post("/accounts/logout/", {"csrfmiddlewaretoken": csrf_token(client)})
    assert response.status_code == 302
    assert copy.get("/api/v1/me/").status_code in (401, 403)
    assert not SessionStore().exists(key)
