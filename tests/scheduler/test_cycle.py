"""The whole cycle on the database: snapshot → scheduler.core.plan → persist."""

import pytest

from scheduler.core import types as core
from scheduler.fleet.models import AgentCommand
from scheduler.fleet.services.nodes import node_cordon
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Allocation, Job, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from scheduler.snapshot import build_snapshot
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory

SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["python"]}


@pytest.fixture(autouse=True)
def _quiet(no_cycle_requests):
    return no_cycle_requests


def test_snapshot_reflects_nodes_devices_allocations_and_pending_jobs(member, node):
    job = job_submit(actor=member, spec=SPEC)
    node.devices.filter(index=1).update(health="unhealthy", nvlink_domain="nv0")
    snap = build_snapshot()
    (core_node,) = snap.nodes
    assert core_node.name == "node-a" and core_node.schedulable
    assert [(d.index, d.healthy, d.flavor) for d in core_node.devices] == [(0, True, "sim-80g"), (1, False, "sim-80g")]
    assert core_node.devices[1].nvlink_domain == "nv0"
    (pending,) = snap.pending
    assert (pending.job_id, pending.tenant, pending.request.millis) == (str(job.pk), "team-a", 1000)
    assert snap.allocations == ()


def test_a_job_whose_flavors_are_alternatives_says_so_to_the_engine(member, node):
    either = {**SPEC, "resources": {**SPEC["resources"], "any_flavor": True}}
    plain, alternatives = job_submit(actor=member, spec=SPEC), job_submit(actor=member, spec=either)
    requests = {j.job_id: j.request for j in build_snapshot().pending}
    assert requests[str(plain.pk)].any_flavor is False
    assert requests[str(alternatives.pk)].any_flavor is True


def test_a_cycle_places_what_fits_and_explains_the_rest(member, node):
    jobs = [job_submit(actor=member, spec=SPEC) for _ in range(3)]
    result = run_cycle()
    assert result.ran
    assert sorted(result.placed) == [jobs[0].pk, jobs[1].pk]
    states = dict(Job.objects.values_list("pk", "state"))
    assert [states[j.pk] for j in jobs] == [JobState.ADMITTED, JobState.ADMITTED, JobState.QUEUED]
    waiting = Job.objects.get(pk=jobs[2].pk)
    assert waiting.pending_reason_code and waiting.pending_message
    assert (waiting.position_in_tenant, waiting.position_overall) == (1, 1)
    assert AgentCommand.objects.filter(command_type="workload.start").count() == 2
    # Nothing changed, so a second cycle places nothing more and double-books nothing.
    assert run_cycle().placed == []
    assert Allocation.objects.active().count() == 2


def test_the_next_cycle_uses_capacity_freed_by_a_finished_job(member, node):
    jobs = [job_submit(actor=member, spec=SPEC) for _ in range(3)]
    run_cycle()
    workload_status_report(
        node=node, job_id=jobs[0].pk, replica=0, state="succeeded", exit_code=0, last_checkpoint_at=None
    )
    assert run_cycle().placed == [jobs[2].pk]


def test_a_lender_reclaims_borrowed_capacity_through_preemption_then_runs(member, node, monkeypatch, settings):
    borrower = UserFactory(username="member-b")
    MembershipFactory(user=borrower, tenant=TenantFactory(slug="team-b"), role="member")
    # The quota rows come from the tenants app; here the snapshot gets them directly: team-a is guaranteed
    # both cards, team-b may only borrow.
    quotas = (
        core.Quota(tenant="team-a", flavor="sim-80g", guaranteed_millis=2000),
        core.Quota(tenant="team-b", flavor="sim-80g", guaranteed_millis=0, limit_millis=2000),
    )
    monkeypatch.setattr("scheduler.snapshot.quotas_build", lambda _rows: quotas)
    settings.GPUPOOL_SCHEDULER_POLICY = {"min_runtime_before_preempt_s": 0}
    low = [job_submit(actor=borrower, spec={**SPEC, "tenant": "team-b"}) for _ in range(2)]
    assert sorted(run_cycle().placed) == sorted(j.pk for j in low)
    assert sum(Allocation.objects.active().values_list("borrowed_millis", flat=True)) == 2000

    lender_job = job_submit(actor=member, spec={**SPEC, "priority_class": "high"})
    result = run_cycle()
    assert len(result.preempted) == 1 and result.placed == []
    victim = Job.objects.get(pk=result.preempted[0])
    assert victim.state == JobState.PREEMPTING
    assert Job.objects.get(pk=lender_job.pk).pending_reason_code == "waiting_for_preemption"
    workload_status_report(
        node=node, job_id=victim.pk, replica=0, state="stopped", exit_code=None, last_checkpoint_at=None
    )
    assert run_cycle().placed == [lender_job.pk]
    victim.refresh_from_db()
    assert victim.state == JobState.QUEUED and victim.preempted_by == [lender_job.pk]
    # The engine's borrowing back-off counts from the victim's PREEMPTING event.
    (again,) = [j for j in build_snapshot().pending if j.job_id == str(victim.pk)]
    preempted_event = victim.events.filter(to_state=JobState.PREEMPTING).latest("created_at")
    assert again.preemptions == 1 and again.last_preempted_at == preempted_event.created_at.timestamp()


