"""Production refuses the development audit keys; configuration errors name the variable and the fix."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from audit import conf
from audit.checks import audit_configuration
from audit.services import audit_record

ROOT = Path(__file__).resolve().parents[2]


def _key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def test_development_keys_are_refused_when_real_keys_are_required(settings):
    settings.GPUPOOL_AUDIT_REQUIRE_REAL_KEYS = True
    settings.GPUPOOL_AUDIT_MASTER_KEYS = ""
    settings.GPUPOOL_AUDIT_SIGNING_KEY = ""
    with pytest.raises(ImproperlyConfigured, match="GPUPOOL_AUDIT_MASTER_KEYS"):
        conf.master_keys()
    ids = {error.id for error in audit_configuration(None)}
    assert {"audit.E001", "audit.E002"} <= ids


@pytest.mark.django_db
def test_real_keys_satisfy_production(settings):
    settings.GPUPOOL_AUDIT_REQUIRE_REAL_KEYS = True
    settings.GPUPOOL_AUDIT_MASTER_KEYS = f"2026a:{_key()},2026b:{_key()}"
    settings.GPUPOOL_AUDIT_SIGNING_KEY = _key()
    assert audit_configuration(None) == []
    assert [kid for kid, _ in conf.master_keys()] == ["2026a", "2026b"]
    record = audit_record(action="user.create", actor=None)
    from audit.models import DataKey

    assert DataKey.objects.get(key_id=record.key_id).master_key_id == "2026b"  # the newest key wraps


def test_production_check_fails_without_an_audit_key_ring(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(
        DJANGO_SETTINGS_MODULE="portal.production_settings",
        GPUPOOL_SECRET_KEY="s" * 64,
        GPUPOOL_DATA_DIR=str(tmp_path),
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "audit.E001" in result.stderr and "GPUPOOL_AUDIT_MASTER_KEYS" in result.stderr
