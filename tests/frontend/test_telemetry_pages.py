"""The console's telemetry (issue 20, item 7): a fleet heatmap on the overview, charts that open with the stored
hour (their history URL) on the overview, node and job pages, compact per-card charts on the node page, and a
job's own share of a card it shares with other jobs."""

from __future__ import annotations

import datetime
import json
import re

import pytest
from django.utils import timezone

from scheduler.models import Allocation
from scheduler.services.jobs import job_submit
from tenants.models import PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def store(monkeypatch):
    """A private store of latest values: the test must not leave values in a Redis other tests read."""
    from scheduler.fleet import telemetry

    private = telemetry.MemoryLatestStore()
    monkeypatch.setattr(telemetry, "latest_store", lambda: private)
    return private


def _hold(job, device, millis: int) -> Allocation:
    """As a scheduling cycle leaves it."""
    return Allocation.objects.create(
        job=job,
        replica=0,
        tenant=job.tenant,
        flavor=device.flavor,
        device=device,
        node=device.node,
        millis=millis,
        started_at=timezone.now() - datetime.timedelta(minutes=5),
    )


def _submit(user, tenant: str, *, millis: int | None = None, name: str = "j"):
    resources = {"flavors": ["nvidia-h100-80g"], "gpus": 1}
    if millis:
        resources = {"flavors": ["nvidia-h100-80g"], "millis": millis, "memory_mib": 8192}
    return job_submit(actor=user, spec={"name": name, "tenant": tenant, "resources": resources, "command": ["x"]})


def _cells(page: str) -> list[dict[str, str]]:
    found = []
    for tag in re.findall(r"<span class=\"heat-cell [^>]*data-heat-uuid[^>]*>", page):
        found.append(dict(re.findall(r'([a-z-]+)="([^"]*)"', tag)))
    return found


def test_the_heatmap_has_a_cell_per_card_coloured_by_its_utilisation_and_rows_linking_to_nodes(client, store):
    flavor = make_flavor("nvidia-h100-80g")
    nodes = [make_node(f"n{i}", devices=4, flavor=flavor) for i in range(3)]
    readings = {}
    for row, node in enumerate(nodes):
        values = {}
        for device in node.devices.order_by("index"):
            if (row, device.index) != (2, 3):  # one card has sent nothing lately
                values[device.uuid] = {"utilization_pct": 10.0 * row + 30.0 * device.index}
            readings[device.uuid] = values.get(device.uuid, {}).get("utilization_pct")
        store.put(node.pk, values)
    tenant = make_tenant("t")
    member = make_member(tenant)
    first = nodes[0].devices.get(index=0)
    _hold(_submit(member, "t", millis=300, name="a"), first, 300)
    _hold(_submit(member, "t", name="b"), nodes[0].devices.get(index=1), 1000)
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))

    page = client.get("/console/overview/").content.decode()

    cells = _cells(page)
    assert len(cells) == 3 * 4
    by_uuid = {cell["data-heat-uuid"]: cell for cell in cells}
    for uuid, utilisation in readings.items():
        level = "hn" if utilisation is None else f"h{round(utilisation / 10)}"
        assert level in by_uuid[uuid]["class"].split(), (uuid, utilisation)
    # Each cell says what its colour shows; the silent card says so.
    assert by_uuid[nodes[2].devices.get(index=2).uuid]["aria-label"] == "n2, card 2: 80% utilised, 0% allocated"
    assert by_uuid[nodes[2].devices.get(index=3).uuid]["aria-label"] == "n2, card 3: no data, 0% allocated"
    # Allocation is the outline: a 0.3 share, a whole card, nothing.
    assert "a-part" in by_uuid[first.uuid]["class"] and "30% allocated" in by_uuid[first.uuid]["aria-label"]
    assert "a-full" in by_uuid[nodes[0].devices.get(index=1).uuid]["class"]
    assert "a-free" in by_uuid[nodes[1].devices.get(index=0).uuid]["class"]
    # The script fills "{util}" with each live reading.
    assert by_uuid[first.uuid]["data-heat-label"] == "n0, card 0: {util}, 30% allocated"
    rows = re.findall(r'<a class="heat-row" href="([^"]+)"[^>]*><span class="heat-name">([^<]+)<', page)
    assert rows == [(f"/console/nodes/{node.pk}/", node.name) for node in nodes]
    # A text alternative: the same readings as a table.
    table = page[page.index('<details class="heat-table">') :]
    assert f'<a href="/console/nodes/{nodes[0].pk}/">n0</a></th><td>#0 0% (30%) · #1 30% (100%)' in table


