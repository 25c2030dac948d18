"""Settings come from the environment; embedded mode with nothing set, Redis mode with GPUPOOL_REDIS_URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json
import django
from django.conf import settings
django.setup()
print(json.dumps({
    "db_engine": settings.DATABASES["default"]["ENGINE"],
    "db_name": str(settings.DATABASES["default"]["NAME"]),
    "broker": settings.CELERY_BROKER_URL,
    "result_backend": settings.CELERY_RESULT_BACKEND,
    "layer": settings.CHANNEL_LAYERS["default"]["BACKEND"],
    "layer_hosts": settings.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("hosts"),
    "embedded": settings.EMBEDDED_MODE,
    "debug": settings.DEBUG,
    "allowed_hosts": settings.ALLOWED_HOSTS,
}))
"""


def _clean_env(**overrides: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUPOOL_")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.update(overrides)
    return env


def _load(settings_module: str = "portal.settings", **overrides: str) -> subprocess.CompletedProcess:
    env = _clean_env(DJANGO_SETTINGS_MODULE=settings_module, **overrides)
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def _settings(**overrides: str) -> dict:
    result = _load(**overrides)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_nothing_set_means_embedded_mode(tmp_path):
    loaded = _settings(GPUPOOL_DATA_DIR=str(tmp_path))
    assert loaded["embedded"] is True
    assert loaded["db_engine"] == "kernel.db.sqlite3"
    assert loaded["db_name"] == str(tmp_path / "gpupool.sqlite3")
    assert loaded["broker"].startswith("memory://")
    assert loaded["layer"] == "channels.layers.InMemoryChannelLayer"
    assert loaded["debug"] is False


def test_redis_url_switches_broker_and_channel_layer(tmp_path):
    loaded = _settings(GPUPOOL_DATA_DIR=str(tmp_path), GPUPOOL_REDIS_URL="redis://127.0.0.1:6379/7")
    assert loaded["embedded"] is False
    assert loaded["broker"] == "redis://127.0.0.1:6379/7"
    assert loaded["result_backend"] == "redis://127.0.0.1:6379/7"
    assert loaded["layer"] == "channels_redis.core.RedisChannelLayer"
    addresses = [host["address"] if isinstance(host, dict) else host for host in loaded["layer_hosts"]]
    assert addresses == ["redis://127.0.0.1:6379/7"]


def test_database_url_and_hosts_come_from_environment(tmp_path):
    loaded = _settings(
        GPUPOOL_DATA_DIR=str(tmp_path),
        GPUPOOL_DATABASE_URL="postgres://gp:secret@db.example:5433/pool",
        GPUPOOL_ALLOWED_HOSTS="pool.example.com, console.example.com",
        GPUPOOL_DEBUG="true",
    )
    assert loaded["db_engine"] == "kernel.db.postgresql"
    assert loaded["db_name"] == "pool"
    assert loaded["allowed_hosts"] == ["pool.example.com", "console.example.com"]
    assert loaded["debug"] is True


def test_bad_boolean_is_refused_with_the_variable_named(tmp_path):
    result = _load(GPUPOOL_DATA_DIR=str(tmp_path), GPUPOOL_DEBUG="maybe")
    assert result.returncode != 0
    assert "GPUPOOL_DEBUG='maybe' is not a boolean" in result.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"GPUPOOL_DEBUG": "1", "GPUPOOL_SECRET_KEY": "x" * 64}, "refuse to start with DEBUG enabled"),
        ({}, "GPUPOOL_SECRET_KEY is unset, the development default"),
        ({"GPUPOOL_SECRET_KEY": "short"}, "shorter than 50 characters"),
    ],
)
def test_production_settings_refuse_unsafe_configuration(tmp_path, overrides, message):
    result = _load("portal.production_settings", GPUPOOL_DATA_DIR=str(tmp_path), **overrides)
    assert result.returncode != 0
    assert message in result.stderr


def test_production_settings_start_with_a_real_key(tmp_path):
    result = _load("portal.production_settings", GPUPOOL_DATA_DIR=str(tmp_path), GPUPOOL_SECRET_KEY="k" * 64)
    assert result.returncode == 0, result.stderr
