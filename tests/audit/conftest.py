"""Audit tests write their witness file to a temporary directory and start from known keys."""

from __future__ import annotations

import pytest

from audit.services import append, records


@pytest.fixture(autouse=True)
def audit_settings(settings, tmp_path):
    settings.GPUPOOL_AUDIT_WITNESS_PATH = str(tmp_path / "witness.jsonl")
    settings.GPUPOOL_AUDIT_CIPHER = "aes-256-gcm"
    settings.GPUPOOL_AUDIT_ALERT_HOOK = ""
    settings.GPUPOOL_AUDIT_SIEM_URL = ""
    records.data_key_cache.clear()
    append._tenant_keys.clear()
    return settings
