from datetime import UTC, datetime

import pytest

from audit.models import AuditRecord
from audit.services import record_details
from kernel.api import ConflictError, NotFoundError, PermissionDeniedError
from scheduler.core import types as core
from scheduler.fleet.models import AgentCommand
from scheduler.fleet.services.nodes import node_cordon, node_drain
from scheduler.fleet.services.workload_reports import (
    jobs_awaiting_stop_sweep,
    node_jobs_requeue,
    workload_status_report,
)
from scheduler.models import Allocation, Job, JobEvent, JobState
from scheduler.persist import persist_plan
from scheduler.services.jobs import job_cancel, job_release_from_approval, job_submit
from scheduler.transitions import job_transition
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory

SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["python"]}


def place(job, node, *uuids, replica=0, millis=1000, memory=0):
    return core.Place(
        job_id=str(job.pk),
        tenant=job.tenant.slug,
        flavor="sim-80g",
        assignments=tuple(core.Assignment(replica, node.name, uuid, millis, memory) for uuid in uuids),
    )


@pytest.fixture
def submitted(member, node, no_cycle_requests, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = job_submit(actor=member, spec=SPEC)
    return job


def test_submit_queues_the_job_with_events_audit_and_a_cycle_request(submitted, no_cycle_requests):
    job = Job.objects.get(pk=submitted.pk)
    assert job.state == JobState.QUEUED
    assert job.millis_per_replica == 1000 and job.tenant.slug == "team-a"
    assert list(job.events.values_list("from_state", "to_state")) == [("", "submitted"), ("submitted", "queued")]
    actions = list(AuditRecord.objects.filter(target=f"job:{job.pk}").values_list("action", flat=True))
    # One record for the submit, saying the state the job entered (no separate submitted→queued transition).
    assert actions == ["job.submit"]
    assert record_details(AuditRecord.objects.get(target=f"job:{job.pk}"))["after"]["state"] == "queued"
    assert no_cycle_requests == [1]


def test_submit_holds_the_job_when_the_tenants_app_wants_approval(member, node, monkeypatch):
    from tenants.services import admissions

    created = []
    monkeypatch.setattr(admissions, "job_admission_needs_approval", lambda **kw: kw["critical"], False)
    monkeypatch.setattr(admissions, "job_admission_request_create", lambda **kw: created.append(kw), False)
    job = job_submit(actor=member, spec={**SPEC, "priority_class": "critical"})
    assert job.state == JobState.PENDING_APPROVAL
    assert created == [{"job": job, "actor": member}]
    released = job_release_from_approval(job=job, actor=None)
    assert released.state == JobState.QUEUED
    with pytest.raises(ConflictError):
        job_release_from_approval(job=job, actor=None)


def test_viewers_cannot_submit_and_other_tenants_are_invisible(tenant, node):
    viewer = UserFactory(username="viewer")
    MembershipFactory(user=viewer, tenant=tenant, role="viewer")
    with pytest.raises(PermissionDeniedError):
        job_submit(actor=viewer, spec=SPEC)
    outsider = UserFactory(username="outsider")
    MembershipFactory(user=outsider, tenant=TenantFactory(slug="team-b"), role="member")
    with pytest.raises(NotFoundError):
        job_submit(actor=outsider, spec=SPEC)


def test_illegal_transitions_are_refused(submitted):
    with pytest.raises(ConflictError, match="cannot become succeeded"):
        job_transition(job=submitted, to_state=JobState.SUCCEEDED, actor=None)


def test_place_creates_allocations_and_a_start_command(submitted, node):
    device = node.devices.get(index=0)
    outcome = persist_plan(core.Plan(places=(place(submitted, node, device.uuid),)))
    assert outcome.placed == [submitted.pk]
    job = Job.objects.get(pk=submitted.pk)
    assert job.state == JobState.ADMITTED
    allocation = Allocation.objects.get(job=job)
    assert (allocation.device_id, allocation.millis, allocation.memory_mib) == (device.pk, 1000, device.memory_mib)
    command = AgentCommand.objects.get(job=job)
    assert command.node_id == node.pk
    assert command.payload["type"] == "workload.start"
    assert command.payload["command_id"] == command.pk
    assert command.payload["devices"] == [{"uuid": device.uuid, "millis": 1000, "memory_mib": device.memory_mib}]


def test_a_stale_place_onto_a_full_device_is_skipped(member, node):
    device = node.devices.get(index=0)
    first = job_submit(actor=member, spec=SPEC)
    second = job_submit(actor=member, spec=SPEC)
    # Two plans made from the same snapshot both chose the same card.
    persist_plan(core.Plan(places=(place(first, node, device.uuid),)))
    outcome = persist_plan(core.Plan(places=(place(second, node, device.uuid),)))
    assert outcome.placed == []
    assert "millis free" in outcome.skipped[0]["reason"]
    second.refresh_from_db()
    assert second.state == JobState.QUEUED and second.pending_reason_code == "insufficient_capacity"
    assert Allocation.objects.active().filter(device=device).count() == 1


def test_fractions_share_a_card_up_to_1000_millis_and_its_memory(member, node):
    device = node.devices.get(index=0)
    spec = {**SPEC, "resources": {"flavors": ["sim-80g"], "millis": 400, "memory_mib": 30000}}
    jobs = [job_submit(actor=member, spec=spec) for _ in range(3)]
    plans = [core.Plan(places=(place(job, node, device.uuid, millis=400, memory=30000),)) for job in jobs]
    placed = [persist_plan(plan).placed for plan in plans]
    assert placed == [[jobs[0].pk], [jobs[1].pk], []]  # the third would need 1200 millis and 90000 MiB
    assert sum(Allocation.objects.active().filter(device=device).values_list("millis", flat=True)) == 800


def test_workload_reports_drive_running_and_succeeded(submitted, node):
    device = node.devices.get(index=0)
    persist_plan(core.Plan(places=(place(submitted, node, device.uuid),)))
    report = dict(node=node, job_id=submitted.pk, replica=0, exit_code=None, last_checkpoint_at=None)
    workload_status_report(state="running", **report)
    assert Job.objects.get(pk=submitted.pk).state == JobState.RUNNING
    workload_status_report(state="succeeded", **{**report, "exit_code": 0})
    job = Job.objects.get(pk=submitted.pk)
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)
    assert not Allocation.objects.active().filter(job=job).exists()
    workload_status_report(state="succeeded", **report)  # a repeated report changes nothing
    assert job.events.count() == 5