def test_cordoned_nodes_get_no_new_work(member, node):
    node_cordon(node=node, actor=None)
    job = job_submit(actor=member, spec=SPEC)
    assert run_cycle().placed == []
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


@pytest.mark.django_db(transaction=True)
def test_a_cycle_that_cannot_take_the_lock_does_nothing(member, node):
    import threading
    from contextlib import nullcontext

    from django.db import connection, transaction

    from scheduler import locks

    job = job_submit(actor=member, spec=SPEC)
    holding, release, seen = threading.Event(), threading.Event(), []

    def hold_the_lock() -> None:
        # Another worker: its own connection and transaction (PostgreSQL advisory lock), or another thread
        # of this process (SQLite: the process lock; no transaction, SQLite would lock the whole database).
        scope = transaction.atomic() if connection.vendor == "postgresql" else nullcontext()
        try:
            with scope, locks.cycle_lock() as held:
                seen.append(held)
                holding.set()
                release.wait(timeout=30)
        finally:
            holding.set()
            connection.close()

    thread = threading.Thread(target=hold_the_lock)
    thread.start()
    try:
        assert holding.wait(timeout=30) and seen == [True]
        assert run_cycle().ran is False
        assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    finally:
        release.set()
        thread.join(timeout=30)
    assert run_cycle().placed == [job.pk]


def test_fair_share_usage_decays_between_cycles():
    from scheduler.snapshot import decayed_usage

    held = {"team-a": {"sim-80g": 2000.0}}
    assert decayed_usage(held, now_s=100.0, half_life_s=60.0, previous=None) == held
    previous = {"at": 40.0, "usage": {"team-a": {"sim-80g": 0.0}, "team-b": {"sim-80g": 1000.0}}}
    usage = decayed_usage(held, now_s=100.0, half_life_s=60.0, previous=previous)
    # One half-life later: half of the old value, half of what is held now.
    assert usage == {"team-a": {"sim-80g": 1000.0}, "team-b": {"sim-80g": 500.0}}


def test_a_cycle_stores_the_usage_for_the_next_one(member, node, django_capture_on_commit_callbacks):
    from django.core.cache import cache

    from scheduler.snapshot import USAGE_CACHE_KEY

    cache.delete(USAGE_CACHE_KEY)
    job_submit(actor=member, spec=SPEC)
    run_cycle()
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle()
    assert cache.get(USAGE_CACHE_KEY)["usage"] == {"team-a": {"sim-80g": 1000.0}}
    cache.delete(USAGE_CACHE_KEY)


def test_the_management_command_runs_one_cycle(member, node):
    import io
    import json

    from django.core.management import call_command

    job = job_submit(actor=member, spec=SPEC)
    out = io.StringIO()
    call_command("scheduler_cycle", stdout=out)
    assert json.loads(out.getvalue())["placed"] == [job.pk]


def test_quota_rows_of_the_tenants_app_bound_what_a_tenant_runs(member, node, settings):
    from tenants.models import Quota as quota

    settings.GPUPOOL_SCHEDULER_POLICY = {}  # quotas required (the default)
    job = job_submit(actor=member, spec=SPEC)
    assert run_cycle().placed == []
    assert Job.objects.get(pk=job.pk).pending_reason_code == "no_quota"
    quota.objects.create(
        tenant=job.tenant, flavor=node.devices.first().flavor, guaranteed_millis=1000, limit_millis=1000
    )
    second = job_submit(actor=member, spec=SPEC)
    assert run_cycle().placed == [job.pk]
    waiting = Job.objects.get(pk=second.pk)
    assert waiting.state == JobState.QUEUED and waiting.pending_reason_code in ("quota_limit", "quota_exhausted")
