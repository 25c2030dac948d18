from __future__ import annotations

import datetime
import io

import pytest
from django.utils import timezone

from scheduler.models import Allocation
from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole, PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def usage_world():
    flavor = make_flavor("nvidia-h100-80g")
    node = make_node("n1", devices=2, flavor=flavor)
    acme = make_tenant("acme")
    vision = make_tenant("vision", parent=acme)
    globex = make_tenant("globex")
    bob = make_member(vision, username="bob")
    spec = {"resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1}, "command": ["true"]}
    # Yesterday 01:00-03:00 local time: within the default seven-day window and inside one daily period at
    # any hour the suite runs (three hours before "now" crossed midnight when CI ran at 01:04).
    start = timezone.localtime().replace(hour=1, minute=0, second=0, microsecond=0) - datetime.timedelta(days=1)
    devices = list(node.devices.all())
    for tenant, device, name in [(vision, devices[0], "v"), (globex, devices[1], "g")]:
        actor = bob if tenant == vision else make_member(globex)
        job = job_submit(actor=actor, spec={**spec, "name": name, "tenant": tenant.slug})
        # Two hours on one card, as a finished run leaves it (allocations are the scheduler's to write; the
        # report only reads them).
        Allocation.objects.create(
            job=job,
            replica=0,
            tenant=tenant,
            flavor=flavor,
            device=device,
            node=node,
            millis=1000,
            started_at=start,
            ended_at=start + datetime.timedelta(hours=2),
        )
    return {"acme": acme, "vision": vision, "globex": globex}


def test_system_admin_sees_device_hours_rolled_up_with_a_chart(client, usage_world):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.get("/console/reports/")
    rows = {(r.tenant, r.flavor): r for r in response.context["report"].tenants}
    assert rows[("vision", "nvidia-h100-80g")].own_device_hours == 2
    assert rows[("acme", "nvidia-h100-80g")].subtree_device_hours == 2
    assert rows[("globex", "nvidia-h100-80g")].own_device_hours == 2
    chart = response.context["chart"]
    assert sum(bar["total"] for bar in chart["bars"]) == 4  # own hours: no double counting up the tree
    assert b'class="barchart"' in response.content


def test_tenant_admin_report_covers_only_their_subtree(client, usage_world):
    client.force_login(make_member(usage_world["acme"], role=MembershipRole.TENANT_ADMIN))
    report = client.get("/console/reports/").context["report"]
    assert {r.tenant for r in report.tenants} == {"acme", "vision"}
    # Naming another tenant's slug is refused by the form: no numbers.
    today = timezone.now().date().isoformat()
    response = client.get(f"/console/reports/?start={today}&end={today}&period=day&tenant=globex")
    assert response.context["report"] is None and "tenant" in response.context["form"].errors


def test_report_downloads_as_csv_and_xlsx(client, usage_world):
    from openpyxl import load_workbook

    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    today = timezone.now().date()
    query = f"start={today - datetime.timedelta(days=1)}&end={today}&period=week"
    csv_body = client.get(f"/console/reports/?{query}&export=csv").content.decode()
    assert csv_body.splitlines()[0].startswith("period_start,tenant,parent,flavor")
    assert ",vision,acme,nvidia-h100-80g," in csv_body
    response = client.get(f"/console/reports/?{query}&export=xlsx")
    workbook = load_workbook(io.BytesIO(response.content))
    assert {"tenants", "detail"} <= set(workbook.sheetnames)


def test_reports_follow_the_policy_usage_view(client, usage_world):
    """usage.view: the auditor reads every tenant's usage, a member their own tenants' (as the API answers
    them); the security admin none."""
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    assert client.get("/console/reports/").status_code == 200
    client.force_login(make_member(usage_world["vision"]))
    assert client.get("/console/reports/").status_code == 200
    client.force_login(make_user(platform_role=PlatformRole.SECURITY_ADMIN))
    assert client.get("/console/reports/").status_code == 404