def test_preemption_stops_the_victim_and_requeues_it_with_its_checkpoint(submitted, node):
    device = node.devices.get(index=0)
    persist_plan(core.Plan(places=(place(submitted, node, device.uuid),)))
    preempt = core.Preempt(job_id=str(submitted.pk), victim_of="999", reason=core.PreemptReason.PRIORITY, grace_s=45)
    outcome = persist_plan(core.Plan(preemptions=(preempt,)))
    assert outcome.preempted == [submitted.pk]
    job = Job.objects.get(pk=submitted.pk)
    assert job.state == JobState.PREEMPTING and job.preempted_by == [999]
    stop = AgentCommand.objects.filter(job=job, command_type="workload.stop").get()
    assert (stop.payload["grace_s"], stop.payload["reason"]) == (45.0, "preempted")
    # Capacity stays held until the agent confirms the stop.
    assert Allocation.objects.active().filter(job=job).exists()
    checkpoint = datetime(2026, 1, 1, tzinfo=UTC)
    workload_status_report(
        node=node, job_id=job.pk, replica=0, state="stopped", exit_code=None, last_checkpoint_at=checkpoint
    )
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.last_checkpoint_at == checkpoint
    assert "checkpoint" in job.state_message
    assert not Allocation.objects.active().filter(job=job).exists()


def test_cancel_stops_replicas_and_ends_allocations(submitted, node, member):
    persist_plan(core.Plan(places=(place(submitted, node, node.devices.get(index=0).uuid),)))
    job_cancel(job=submitted, actor=member, reason="not needed")
    job = Job.objects.get(pk=submitted.pk)
    assert job.state == JobState.CANCELLED
    assert not Allocation.objects.active().filter(job=job).exists()
    assert AgentCommand.objects.filter(job=job, command_type="workload.stop").count() == 1
    with pytest.raises(ConflictError):
        job_cancel(job=job, actor=member)


