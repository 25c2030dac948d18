"""Live per-card values in the devices API (what `gpupool-cli top` shows): the latest telemetry, under the
same rule as a card's UUID — platform roles see every card, a tenant user only the cards their jobs hold."""

from __future__ import annotations

import pytest

from scheduler.fleet import telemetry
from scheduler.models import Allocation
from tests.scheduler.factories import JobFactory, SystemAdminFactory
from tests.scheduler.test_api import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def store(monkeypatch):
    # A private store: the test must not leave values in a Redis other tests read.
    store = telemetry.MemoryLatestStore()
    monkeypatch.setattr(telemetry, "latest_store", lambda: store)
    return store


def test_devices_carry_live_utilisation_only_for_cards_the_caller_may_see(store, member, node, tenant):
    from django.utils import timezone

    held, other = node.devices.order_by("index")[:2]
    store.put(
        node.pk,
        {held.uuid: {"utilization_pct": 80.0, "memory_used_mib": 4096}, other.uuid: {"utilization_pct": 55.0}},
    )
    job = JobFactory(tenant=tenant)
    Allocation.objects.create(
        job=job,
        replica=0,
        tenant=tenant,
        flavor=held.flavor,
        device=held,
        node=node,
        millis=1000,
        started_at=timezone.now(),
    )

    admin_rows = {
        row["index"]: row for row in client_for(SystemAdminFactory()).get("/api/v1/devices/").json()["results"]
    }
    assert (admin_rows[held.index]["utilization_pct"], admin_rows[held.index]["memory_used_mib"]) == (80.0, 4096)
    assert admin_rows[other.index]["utilization_pct"] == 55.0

    member_rows = {row["index"]: row for row in client_for(member).get("/api/v1/devices/").json()["results"]}
    assert member_rows[held.index]["utilization_pct"] == 80.0
    assert member_rows[other.index]["utilization_pct"] is None  # another tenant's card: no live values


def test_devices_answer_without_a_telemetry_store(monkeypatch, member, node):
    def down():
        raise OSError("redis is down")

    monkeypatch.setattr(telemetry, "latest_store", down)
    rows = client_for(member).get("/api/v1/devices/").json()["results"]
    assert rows and all(row["utilization_pct"] is None for row in rows)