def test_the_heatmap_stays_small_for_a_hundred_nodes_of_eight_cards(client, store, django_assert_max_num_queries):
    flavor = make_flavor("nvidia-h100-80g")
    for i in range(100):
        make_node(f"node{i:03d}", devices=8, flavor=flavor)
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    from frontend.summaries import fleet_heatmap

    with django_assert_max_num_queries(2):
        rows = fleet_heatmap()
    assert len(rows) == 100 and {len(row.cells) for row in rows} == {8}
    page = client.get("/console/overview/").content.decode()
    heatmap = page[page.index('data-testid="fleet-heatmap"') : page.index("</details>")]
    assert heatmap.count("data-heat-uuid=") == 800
    # Under 300 bytes a card, its label and the table's line included: the page does not balloon with the fleet.
    assert len(heatmap.encode()) < 800 * 300


def test_tenant_users_get_no_heatmap(client, store):
    make_node("n1", devices=2, flavor=make_flavor("nvidia-h100-80g"))
    client.force_login(make_member(make_tenant("t")))
    assert "data-heatmap" not in client.get("/console/overview/").content.decode()


def test_charts_open_with_the_stored_hour(client, store):
    flavor = make_flavor("nvidia-h100-80g")
    node = make_node("n1", devices=2, flavor=flavor)
    tenant = make_tenant("t")
    member = make_member(tenant)
    job = _submit(member, "t")
    _hold(job, node.devices.get(index=0), 1000)
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    overview = client.get("/console/overview/").content.decode()
    assert 'data-history="/api/v1/telemetry/history/?by=flavor&amp;minutes=60"' in overview
    node_page = client.get(f"/console/nodes/{node.pk}/").content.decode()
    assert f'data-history="/api/v1/telemetry/history/?node={node.pk}&amp;minutes=60"' in node_page
    client.force_login(member)
    job_page = client.get(f"/console/jobs/{job.pk}/").content.decode()
    uuid = node.devices.get(index=0).uuid
    assert f'data-history="/api/v1/telemetry/history/?minutes=60&amp;device={uuid}"' in job_page
    # The same URL answers the member with that card's history (their tenant holds it).
    response = client.get("/api/v1/telemetry/history/", {"minutes": 60, "device": uuid})
    assert response.status_code == 200 and response.json()["devices"] == []  # no rollups stored yet


def test_the_node_page_shows_its_cards_as_small_multiples(client, store):
    node = make_node("n1", devices=8, flavor=make_flavor("nvidia-h100-80g"))
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    page = client.get(f"/console/nodes/{node.pk}/").content.decode()
    assert re.search(r"<section data-live-telemetry[^>]*data-compact", page)
    assert 'class="chart-grid compact"' in page
    assert page.count('data-testid="card-panel"') == 8
    # Compact charts draw utilisation and memory; power and temperature stay in the latest-values line.
    assert "data-label-power" not in page


def test_a_job_on_a_shared_card_charts_its_own_share(client, store):
    flavor = make_flavor("nvidia-h100-80g")
    node = make_node("n1", devices=2, flavor=flavor)
    shared, whole = node.devices.order_by("index")
    mine, theirs = make_tenant("mine"), make_tenant("rival")
    me, them = make_member(mine), make_member(theirs)
    job = _submit(me, "mine", millis=300, name="small")
    _hold(job, shared, 300)
    _hold(_submit(them, "rival", millis=500, name="secret-run"), shared, 500)
    big = _submit(me, "mine", name="big")
    _hold(big, whole, 1000)
    client.force_login(me)

    page = client.get(f"/console/jobs/{job.pk}/").content.decode()

    devices = json.loads(re.search(r'<script id="job-devices" type="application/json">(.*?)</script>', page).group(1))
    assert devices == [
        {
            "uuid": shared.uuid,
            "label": "n1/0",
            "flavor": flavor.name,
            "memory_mib": flavor.memory_mib,
            "job_millis": 300,
            "card_allocated_millis": 800,
        }
    ]
    assert "This job holds 0.3 of this card" in page and "the rest is other jobs" in page
    # Nothing says whose the other work is.
    assert "rival" not in page.lower() and "secret-run" not in page
    # A job on a whole card charts the card as it is.
    whole_page = client.get(f"/console/jobs/{big.pk}/").content.decode()
    assert '"job_millis"' not in whole_page and 'data-testid="job-share"' not in whole_page
