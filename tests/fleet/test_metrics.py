"""/metrics: Prometheus text with dcgm-exporter names and labels, behind a bearer token or an admin session."""

from __future__ import annotations

import dataclasses
import re

import pytest
from django.test import Client
from django.utils import timezone

from scheduler.fleet import services
from scheduler.fleet.telemetry import latest_store
from scheduler.models import Allocation, Device, Job, JobState
from tests.factories import SystemAdminFactory, TenantFactory, UserFactory
from tests.fleet.conftest import hello, register_node

pytestmark = pytest.mark.django_db

# name{label="value",...} number — the exposition format's sample line.
SAMPLE_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*",?)*\})? -?[0-9.e+]+$')


@pytest.fixture
def fleet():
    node, _credential = register_node("gpu-01")
    services.node_hello(node_id=node.pk, hello=dataclasses.asdict(hello("gpu-01", devices=2)))
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
