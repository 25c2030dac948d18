"""Security headers and cookies under ``portal.production_settings``, checked on real responses in a subprocess
(the settings module cannot be switched inside this test process): CSP without inline scripts, nosniff,
Referrer-Policy, frame denial, HSTS only over TLS (``X-Forwarded-Proto: https`` from the proxy), the TLS
redirect, Secure/HttpOnly/SameSite cookies, and ``manage.py check --deploy`` without a single issue.

tests/portal/test_settings.py covers which configurations production settings refuse to start with;
tests/frontend/test_csp_ready.py that the console's HTML needs no 'unsafe-inline'.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.frontend.test_csp_ready import assert_csp_clean

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct-horse-battery-staple"

PROBE = """
import json, re
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.test import Client
from tenants.models import User

User.objects.create_user("hdr-user", password=%(password)r)

def seen(response):
    return {
        "status": response.status_code,
        "location": response.headers.get("Location", ""),
        "headers": {name.lower(): value for name, value in response.headers.items()},
        "cookies": {
            name: {"secure": bool(m["secure"]), "httponly": bool(m["httponly"]), "samesite": m["samesite"]}
            for name, m in response.cookies.items()
        },
    }

out = {}
plain = Client()
out["http_login"] = seen(plain.get("/accounts/login/"))
out["http_healthz"] = seen(plain.get("/healthz"))
# Over TLS Django's CSRF check also wants a same-origin Referer, as a browser sends.
client = Client(
    enforce_csrf_checks=True,
    headers={"Host": "testserver", "X-Forwarded-Proto": "https", "Referer": "https://testserver/accounts/login/"},
)
page = client.get("/accounts/login/")
out["https_login_page"] = seen(page)
token = client.cookies["csrftoken"].value
out["https_login_post"] = seen(
    client.post("/accounts/login/", {"username": "hdr-user", "password": %(password)r, "csrfmiddlewaretoken": token})
)
out["https_api"] = seen(client.get("/api/v1/me/"))
out["https_docs"] = seen(client.get("/api/docs/"))
out["https_docs_html"] = client.get("/api/docs/").content.decode()
token = client.cookies["csrftoken"].value  # rotated at sign-in
out["https_setlang"] = seen(
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/", "csrfmiddlewaretoken": token})
)
print("PROBE " + json.dumps(out))
"""


def production_env(tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUPOOL_")}
    env.update(
        DJANGO_SETTINGS_MODULE="portal.production_settings",
        GPUPOOL_SECRET_KEY=secrets.token_urlsafe(64),
        GPUPOOL_AUDIT_MASTER_KEYS="k1:" + base64.b64encode(os.urandom(32)).decode(),
        GPUPOOL_AUDIT_SIGNING_KEY=base64.b64encode(os.urandom(32)).decode(),
        GPUPOOL_DATA_DIR=str(tmp_path),
        GPUPOOL_AUDIT_WITNESS_PATH=str(tmp_path / "witness.jsonl"),
        GPUPOOL_LOG_LEVEL="ERROR",
    )
    return env


@pytest.fixture(scope="module")
def responses(tmp_path_factory) -> dict:
    tmp_path = tmp_path_factory.mktemp("production")
    result = subprocess.run(
        [sys.executable, "-c", PROBE % {"password": PASSWORD}],
        cwd=ROOT,
        env=production_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE "))


def csp_directives(header: str) -> dict[str, list[str]]:
    directives = {}
    for part in header.split(";"):
        name, *values = part.split()
        directives[name] = values
    return directives


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=production_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


def test_plain_http_is_redirected_to_https_without_hsts(responses):
    login = responses["http_login"]
    assert login["status"] == 301 and login["location"].startswith("https://")
    assert "strict-transport-security" not in login["headers"]
    # The load balancer's health check stays on plain HTTP.
    assert responses["http_healthz"]["status"] in (200, 503)


@pytest.mark.parametrize("name", ["https_login_page", "https_login_post", "https_api", "https_docs"])
def test_every_response_over_tls_carries_the_security_headers(responses, name):
    headers = responses[name]["headers"]
    assert responses[name]["status"] < 400, responses[name]
    directives = csp_directives(headers["content-security-policy"])
    scripts = directives.get("script-src", directives["default-src"])
    assert "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts and "*" not in scripts
    assert directives["object-src"] == ["'none'"] and directives["frame-ancestors"] == ["'none'"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "same-origin"
    assert headers["x-frame-options"] == "DENY"
    hsts = [item.strip() for item in headers["strict-transport-security"].split(";")]
    assert int(hsts[0].removeprefix("max-age=")) >= 31536000 and "includeSubDomains" in hsts


def test_cookies_are_secure_httponly_and_samesite(responses):
    session = responses["https_login_post"]["cookies"]["sessionid"]
    assert responses["https_login_post"]["status"] == 302  # signed in
    assert session == {"secure": True, "httponly": True, "samesite": "Lax"}
    csrf = responses["https_login_page"]["cookies"]["csrftoken"]
    assert csrf["secure"] and csrf["samesite"] == "Lax"  # read by htmx from the page, so not HttpOnly
    language = responses["https_setlang"]["cookies"]["django_language"]
    assert language == {"secure": True, "httponly": True, "samesite": "Lax"}


def test_api_docs_page_runs_without_inline_script(responses):
    assert_csp_clean(responses["https_docs_html"], "/api/docs/")