def test_another_member_cannot_cancel_but_a_tenant_admin_can(submitted, tenant):
    other = UserFactory(username="other")
    MembershipFactory(user=other, tenant=tenant, role="member")
    with pytest.raises(PermissionDeniedError):
        job_cancel(job=submitted, actor=other)
    admin = UserFactory(username="tadmin")
    MembershipFactory(user=admin, tenant=tenant, role="tenant_admin")
    assert job_cancel(job=submitted, actor=admin).state == JobState.CANCELLED


def test_a_lost_node_requeues_its_jobs(submitted, node):
    persist_plan(core.Plan(places=(place(submitted, node, node.devices.get(index=0).uuid),)))
    assert node_jobs_requeue(node=node) == 1
    job = Job.objects.get(pk=submitted.pk)
    assert job.state == JobState.QUEUED
    assert list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True))[-2:] == ["node_lost", "queued"]
    assert not Allocation.objects.active().filter(job=job).exists()


def test_a_failed_gang_member_fails_the_job_and_stops_the_others(member, node):
    job = job_submit(actor=member, spec={**SPEC, "replicas": 2})
    a, b = node.devices.order_by("index")
    gang = core.Place(
        job_id=str(job.pk),
        tenant="team-a",
        flavor="sim-80g",
        assignments=(core.Assignment(0, node.name, a.uuid, 1000, 0), core.Assignment(1, node.name, b.uuid, 1000, 0)),
    )
    assert persist_plan(core.Plan(places=(gang,))).placed == [job.pk]
    workload_status_report(node=node, job_id=job.pk, replica=1, state="failed", exit_code=3, last_checkpoint_at=None)
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
    assert (
        AgentCommand.objects.filter(job=job, command_type="workload.stop")
        .values_list("payload__replica", flat=True)
        .get()
        == 0
    )
    assert not Allocation.objects.active().filter(job=job).exists()


def test_drain_asks_jobs_to_stop_and_cordons_the_node(submitted, node):
    from tests.scheduler.factories import SystemAdminFactory

    persist_plan(core.Plan(places=(place(submitted, node, node.devices.get(index=0).uuid),)))
    admin = SystemAdminFactory()
    node_drain(node=node, actor=admin)
    node.refresh_from_db()
    assert node.status == "draining"
    assert Job.objects.get(pk=submitted.pk).state == JobState.PREEMPTING
    with pytest.raises(PermissionDeniedError):
        node_cordon(node=node, actor=UserFactory(username="nobody"))


def test_commands_are_announced_only_after_commit(submitted, node, monkeypatch, django_capture_on_commit_callbacks):
    from django.db import transaction

    from scheduler.fleet import outbox

    announced = []
    monkeypatch.setattr(outbox, "_announce", lambda items: announced.extend(items))
    device = node.devices.get(index=0)
    with pytest.raises(RuntimeError), django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        persist_plan(core.Plan(places=(place(submitted, node, device.uuid),)))
        raise RuntimeError("rolled back")
    assert announced == [] and not AgentCommand.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        persist_plan(core.Plan(places=(place(submitted, node, device.uuid),)))
    command = AgentCommand.objects.get()
    assert announced == [(node.pk, command.pk)]


def test_a_stop_that_is_never_confirmed_is_requeued_after_the_timeout(submitted, node):
    from datetime import timedelta

    from django.utils import timezone

    persist_plan(core.Plan(places=(place(submitted, node, node.devices.get(index=0).uuid),)))
    preempt = core.Preempt(job_id=str(submitted.pk), victim_of="1", reason=core.PreemptReason.PRIORITY, grace_s=30)
    persist_plan(core.Plan(preemptions=(preempt,)))
    assert jobs_awaiting_stop_sweep(older_than_s=300) == 0
    Job.objects.filter(pk=submitted.pk).update(updated_at=timezone.now() - timedelta(minutes=10))
    assert jobs_awaiting_stop_sweep(older_than_s=300) == 1
    job = Job.objects.get(pk=submitted.pk)
    assert job.state == JobState.QUEUED
    assert not Allocation.objects.active().filter(job=job).exists()
