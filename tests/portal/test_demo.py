"""``gpupool demo``'s data: the README's fleet, guarantees the pool can keep, and an hour of history (finished jobs,
telemetry minutes, quota requests) so the console has something to show at first login."""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from frontend.summaries import flavor_capacity, guarantee_overcommit
from nodeagent.demo import DEMO_NODES, demo_fleet_cards, demo_hello
from portal.demo import load_demo_data
from scheduler.fleet.models import Device, Node, TelemetryMinute
from scheduler.models import Allocation, Job, JobState
from scheduler.showback import usage_report
from tenants.models import ApprovalRequest, ApprovalStatus, Quota

pytestmark = pytest.mark.django_db

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def demo():
    started = time.perf_counter()
    assert load_demo_data(agents=len(DEMO_NODES)) is True
    print(f"demo data loaded in {time.perf_counter() - started:.2f} s")
    return timezone.now()


def test_readme_names_the_cards_the_demo_starts():
    sentence = re.search(r"(\d+) H100,\s+(\d+) A100\s+and\s+(\d+)\s+Ascend\s+910B\s+cards", README.read_text())
    assert sentence, "README.md no longer says which cards the demo runs"
    named = {"H100": int(sentence[1]), "A100": int(sentence[2]), "Ascend 910B": int(sentence[3])}
    assert named == demo_fleet_cards()
    assert len(DEMO_NODES) == settings.GPUPOOL_DEMO_AGENTS  # the default starts the whole fleet


def test_demo_nodes_hold_the_cards_their_agents_report(demo):
    for index in range(len(DEMO_NODES)):
        hello = demo_hello(index)
        node = Node.objects.get(name=hello["node_name"])
        assert node.status == "ready"
        assert sorted(node.devices.values_list("uuid", flat=True)) == sorted(d["uuid"] for d in hello["devices"])
    assert Device.objects.filter(flavor__isnull=True).count() == 0


def test_guarantees_fit_the_pool_and_loading_twice_changes_nothing(demo):
    assert guarantee_overcommit() == []
    capacity = {row.name: row.capacity_millis for row in flavor_capacity()}
    assert capacity == {"ascend-910b": 8000, "nvidia-a100-40g": 4000, "nvidia-h100-80g": 8000}
    for quota in Quota.objects.filter(tenant__slug="acme"):
        assert quota.guaranteed_millis == capacity[quota.flavor.name]
    counts = (Job.objects.count(), TelemetryMinute.objects.count(), ApprovalRequest.objects.count())
    assert load_demo_data() is False
    assert (Job.objects.count(), TelemetryMinute.objects.count(), ApprovalRequest.objects.count()) == counts


def test_the_last_hour_has_finished_jobs_on_every_flavor(demo):
    hour_ago = demo - dt.timedelta(minutes=61)
    finished = Job.objects.filter(state__in=[JobState.SUCCEEDED, JobState.FAILED])
    assert finished.count() >= 10
    assert finished.filter(state=JobState.FAILED, exit_code=1).exists()
    assert not finished.filter(finished_at__lt=hour_ago).exists()
    assert not finished.filter(finished_at__gt=demo).exists()
    # Spread over the hour, not all at load time.
    starts = sorted(finished.values_list("started_at", flat=True))
    assert starts[-1] - starts[0] > dt.timedelta(minutes=40)
    allocations = Allocation.objects.filter(job__in=finished)
    assert not allocations.filter(ended_at__isnull=True).exists()
    assert set(allocations.values_list("flavor__name", flat=True)) == {
        "nvidia-h100-80g",
        "nvidia-a100-40g",
        "ascend-910b",
    }
    job = finished.get(name="resnet50-train")
    events = list(job.events.values_list("to_state", "created_at"))
    assert [state for state, _ in events] == ["submitted", "queued", "admitted", "running", "succeeded"]
    assert [moment for _, moment in events] == sorted(moment for _, moment in events)
    assert job.log_chunks.first().text.startswith("epoch 1 of 30\n")
    # Two jobs wait for the live agents.
    assert set(Job.objects.filter(state=JobState.QUEUED).values_list("name", flat=True)) == {
        "resnet50-train-v2",
        "bert-finetune",
    }


def test_the_usage_report_of_the_last_hour_has_every_team(demo):
    report = usage_report(start=demo - dt.timedelta(hours=1), end=demo)
    own = {}
    for row in report.tenants:
        own[row.tenant] = own.get(row.tenant, 0) + row.own_device_hours
    assert {tenant for tenant, hours in own.items() if hours > 0} == {"acme-vision", "acme-nlp", "acme-research"}


def test_every_card_has_telemetry_minutes_that_follow_its_jobs(demo):
    devices = Device.objects.count()
    minutes = TelemetryMinute.objects.filter(minute__gte=demo - dt.timedelta(minutes=61))
    assert minutes.count() >= devices * 59
    assert minutes.values("device").distinct().count() == devices
    # bert-pretrain held four H100 cards from 52 to 18 minutes ago: they were busy, an idle card was not.
    job = Job.objects.get(name="bert-pretrain")
    busy_device = job.allocations.first().device_id
    middle = (job.started_at + (job.finished_at - job.started_at) / 2).replace(second=0, microsecond=0)
    assert minutes.get(device_id=busy_device, minute=middle).utilization_avg_pct > 50
    idle = minutes.filter(minute=middle, device__flavor__name="ascend-910b").exclude(
        device__allocations__started_at__lte=middle, device__allocations__ended_at__gt=middle
    )
    assert idle.exists() and all(row.utilization_avg_pct == 0 for row in idle)


def test_one_quota_request_was_granted_and_one_waits_for_the_system_admin(demo):
    from tenants.approval_chain import eligible_approvers

    granted = ApprovalRequest.objects.get(status=ApprovalStatus.APPROVED)
    assert granted.decided_at < demo - dt.timedelta(minutes=30)
    assert Quota.objects.get(tenant__slug="acme-nlp", flavor__name="ascend-910b").guaranteed_millis == 4000
    pending = ApprovalRequest.objects.get(status=ApprovalStatus.PENDING)
    assert pending.awaiting_role == "system_admin"
    approvers = eligible_approvers(pending.awaiting_role, pending.tenant, pending.requester_id)
    assert [user.username for user in approvers] == ["admin"]
    assert guarantee_overcommit() == []
