"""Numbers you can trust (issue 20, item 5): a known state — 0.3 of a card on an 8-card node, a cordoned
flavor, a borrowed share — and the figure each page shows for it."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from scheduler.fleet.models import NodeStatus
from scheduler.models import Allocation
from scheduler.services.jobs import job_submit
from tenants.models import PlatformRole
from tenants.services.quotas import quota_set
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db


def _allocate(*, job, tenant, device, millis: int, borrowed_millis: int = 0) -> Allocation:
    """As a scheduling cycle leaves it."""
    return Allocation.objects.create(
        job=job,
        replica=0,
        tenant=tenant,
        flavor=device.flavor,
        device=device,
        node=device.node,
        millis=millis,
        borrowed_millis=borrowed_millis,
        started_at=timezone.now() - datetime.timedelta(minutes=5),
    )


@pytest.fixture
def fractional_on_eight(db):
    """0.3 of one card of an 8-card node, held by a job of team ``t``."""
    flavor = make_flavor("nvidia-h100-80g")
    node = make_node("big", devices=8, flavor=flavor)
    tenant = make_tenant("t")
    member = make_member(tenant)
    job = job_submit(
        actor=member,
        spec={
            "name": "frac",
            "tenant": "t",
            "resources": {"flavors": [flavor.name], "millis": 300, "memory_mib": 8192},
            "command": ["x"],
        },
    )
    _allocate(job=job, tenant=tenant, device=node.devices.order_by("index").first(), millis=300)
    return node


def test_the_nodes_table_shows_the_allocated_share_once_not_once_per_card(client, fractional_on_eight):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.get("/console/nodes/")
    row = next(node for node in response.context["table"].data.data if node.name == "big")
    assert row.allocated_millis == 300
    assert row.device_count == 8
    csv = client.get("/console/nodes/?export=csv").content.decode()
    assert ",0.3," in csv or ",0.3\r" in csv or ",0.3\n" in csv, csv


def test_the_overview_bar_is_empty_when_nothing_is_schedulable(client, fractional_on_eight):
    fractional_on_eight.status = NodeStatus.CORDONED
    fractional_on_eight.save()
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))

    response = client.get("/console/overview/numbers/")

    flavor = response.context["summary"].flavors[0]
    assert (flavor.capacity_millis, flavor.allocated_millis, flavor.allocated_unschedulable_millis) == (0, 0, 300)
    text = response.content.decode()
    assert "0 of 0 cards allocated" in text
    assert "+ 0.3 on unschedulable cards" in text
    bar = text.split("0 of 0 cards allocated", 1)[1].split("</svg>", 1)[0]
    assert 'class="used" x="0" y="4" width="0.00"' in bar  # was a full bar: 0.3 of "at least 1 milli"


def test_the_overview_counts_a_ready_node_against_its_capacity(client, fractional_on_eight):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    flavor = client.get("/console/overview/numbers/").context["summary"].flavors[0]
    assert (flavor.capacity_millis, flavor.allocated_millis, flavor.allocated_unschedulable_millis) == (8000, 300, 0)


def test_a_borrowed_share_is_shown_above_the_guarantee(client):
    flavor = make_flavor("nvidia-h100-80g")
    node = make_node("n", devices=2, flavor=flavor)
    company = make_tenant("co")
    team = make_tenant("team", parent=company)
    quota_set(actor=None, tenant=company, flavor=flavor, values={"guaranteed_millis": 2000})
    quota_set(actor=None, tenant=team, flavor=flavor, values={"guaranteed_millis": 1000})
    member = make_member(team)
    job = job_submit(
        actor=member,
        spec={"name": "two", "tenant": "team", "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]},
    )
    first, second = node.devices.order_by("index")
    _allocate(job=job, tenant=team, device=first, millis=1000)
    _allocate(job=job, tenant=team, device=second, millis=500, borrowed_millis=500)

    client.force_login(member)
    response = client.get(f"/console/tenants/{team.pk}/")
    row = response.context["quotas"][0]
    assert (row.guaranteed, row.in_use, row.borrowed) == (1000, 1500, 500)
    assert "1.5 cards in use of 1 guaranteed, 0.5 borrowed" in response.content.decode()
