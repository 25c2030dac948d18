"""Shared test plumbing.

Tests marked ``services`` need the real PostgreSQL and Redis. They are skipped when those are not
configured (a quick local run) and fail instead under ``GPUPOOL_REQUIRE_SERVICES=1``, which CI sets.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings


def services_required() -> bool:
    return os.environ.get("GPUPOOL_REQUIRE_SERVICES", "") == "1"


def skip_or_fail(reason: str) -> None:
    if services_required():
        pytest.fail(f"{reason} (GPUPOOL_REQUIRE_SERVICES=1, so this is a failure, not a skip)")
    pytest.skip(reason)


@pytest.fixture
def redis_url() -> str:
    """The configured Redis URL; the test is skipped (or fails in CI) when Redis is not configured."""
    if not settings.REDIS_URL:
        skip_or_fail("GPUPOOL_REDIS_URL is not set")
    return settings.REDIS_URL


@pytest.fixture
def postgres() -> None:
    """Require the PostgreSQL backend for this test."""
    if not settings.IS_POSTGRES:
        skip_or_fail("GPUPOOL_DATABASE_URL does not point at PostgreSQL")


@pytest.fixture(autouse=True)
def audit_witness_per_test(settings, tmp_path_factory, monkeypatch):
    """Every test gets its own audit witness file, also for the processes it starts (workers inherit the
    environment): a real worker seals the chain heads to the witness when it shuts down, and a witness shared
    across tests would hold checkpoints of a test database that a later test's flush has emptied."""
    path = str(tmp_path_factory.mktemp("audit-witness") / "witness.jsonl")
    settings.GPUPOOL_AUDIT_WITNESS_PATH = path
    monkeypatch.setenv("GPUPOOL_AUDIT_WITNESS_PATH", path)
    return path
