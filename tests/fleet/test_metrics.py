"""/metrics: Prometheus text with dcgm-exporter names and labels, behind a bearer token or an admin session."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

import pytest
from django.test import Client
from django.utils import timezone

from scheduler.fleet.models import Device
from scheduler.fleet.services.inventory import node_hello
from scheduler.fleet.telemetry import latest_store
from scheduler.models import Allocation, Job, JobState
from tests.factories import SystemAdminFactory, TenantFactory, UserFactory
from tests.fleet.conftest import hello, register_node

pytestmark = pytest.mark.django_db

# name{label="value",...} number — the exposition format's sample line.
SAMPLE_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*",?)*\})? -?[0-9.e+]+$')


@pytest.fixture
def fleet():
    node, _credential = register_node("gpu-01")
    node_hello(node_id=node.pk, hello=dataclasses.asdict(hello("gpu-01", devices=2)))
    device = Device.objects.get(uuid="GPU-gpu-01-0")
    tenant = TenantFactory(slug="vision")
    job = Job.objects.create(
        tenant=tenant,
        name="train",
        millis_per_replica=500,
        memory_mib_per_replica=1000,
        flavors=[device.flavor.name],
        state=JobState.RUNNING,
    )
    Allocation.objects.create(
        job=job,
        replica=0,
        tenant=tenant,
        flavor=device.flavor,
        device=device,
        node=node,
        millis=500,
        memory_mib=1000,
        started_at=timezone.now(),
    )
    values = {
        "utilization_pct": 87.0,
        "memory_used_mib": 4096,
        "memory_total_mib": 81559,
        "power_w": 312.5,
        "temperature_c": 64.0,
        "sm_clock_mhz": 1980,
        "ecc_errors": 0,
        "xid_errors": None,
    }
    latest_store().put(node.pk, {"GPU-gpu-01-0": values, "GPU-gpu-01-1": {**values, "utilization_pct": 5.0}})
    return node


def scrape(client: Client, **headers) -> str:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return response.content.decode()


def test_metrics_use_dcgm_names_and_labels_with_the_tenant(fleet, settings):
    settings.GPUPOOL_METRICS_TOKEN = "scrape-secret"
    text = scrape(Client(), Authorization="Bearer scrape-secret")
    util = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert len(util) == 2
    line = next(line for line in util if 'UUID="GPU-gpu-01-0"' in line)
    for label in ['gpu="0"', 'node="gpu-01"', 'modelName="NVIDIA H100 80GB HBM3"', 'tenant="vision"']:
        assert label in line
    assert line.endswith(" 87.0")
    assert 'tenant=""' in next(line for line in util if 'UUID="GPU-gpu-01-1"' in line)
    for name in ["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK"]:
        assert f"# TYPE {name} gauge" in text
    assert re.search(r'^DCGM_FI_DEV_FB_FREE\{.*UUID="GPU-gpu-01-0".*\} 77463$', text, re.M)
    assert "DCGM_FI_DEV_XID_ERRORS" not in text  # unknown values are left out, not reported as 0
    assert 'gpupool_node_ready{node="gpu-01",status="ready"} 1' in text
    assert 'gpupool_jobs{state="running"} 1' in text
    assert re.search(r'^gpupool_allocated_millis\{flavor="[^"]+"\} 500$', text, re.M)


def test_every_line_is_valid_exposition_format(fleet):
    client = Client()
    client.force_login(SystemAdminFactory())
    for line in scrape(client).splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or SAMPLE_LINE.match(line), line


def test_label_values_are_escaped():
    from scheduler.fleet.metrics import _labels

    assert _labels({"modelName": 'a "b" \\ c\nd'}) == '{modelName="a \\"b\\" \\\\ c\\nd"}'


def test_metrics_refuse_anonymous_wrong_tokens_and_non_admins(fleet, settings):
    settings.GPUPOOL_METRICS_TOKEN = "scrape-secret"
    response = Client().get("/metrics")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    assert Client().get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    member = Client()
    member.force_login(UserFactory())
    assert member.get("/metrics").status_code == 401


def test_without_a_configured_token_no_bearer_is_accepted(fleet, settings):
    settings.GPUPOOL_METRICS_TOKEN = ""
    assert Client().get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401


# --- pool, tenants, queue, audit sealing, deadlocks (what the Grafana dashboard and the alert rules read) -----


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels``; None when there is none."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def admin_scrape() -> str:
    client = Client()
    client.force_login(SystemAdminFactory())
    return scrape(client)


def test_pool_capacity_per_card_allocation_and_tenant_usage_against_its_quota(fleet):
    from tenants.services.quotas import quota_set

    device = Device.objects.get(uuid="GPU-gpu-01-0")
    tenant = Job.objects.get(name="train").tenant
    quota_set(actor=None, tenant=tenant, flavor=device.flavor, values={"guaranteed_millis": 1000, "limit_millis": 2000})
    Job.objects.create(tenant=tenant, name="waits", millis_per_replica=1000, state=JobState.QUEUED)
    flavor = device.flavor.name

    text = admin_scrape()

    assert metric_value(text, "gpupool_capacity_millis", flavor=flavor) == 2000  # two ready cards
    assert metric_value(text, "gpupool_device_allocated_millis", UUID="GPU-gpu-01-0", node="gpu-01") == 500
    assert metric_value(text, "gpupool_device_allocated_millis", UUID="GPU-gpu-01-1") is None  # nothing on it
    assert metric_value(text, "gpupool_tenant_allocated_millis", tenant="vision", flavor=flavor) == 500
    assert metric_value(text, "gpupool_tenant_guaranteed_millis", tenant="vision", flavor=flavor) == 1000
    assert metric_value(text, "gpupool_tenant_limit_millis", tenant="vision", flavor=flavor) == 2000
    assert metric_value(text, "gpupool_tenant_jobs", tenant="vision", state="running") == 1
    assert metric_value(text, "gpupool_tenant_jobs", tenant="vision", state="queued") == 1
    assert metric_value(text, "gpupool_queue_oldest_pending_seconds") >= 0

    fleet.status = "not_ready"
    fleet.save(update_fields=["status"])
    assert metric_value(admin_scrape(), "gpupool_capacity_millis", flavor=flavor) is None  # nothing placeable


def test_without_per_card_series_a_scrape_keeps_the_pool_and_reads_no_latest_value(fleet, settings, monkeypatch):
    """GPUPOOL_METRICS_PER_CARD off: a fleet whose Prometheus scrapes dcgm-exporter on the nodes gets the pool,
    tenant, queue and node series from gpupool, and no per-card line (nor the Redis read behind them)."""
    flavor = Device.objects.get(uuid="GPU-gpu-01-0").flavor.name
    with_cards = admin_scrape()
    assert "DCGM_FI_DEV_GPU_UTIL{" in with_cards and "gpupool_device_allocated_millis{" in with_cards

    settings.GPUPOOL_METRICS_PER_CARD = False
    store = latest_store()
    monkeypatch.setattr(store, "get_nodes", lambda _ids: pytest.fail("per-card values read"))
    text = admin_scrape()
    assert not [line for line in text.splitlines() if line.startswith("DCGM_") or "UUID=" in line]
    assert 'gpupool_node_ready{node="gpu-01",status="ready"} 1' in text
    assert metric_value(text, "gpupool_capacity_millis", flavor=flavor) == 2000
    assert metric_value(text, "gpupool_tenant_allocated_millis", tenant="vision", flavor=flavor) == 500
    assert len(text) < len(with_cards)


def test_queue_wait_quantiles_cover_the_jobs_admitted_in_the_last_15_minutes(fleet):
    tenant = TenantFactory()
    now = timezone.now()

    def admitted(*, wait_s: float, admitted_ago_s: float, requeued: bool = False) -> None:
        admitted_at = now - dt.timedelta(seconds=admitted_ago_s)
        queued_at = admitted_at + dt.timedelta(seconds=5) if requeued else admitted_at - dt.timedelta(seconds=wait_s)
        job = Job.objects.create(tenant=tenant, name="q", millis_per_replica=100, state=JobState.RUNNING)
        Job.objects.filter(pk=job.pk).update(queued_at=queued_at, admitted_at=admitted_at)

    for wait_s in range(1, 21):  # 20 jobs admitted within the window, waits of 1..20 s
        admitted(wait_s=wait_s, admitted_ago_s=60)
    admitted(wait_s=5000, admitted_ago_s=3600)  # admitted an hour ago: outside the window
    admitted(wait_s=0, admitted_ago_s=60, requeued=True)  # queued again since: not admitted from this queueing

    text = admin_scrape()

    assert metric_value(text, "gpupool_queue_wait_jobs") == 20
    assert metric_value(text, "gpupool_queue_wait_seconds", quantile="0.5") == pytest.approx(10, abs=0.01)
    assert metric_value(text, "gpupool_queue_wait_seconds", quantile="0.95") == pytest.approx(19, abs=0.01)


def test_no_admission_in_the_window_leaves_the_quantiles_out(fleet):
    text = admin_scrape()
    assert metric_value(text, "gpupool_queue_wait_jobs") == 0
    assert "# TYPE gpupool_queue_wait_seconds gauge" in text
    assert metric_value(text, "gpupool_queue_wait_seconds", quantile="0.95") is None


def test_audit_sealing_lag_grows_until_beat_seals_and_witnesses(fleet, settings):
    from django.test import TestCase

    from audit import selectors as audit_selectors
    from audit.services import checkpoint_all

    settings.GPUPOOL_AUDIT_CHECKPOINT_SECONDS, settings.GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS = 5, 25
    later = timezone.now() + dt.timedelta(seconds=100)
    # Registering the node wrote audit records that no checkpoint covers yet.
    assert audit_selectors.unwitnessed_record_age_seconds(now=later) >= 100
    text = admin_scrape()
    assert metric_value(text, "gpupool_audit_unwitnessed_seconds") >= 0
    assert metric_value(text, "gpupool_audit_witness_window_seconds") == 30

    with TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint_all()

    assert audit_selectors.unwitnessed_record_age_seconds(now=later) == 0
    settings.GPUPOOL_METRICS_TOKEN = "scrape-secret"  # a scraper, not a sign-in (which is audited)
    assert (
        metric_value(scrape(Client(), Authorization="Bearer scrape-secret"), "gpupool_audit_unwitnessed_seconds") == 0
    )


def test_the_deadlock_counter_is_postgresql_s_and_absent_elsewhere(fleet):
    from django.db import connection

    text = admin_scrape()
    if connection.vendor != "postgresql":
        assert "gpupool_database_deadlocks_total" not in text
        return
    assert "# TYPE gpupool_database_deadlocks_total counter" in text
    with connection.cursor() as cursor:
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        expected = cursor.fetchone()[0]
    assert metric_value(text, "gpupool_database_deadlocks_total") == expected


@pytest.mark.services
def test_a_deadlock_between_two_sessions_raises_the_deadlock_counter(fleet, postgres):
    import threading
    import time

    import psycopg
    from django.db import connection

    before = metric_value(admin_scrape(), "gpupool_database_deadlocks_total")
    params = connection.settings_dict
    conninfo = {
        "dbname": params["NAME"],
        "user": params["USER"],
        "password": params["PASSWORD"],
        "host": params["HOST"],
        "port": params["PORT"],
    }
    first, second = psycopg.connect(**conninfo), psycopg.connect(**conninfo)
    refused: list[str] = []

    def lock(session, key: int) -> None:
        try:
            session.execute("SELECT pg_advisory_xact_lock(%s)", [key])
        except psycopg.errors.DeadlockDetected:
            refused.append("deadlock")
        session.rollback()

    try:
        first.execute("SELECT pg_advisory_xact_lock(910001)")
        second.execute("SELECT pg_advisory_xact_lock(910002)")
        waiter = threading.Thread(target=lock, args=(first, 910002))
        waiter.start()
        time.sleep(0.3)
        lock(second, 910001)  # each now waits for the other: PostgreSQL breaks the cycle after deadlock_timeout
        waiter.join(timeout=30)
    finally:
        first.close()
        second.close()  # a closing session flushes its statistics
    assert refused == ["deadlock"]

    deadline = time.monotonic() + 10
    while metric_value(admin_scrape(), "gpupool_database_deadlocks_total") == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric_value(admin_scrape(), "gpupool_database_deadlocks_total") == before + 1
