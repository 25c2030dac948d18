from __future__ import annotations

import pytest

from scheduler.fleet.models import NodeStatus
from tenants.models import MembershipRole, PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db


def test_anonymous_visitor_is_sent_to_login(client):
    response = client.get("/console/overview/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_overview_counts_capacity_per_flavor_and_node_status(client):
    h100 = make_flavor("nvidia-h100-80g")
    a100 = make_flavor("nvidia-a100-40g", memory_mib=40960)
    make_node("n1", devices=4, flavor=h100)
    make_node("n2", devices=2, flavor=a100, status=NodeStatus.CORDONED)
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.get("/console/overview/")
    assert response.status_code == 200
    summary = response.context["summary"]
    by_name = {f.name: f for f in summary.flavors}
    assert by_name["nvidia-h100-80g"].capacity_millis == 4000
    # A cordoned node's cards exist but take no new work.
    assert by_name["nvidia-a100-40g"].devices == 2
    assert by_name["nvidia-a100-40g"].capacity_millis == 0
    assert summary.nodes_ready == 1 and summary.nodes_not_ready == 1
    assert b"data-live-telemetry" in response.content


def test_home_sends_auditor_to_audit_and_admin_to_overview(client):
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    assert client.get("/")["Location"] == "/console/audit/"
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    assert client.get("/")["Location"] == "/console/overview/"


def test_auditor_reads_the_overview_but_lands_on_the_audit_trail(client):
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    assert client.get("/console/overview/").status_code == 200
    assert client.get("/")["Location"] == "/console/audit/"


def test_navigation_shows_only_what_the_role_may_use(client):
    tenant = make_tenant()
    client.force_login(make_member(tenant, role=MembershipRole.MEMBER))
    page = client.get("/console/overview/").content.decode()
    assert 'href="/console/overview/"' in page
    assert 'href="/console/nodes/"' not in page
    assert 'href="/console/audit/"' not in page
    # Members see the pool's numbers but not every node's live telemetry (they hold no cards yet).
    assert "data-live-telemetry" not in page


def test_numbers_fragment_renders_without_the_layout(client):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.get("/console/overview/numbers/")
    assert response.status_code == 200
    assert b"<html" not in response.content
    assert b'data-testid="nodes-ready"' in response.content


def test_member_overview_counts_only_their_tenants_jobs(client):
    from scheduler.services.jobs import job_submit

    make_flavor("nvidia-h100-80g")
    mine, other = make_tenant("mine"), make_tenant("other")
    me, them = make_member(mine), make_member(other)
    spec = {"resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1}, "command": ["true"]}
    job_submit(actor=me, spec={**spec, "name": "a", "tenant": "mine"})
    job_submit(actor=them, spec={**spec, "name": "b", "tenant": "other"})
    job_submit(actor=them, spec={**spec, "name": "c", "tenant": "other"})
    client.force_login(me)
    response = client.get("/console/overview/")
    assert response.context["own_jobs"] == {"queued": 1, "running": 0}
    assert response.context["summary"].jobs_queued == 3


def test_console_speaks_simplified_chinese(client):
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/overview/"})
    assert response.status_code == 302
    page = client.get("/console/overview/").content.decode()
    assert 'lang="zh-Hans"' in page
    assert "资源池概览" in page and "跳到正文" in page


def test_every_console_string_has_a_chinese_translation():
    from pathlib import Path

    catalogue = Path(__file__).resolve().parents[2] / "frontend/locale/zh_Hans/LC_MESSAGES/django.po"
    text = catalogue.read_text()
    entries = text.split("\n\n")[1:]
    untranslated = [e for e in entries if 'msgstr ""' in e and '\nmsgstr ""\n"' not in e + "\n" and "#~" not in e]
    assert untranslated == []
    # msgmerge's fuzzy guesses are not translations: none may slip into the catalogue.
    assert [e for e in entries if "#, fuzzy" in e and "#~" not in e] == []


def test_member_overview_charts_only_the_cards_their_tenant_holds(client):
    import datetime

    from django.utils import timezone

    from scheduler.models import Allocation
    from scheduler.services.jobs import job_submit

    flavor = make_flavor("nvidia-h100-80g")
    node = make_node("n1", devices=2, flavor=flavor)
    mine = make_tenant("mine")
    me = make_member(mine)
    job = job_submit(
        actor=me,
        spec={"name": "a", "tenant": "mine", "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]},
    )
    held, idle = list(node.devices.all())
    # As a scheduling cycle leaves it: one card held by the member's job.
    Allocation.objects.create(
        job=job,
        replica=0,
        tenant=mine,
        flavor=flavor,
        device=held,
        node=node,
        millis=1000,
        started_at=timezone.now() - datetime.timedelta(minutes=1),
    )
    client.force_login(me)
    response = client.get("/console/overview/")
    assert [d["uuid"] for d in response.context["chart_devices"]] == [held.uuid]
    assert response.context["subscribe_json"] == "[]"
    assert idle.uuid not in response.content.decode()


def test_overview_shows_utilisation_from_the_latest_telemetry(client, monkeypatch):
    from scheduler.fleet import telemetry

    # A private store: the test must not leave values in a Redis other tests read.
    store = telemetry.MemoryLatestStore()
    monkeypatch.setattr(telemetry, "latest_store", lambda: store)
    node = make_node("n1", devices=2, flavor=make_flavor("nvidia-h100-80g"))
    first, second = node.devices.all()
    store.put(node.pk, {first.uuid: {"utilization_pct": 80.0}, second.uuid: {"utilization_pct": 40.0}})
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.get("/console/overview/numbers/")
    assert response.context["summary"].flavors[0].utilisation_pct == 60.0
    assert 'data-flavor-util="nvidia-h100-80g">60%' in response.content.decode()
