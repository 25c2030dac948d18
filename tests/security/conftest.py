"""Helpers of the security tests: a fingerprint of everything the product stores, to prove a refused request
changed nothing."""

from __future__ import annotations

import uuid

import pytest
from django.apps import apps

from tests.patching import patch_imported, patch_request_cycle

#: Apps whose tables hold product state (tenants, jobs, nodes, credentials, audit trail).
STATE_APPS = ("tenants", "scheduler", "fleet", "audit")
#: Columns that legitimately move on a refused request (a token's or credential's last use).
VOLATILE = {"last_used_at", "last_seen_at", "last_login"}


def state_fingerprint() -> dict[str, list[tuple]]:
    """Every row of every product table (minus volatile columns), ordered by primary key."""
    fingerprint: dict[str, list[tuple]] = {}
    for model in apps.get_models():
        if model._meta.app_label not in STATE_APPS or model._meta.proxy:
            continue
        columns = [f.attname for f in model._meta.concrete_fields if f.attname not in VOLATILE]
        fingerprint[model._meta.label] = list(model.objects.order_by("pk").values_list(*columns))
    return fingerprint


def assert_unchanged(before: dict[str, list[tuple]], after: dict[str, list[tuple]], what: str = "") -> None:
    changed = [label for label in before if before[label] != after.get(label)]
    assert not changed, f"{what}: these tables changed: {changed}"


@pytest.fixture(autouse=True)
def private_telemetry_prefix(settings, monkeypatch) -> None:
    """Latest telemetry under a key prefix of our own; scheduling cycles not queued to Celery."""
    settings.GPUPOOL_TELEMETRY_KEY_PREFIX = f"test-security-{uuid.uuid4().hex[:10]}"
    patch_imported(monkeypatch, "scheduler.fleet.services.notify.cycle_request_after_commit", lambda: None)
    patch_request_cycle(monkeypatch, lambda: None)


def fast_user(username: str | None = None, *, platform_role: str = ""):
    """A user with the shared test password (hashed once per run: Argon2 per user costs seconds on 2 cores)."""
    from tenants.models import PlatformRole
    from tests.factories import UserFactory

    fields = {"platform_role": platform_role or PlatformRole.NONE}
    return UserFactory(username=username, **fields) if username else UserFactory(**fields)


def fast_member(tenant, *, role: str = "member", username: str | None = None):
    """A member of ``tenant`` (through the service, so the membership is audited as in production)."""
    from tenants.services.memberships import membership_create

    user = fast_user(username)
    membership_create(actor=None, user=user, tenant=tenant, role=role)
    return user
