"""Issue 33, item 5: what an operator needs from the console without a shell — the platform's alerts (listed,
acknowledged), prices per card-hour (so the reports' cost is no longer "—"), a drained node shown as drained,
adding a node with an enrolment token (shown once, with the command line to run), and the pool table's live
utilisation the same figure for every role, saying what it is."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
from django.db import transaction
from django.test import Client

from audit.models import Alert, AuditRecord
from audit.services import raise_alert
from catalog.models import FlavorPrice
from scheduler.fleet.models import BootstrapToken, Node, NodeStatus
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Allocation
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole, PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user
from tests.patching import patch_request_cycle

pytestmark = pytest.mark.django_db


def signed_in(role: str) -> Client:
    client = Client()
    client.force_login(make_user(platform_role=role))
    return client


@pytest.fixture
def member_client():
    client = Client()
    client.force_login(make_member(make_tenant(), role=MembershipRole.TENANT_ADMIN))
    return client


@pytest.fixture
def running(settings, monkeypatch):
    """One node with a job placed on it by a real cycle (no quota needed)."""
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: None)
    flavor = make_flavor()
    node = make_node("gpu-a", devices=2, flavor=flavor)
    tenant = make_tenant("vision")
    owner = make_member(tenant, username="bob")
    spec = {
        "name": "train",
        "tenant": "vision",
        "resources": {"flavors": [flavor.name], "gpus": 1},
        "command": ["python", "train.py"],
    }
    job = job_submit(actor=owner, spec=spec)
    assert job.pk in run_cycle().placed
    return {"node": node, "job": job, "flavor": flavor, "owner": owner}


def _alert_row(page: str, alert: Alert) -> str:
    match = re.search(rf'<tr data-alert="{alert.pk}".*?</tr>', page, re.S)
    assert match, f"alert {alert.pk} is not listed"
    return match.group(0)


# --- (a) alerts ----------------------------------------------------------------------------------------------


def test_a_raised_alert_is_listed_for_admins_and_acknowledged_once_with_an_audit_record():
    raise_alert(event="audit.witness_failed", message="could not reach the witness: connection refused")
    alert = Alert.objects.get(event="audit.witness_failed")
    admin = signed_in(PlatformRole.SYSTEM_ADMIN)
    page = admin.get("/console/alerts/").content.decode()
    row = _alert_row(page, alert)
    assert "could not reach the witness: connection refused" in row and "open" in row
    assert 'href="/console/alerts/"' in page  # in the navigation

    response = admin.post("/console/alerts/acknowledge/", {"alert": alert.pk}, follow=True)
    assert response.status_code == 200 and "Alert acknowledged." in response.content.decode()
    alert.refresh_from_db()
    assert alert.acknowledged_at is not None and alert.acknowledged_by_username
    assert AuditRecord.objects.filter(action="alert.acknowledge", target=f"alert:{alert.pk}").count() == 1
    # Gone from the open list, shown with who acknowledged it in the full one; acknowledging again adds nothing.
    assert f'data-alert="{alert.pk}"' not in admin.get("/console/alerts/").content.decode()
    row = _alert_row(admin.get("/console/alerts/?show=all").content.decode(), alert)
    assert "acknowledged" in row and alert.acknowledged_by_username in row
    admin.post("/console/alerts/acknowledge/", {"alert": alert.pk})
    assert AuditRecord.objects.filter(action="alert.acknowledge", target=f"alert:{alert.pk}").count() == 1


def test_an_alert_repeating_while_open_is_one_row_counted_and_reopens_after_acknowledgement():
    for _ in range(3):
        raise_alert(event="audit.checkpoint_failed", message="not signing platform: no key")
    alert = Alert.objects.get(event="audit.checkpoint_failed")
    assert alert.times_raised == 3 and alert.last_raised_at >= alert.first_raised_at
    admin = signed_in(PlatformRole.SECURITY_ADMIN)
    admin.post("/console/alerts/acknowledge/", {"alert": alert.pk})
    raise_alert(event="audit.checkpoint_failed", message="not signing platform: no key")
    assert Alert.objects.filter(event="audit.checkpoint_failed").count() == 2
    assert Alert.objects.filter(event="audit.checkpoint_failed", acknowledged_at__isnull=True).get().times_raised == 1


def test_an_auditor_reads_alerts_but_cannot_acknowledge_them():
    raise_alert(event="audit.integrity_check", message="the scheduled audit integrity check found 1 problem(s)")
    alert = Alert.objects.get(event="audit.integrity_check")
    auditor = signed_in(PlatformRole.AUDITOR)
    page = auditor.get("/console/alerts/").content.decode()
    assert "Acknowledge" not in _alert_row(page, alert)
    assert auditor.post("/console/alerts/acknowledge/", {"alert": alert.pk}).status_code == 404
    alert.refresh_from_db()
    assert alert.acknowledged_at is None


def test_a_tenant_member_gets_404_for_alerts_and_no_link(member_client):
    raise_alert(event="audit.witness_failed", message="witness down")
    # Alerts raised inside other tests' transactions are written on a connection of their own and outlive them.
    alert = Alert.objects.get(event="audit.witness_failed", message="witness down", acknowledged_at__isnull=True)
    assert member_client.get("/console/alerts/").status_code == 404
    assert member_client.post("/console/alerts/acknowledge/", {"alert": alert.pk}).status_code == 404
    assert 'href="/console/alerts/"' not in member_client.get("/console/overview/").content.decode()
    alert.refresh_from_db()
    assert alert.acknowledged_at is None


@pytest.mark.django_db(transaction=True)
def test_an_alert_raised_in_a_transaction_that_rolls_back_is_still_kept():
    """A failed audit write rolls back the change it audits; the alert saying so must stay."""
    with pytest.raises(RuntimeError), transaction.atomic():
        raise_alert(event="audit.write_failed", message="could not write audit record 'job.submit'")
        raise RuntimeError("the caller's change fails")
    assert Alert.objects.filter(event="audit.write_failed", message__contains="'job.submit'").count() == 1


# --- (b) prices ----------------------------------------------------------------------------------------------


def test_a_system_admin_sets_a_price_in_the_console_and_the_report_shows_a_cost(running):
    admin = signed_in(PlatformRole.SYSTEM_ADMIN)
    flavor = running["flavor"]
    today = dt.date.today().isoformat()
    report_url = f"/console/reports/?start={today}&end={today}&period=day"
    before = admin.get(report_url).content.decode()
    assert 'href="/console/reports/prices/"' in before
    page = admin.get("/console/reports/prices/").content.decode()
    assert f'data-flavor="{flavor.name}"' in page and "not set" in page

    response = admin.post(
        "/console/reports/prices/",
        {"flavor": flavor.name, "price_per_device_hour": "12.5", "currency": "usd"},
        follow=True,
    )
    assert response.status_code == 200
    price = FlavorPrice.objects.get(flavor=flavor)
    assert (price.price_per_device_hour, price.currency) == (Decimal("12.5"), "USD")
    assert AuditRecord.objects.filter(action="flavor.price.set", target=f"flavor:{flavor.pk}").exists()
    assert "12.5" in response.content.decode()
    # The API reads the same price; the report's cost column now has a figure where it had "—".
    assert admin.get("/api/v1/flavor-prices/").json()["results"][0]["price_per_device_hour"] == "12.5000"
    table = re.search(r'data-testid="usage-table".*?</table>', admin.get(report_url).content.decode(), re.S)
    cost = re.findall(r"<td>([^<]*)</td></tr>", table.group(0))
    assert cost and "—" not in cost


def test_a_refused_price_is_shown_at_its_field_and_changes_nothing():
    flavor = make_flavor()
    admin = signed_in(PlatformRole.SYSTEM_ADMIN)
    response = admin.post(
        "/console/reports/prices/", {"flavor": flavor.name, "price_per_device_hour": "-1", "currency": "CNY"}
    )
    assert response.status_code == 200
    assert 'data-field-error="price_per_device_hour"' in response.content.decode()
    assert not FlavorPrice.objects.exists()


@pytest.mark.parametrize("role", [PlatformRole.AUDITOR, PlatformRole.SECURITY_ADMIN])
def test_only_a_system_admin_may_set_prices(role, member_client):
    flavor = make_flavor()
    for client in (signed_in(role), member_client):
        assert client.get("/console/reports/prices/").status_code == 404
        data = {"flavor": flavor.name, "price_per_device_hour": "1", "currency": "CNY"}
        assert client.post("/console/reports/prices/", data).status_code == 404
    assert 'href="/console/reports/prices/"' not in member_client.get("/console/reports/").content.decode()
    assert not FlavorPrice.objects.exists()


# --- (c) drained ---------------------------------------------------------------------------------------------


def _shown_status(page: str, node: Node) -> str:
    match = re.search(rf'href="/console/nodes/{node.pk}/".*?data-node-status="([a-z_]+)"', page, re.S)
    assert match, "the node's status badge is missing"
    return match.group(1)


def test_a_drained_node_shows_drained_once_its_jobs_have_stopped(running):
    admin = signed_in(PlatformRole.SYSTEM_ADMIN)
    node, job = running["node"], running["job"]
    admin.post(f"/console/nodes/{node.pk}/action/", {"action": "drain"})
    node.refresh_from_db()
    assert node.status == NodeStatus.DRAINING
    assert _shown_status(admin.get("/console/nodes/").content.decode(), node) == "draining"
    detail = admin.get(f"/console/nodes/{node.pk}/").content.decode()
    assert re.search(r'data-testid="node-status" data-node-status="draining"', detail)

    # The agent reports the replica stopped: the job is requeued, nothing holds the node any more.
    workload_status_report(
        node=node, job_id=job.pk, replica=0, state="stopped", exit_code=None, last_checkpoint_at=None
    )
    assert not Allocation.objects.active().filter(node=node).exists()
    assert _shown_status(admin.get("/console/nodes/").content.decode(), node) == "drained"
    detail = admin.get(f"/console/nodes/{node.pk}/").content.decode()
    assert re.search(r'data-testid="node-status" data-node-status="drained">drained<', detail)
    assert 'data-testid="node-drained-help"' in detail
    csv_lines = admin.get("/console/nodes/?export=csv").content.decode().splitlines()
    assert csv_lines[1].startswith("gpu-a,drained,")
    # The stored status is unchanged: the node still takes no work until it is returned to service.
    node.refresh_from_db()
    assert node.status == NodeStatus.DRAINING


def test_a_cordoned_or_ready_node_without_jobs_is_not_called_drained():
    admin = signed_in(PlatformRole.SYSTEM_ADMIN)
    ready = make_node("gpu-r", devices=1)
    cordoned = make_node("gpu-c", devices=1, status=NodeStatus.CORDONED)
    page = admin.get("/console/nodes/").content.decode()
    assert (_shown_status(page, ready), _shown_status(page, cordoned)) == ("ready", "cordoned")


# --- (d) adding a node ---------------------------------------------------------------------------------------


def test_a_system_admin_makes_an_enrolment_token_shown_once_with_the_command_that_registers_the_node(settings):
    admin = signed_in(PlatformRole.SYSTEM_ADMIN)
    assert 'href="/console/nodes/enrol/"' in admin.get("/console/nodes/").content.decode()
    page = admin.get("/console/nodes/enrol/").content.decode()
    assert f'value="{settings.GPUPOOL_BOOTSTRAP_TOKEN_TTL_S // 60}"' in page  # the default lifetime, in minutes

    response = admin.post("/console/nodes/enrol/", {"node_name": "gpu-07", "ttl_minutes": "30", "description": ""})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    page = response.content.decode()
    secret = re.search(r'id="enrol-token" type="text" readonly value="(gpb_[^"]+)"', page).group(1)
    command = re.search(r'data-testid="enrol-command">(.*?)</pre>', page, re.S).group(1)
    assert f"gpupool-agent register --server http://testserver --token {secret} --node-name gpu-07" in command
    assert "gpupool-agent run" in command
    token = BootstrapToken.objects.get()
    assert token.description == "gpu-07" and token.used_at is None
    lifetime = (token.expires_at - token.created_at).total_seconds()
    assert 29 * 60 < lifetime <= 30 * 60 + 5
    assert AuditRecord.objects.filter(action="agent.bootstrap_token.create").count() == 1

    # Shown once: the page afterwards lists the token by its prefix, never the secret.
    again = admin.get("/console/nodes/enrol/").content.decode()
    assert secret not in again and token.prefix in again

    # The token is the one the agent's register call takes (the same service as the CLI's), once.
    answer = Client().post(
        "/api/v1/agents/register/", {"token": secret, "node_name": "gpu-07"}, content_type="application/json"
    )
    assert answer.status_code in (200, 201), answer.content
    assert Node.objects.filter(name="gpu-07").exists()
    again = Client().post(
        "/api/v1/agents/register/", {"token": secret, "node_name": "gpu-08"}, content_type="application/json"
    )
    assert again.status_code == 401
    assert "used" in admin.get("/console/nodes/enrol/").content.decode()


def test_an_enrolment_token_with_a_bad_node_name_or_lifetime_is_refused_at_the_field():
    admin = signed_in(PlatformRole.SYSTEM_ADMIN)
    page = admin.post("/console/nodes/enrol/", {"node_name": "-bad name", "ttl_minutes": "0"}).content.decode()
    assert 'data-field-error="node_name"' in page and 'data-field-error="ttl_minutes"' in page
    assert not BootstrapToken.objects.exists()


@pytest.mark.parametrize("role", [PlatformRole.AUDITOR, PlatformRole.SECURITY_ADMIN])
def test_only_a_system_admin_may_make_enrolment_tokens(role, member_client):
    for client in (signed_in(role), member_client):
        assert client.get("/console/nodes/enrol/").status_code == 404
        assert client.post("/console/nodes/enrol/", {"ttl_minutes": "30"}).status_code == 404
    assert not BootstrapToken.objects.exists()


# --- (e) "Utilised (live)" -----------------------------------------------------------------------------------


def test_the_live_utilisation_is_the_pools_for_every_role_and_says_so(running, monkeypatch):
    from scheduler.fleet import telemetry

    store = telemetry.MemoryLatestStore()  # private: leaves nothing in a shared Redis
    monkeypatch.setattr(telemetry, "latest_store", lambda: store)
    node = running["node"]
    held = Allocation.objects.active().get(job=running["job"]).device
    idle = node.devices.exclude(pk=held.pk).get()
    store.put(node.pk, {held.uuid: {"utilization_pct": 90.0}, idle.uuid: {"utilization_pct": 10.0}})
    bob = Client()
    bob.force_login(running["owner"])
    pages = {
        "admin": signed_in(PlatformRole.SYSTEM_ADMIN).get("/console/overview/").content.decode(),
        "bob": bob.get("/console/overview/").content.decode(),
    }
    flavor = running["flavor"].name
    shown = {who: re.search(rf'data-flavor-util="{flavor}">([^<]*)<', page).group(1) for who, page in pages.items()}
    assert shown == {"admin": "50%", "bob": "50%"}  # (90 + 10) / 2: the pool's cards, whoever looks
    for page in pages.values():
        assert re.search(r'<th scope="col" title="[^"]+" data-testid="utilised-header">', page)
        assert 'data-testid="utilised-help"' in page
    # Only the pool-wide chart may repaint the table's figure live; bob's chart averages his tenants' cards.
    assert re.search(r"data-live-telemetry[^>]*data-pool-wide", pages["admin"])
    assert not re.search(r"data-live-telemetry[^>]*data-pool-wide", pages["bob"])
    assert "only the cards your tenants hold" in pages["bob"]
