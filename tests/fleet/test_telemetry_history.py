"""``GET /api/v1/telemetry/history/``: the minute rollups a live chart opens with, under the live stream's rule
(system admins every card; tenant users the cards their tenants hold now, from when they began to hold them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.fleet.api.views import TelemetryHistoryView
from scheduler.fleet.telemetry import minute_of
from scheduler.models import Allocation
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tenants.models import PlatformRole
from tests.fleet.rollup_data import write_minutes
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user
from tests.patching import patch_request_cycle

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 27, 14, 5, 20, tzinfo=UTC)
URL = "/api/v1/telemetry/history/"


@pytest.fixture
def fleet(settings, monkeypatch):
    """Two H100 cards on n1 (one held by team vision's job for the last 20 minutes), an A100 card on n2, and
    90 minutes of rollups for every card (utilisation: 10 times the card's index, plus minutes ago / 100)."""
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: None)
    monkeypatch.setattr(TelemetryHistoryView, "clock", staticmethod(lambda: NOW))
    h100, a100 = make_flavor("nvidia-h100-80g"), make_flavor("nvidia-a100-40g", memory_mib=40960)
    n1, n2 = make_node("n1", devices=2, flavor=h100), make_node("n2", devices=1, flavor=a100)
    vision = make_tenant("vision")
    bob = make_member(vision, username="bob")
    job = job_submit(
        actor=bob,
        spec={"name": "train", "tenant": "vision", "resources": {"flavors": [h100.name], "gpus": 1}, "command": ["x"]},
    )
    assert job.pk in run_cycle().placed
    Allocation.objects.filter(job=job).update(started_at=minute_of(NOW) - timedelta(minutes=20))
    held = Allocation.objects.get(job=job).device
    cards = [*n1.devices.all(), *n2.devices.all()]
    write_minutes(cards, now=NOW, minutes_back=90, utilisation=lambda d, ago: 10 * d.index + ago / 100)
    return {"n1": n1, "n2": n2, "bob": bob, "held": held, "cards": cards}


def get(client, user, **params):
    client.force_login(user)
    return client.get(URL, params)


def test_a_system_admin_gets_the_last_hour_of_every_card_of_a_node(client, fleet):
    response = get(client, make_user(platform_role=PlatformRole.SYSTEM_ADMIN), node=fleet["n1"].pk)
    assert response.status_code == 200
    devices = response.json()["devices"]
    assert [(d["node_name"], d["index"]) for d in devices] == [("n1", 0), ("n1", 1)]
    for device in devices:
        # 60 finished minutes, oldest first, each drawn at the middle of its minute.
        assert len(device["t"]) == len(device["utilization_pct"]) == 60
        oldest, newest = device["t"][0], device["t"][-1]
        assert newest == (minute_of(NOW) - timedelta(minutes=1)).timestamp() + 30
        assert newest - oldest == 59 * 60
        assert device["utilization_pct"][-1] == pytest.approx(10 * device["index"] + 0.01)
        assert device["memory_used_mib"][-1] == 1024 and device["power_w"][-1] == 200


def test_minutes_sets_how_far_back(client, fleet):
    admin = make_user(platform_role=PlatformRole.SYSTEM_ADMIN)
    devices = get(client, admin, minutes=15).json()["devices"]
    assert len(devices) == 3 and {len(d["t"]) for d in devices} == {15}


def test_a_tenant_user_gets_only_the_card_their_job_holds_from_when_it_began(client, fleet):
    response = get(client, fleet["bob"])
    assert response.status_code == 200
    [device] = response.json()["devices"]
    assert device["uuid"] == fleet["held"].uuid
    # Held for 20 minutes: what the card did for someone else before is not shown.
    assert len(device["t"]) == 20
    # A node or card they do not hold gives nothing, not another tenant's numbers.
    assert get(client, fleet["bob"], node=fleet["n2"].pk).json()["devices"] == []
    other = next(card for card in fleet["cards"] if card.pk != fleet["held"].pk)
    assert get(client, fleet["bob"], device=other.uuid).json()["devices"] == []


def test_a_tenant_user_whose_job_ended_gets_nothing(client, fleet):
    Allocation.objects.update(ended_at=NOW)
    assert get(client, fleet["bob"]).json()["devices"] == []


@pytest.mark.parametrize("role", [PlatformRole.AUDITOR, PlatformRole.SECURITY_ADMIN])
def test_platform_roles_other_than_system_admin_may_read_no_telemetry(client, fleet, role):
    response = get(client, make_user(platform_role=role))
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"


def test_a_member_of_a_tenant_holding_no_cards_gets_an_empty_history(client, fleet):
    # As on the live stream, which accepts any tenant user and sends nothing until their jobs hold cards.
    lonely = make_member(make_tenant("lonely"))
    assert get(client, lonely).json()["devices"] == []


def test_anonymous_callers_are_refused(client, fleet):
    assert client.get(URL).status_code in (401, 403)


def test_by_flavor_averages_the_cards_of_each_flavor_per_minute_in_one_query(client, fleet):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    with CaptureQueriesContext(connection) as queries:
        response = client.get(URL, {"by": "flavor"})
    rollup_reads = [q for q in queries.captured_queries if "telemetryminute" in q["sql"]]
    assert len(rollup_reads) == 1
    flavors = {f["flavor"]: f for f in response.json()["flavors"]}
    assert set(flavors) == {"nvidia-h100-80g", "nvidia-a100-40g"}
    h100 = flavors["nvidia-h100-80g"]
    assert len(h100["t"]) == 60 and set(h100["cards"]) == {2}
    # Cards 0 and 1 of n1 a minute ago: 0.01 and 10.01 → 5.01.
    assert h100["utilization_pct"][-1] == pytest.approx(5.01)


def test_by_flavor_for_a_tenant_user_counts_only_their_card(client, fleet):
    flavors = get(client, fleet["bob"], by="flavor").json()["flavors"]
    assert [(f["flavor"], len(f["t"]), set(f["cards"])) for f in flavors] == [("nvidia-h100-80g", 20, {1})]


@pytest.mark.parametrize(
    "params",
    [{"minutes": 0}, {"minutes": 1441}, {"by": "flavor", "node": 1}, {"by": "tenant"}, {"nodes": 1}],
)
def test_malformed_questions_are_400_with_the_parameter_named(client, fleet, params):
    response = get(client, make_user(platform_role=PlatformRole.SYSTEM_ADMIN), **params)
    assert response.status_code == 400
    assert set(response.json()["errors"]) & set(params)
