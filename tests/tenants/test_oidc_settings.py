"""Single sign-on is off unless the GPUPOOL_OIDC_* variables are set; then the backend and URLs appear."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, django
from django.conf import settings
django.setup()
from django.urls import reverse
try:
    url = reverse("oidc_authentication_init")
except Exception:
    url = None
print(json.dumps({"enabled": settings.GPUPOOL_OIDC_ENABLED, "backends": settings.AUTHENTICATION_BACKENDS,
                  "token_url": getattr(settings, "OIDC_OP_TOKEN_ENDPOINT", None), "url": url}))
"""


def _probe(tmp_path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(DJANGO_SETTINGS_MODULE="portal.settings", GPUPOOL_DATA_DIR=str(tmp_path), **extra)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_oidc_is_off_by_default(tmp_path):
    loaded = _probe(tmp_path)
    assert loaded["enabled"] is False and loaded["url"] is None
    assert "tenants.oidc.GpupoolOIDCBackend" not in loaded["backends"]


def test_oidc_turns_on_with_issuer_and_client(tmp_path):
    loaded = _probe(tmp_path, GPUPOOL_OIDC_ISSUER_URL="https://sso.example.com/", GPUPOOL_OIDC_CLIENT_ID="gpupool")
    assert loaded["enabled"] is True
    assert loaded["backends"][0] == "tenants.authentication.LockoutBackend"
    assert "tenants.oidc.GpupoolOIDCBackend" in loaded["backends"]
    assert loaded["token_url"] == "https://sso.example.com/token"
    assert loaded["url"] == "/accounts/oidc/authenticate/"
