"""Holds on the database: the capacity a preemption frees goes to the preemptor over several cycles."""

import pytest

from scheduler.core import types as core
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Allocation, CapacityHold, Job, JobEvent, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_cancel, job_submit
from scheduler.snapshot import build_snapshot
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory

SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["python"]}


@pytest.fixture(autouse=True)
def _quiet(no_cycle_requests):
    return no_cycle_requests


@pytest.fixture
def lender_and_borrower(member, node, monkeypatch, settings):
    """team-a is guaranteed both cards of node-a; team-b may only borrow. FIFO order, so a requeued victim
    (submitted first) is ahead of the job that preempted it."""
    borrower = UserFactory(username="member-b")
    MembershipFactory(user=borrower, tenant=TenantFactory(slug="team-b"), role="member")
    quotas = (
        core.Quota(tenant="team-a", flavor="sim-80g", guaranteed_millis=2000),
        core.Quota(tenant="team-b", flavor="sim-80g", guaranteed_millis=0, limit_millis=2000),
    )
    monkeypatch.setattr("scheduler.snapshot.quotas_build", lambda _rows: quotas)
    # No borrowing back-off: these tests follow the hold; the back-off has its own test below.
    settings.GPUPOOL_SCHEDULER_POLICY = {
        "min_runtime_before_preempt_s": 0,
        "ordering": "fifo",
        "borrow_backoff_s": None,
    }
    borrowed = [job_submit(actor=borrower, spec={**SPEC, "tenant": "team-b"}) for _ in range(2)]
    assert sorted(run_cycle().placed) == sorted(j.pk for j in borrowed)
    return borrowed


def _stopped(job: Job) -> None:
    allocation = Allocation.objects.active().get(job=job)
    workload_status_report(
        node=allocation.node, job_id=job.pk, replica=0, state="stopped", exit_code=None, last_checkpoint_at=None
    )


def test_the_preemptor_gets_the_freed_card_over_three_cycles_and_preempts_only_once(member, lender_and_borrower):
    lender = job_submit(actor=member, spec=SPEC)

    # Cycle 1: one borrower is preempted and its card is held for the lender.
    first = run_cycle()
    assert len(first.preempted) == 1 and first.placed == []
    victim = Job.objects.get(pk=first.preempted[0])
    victim_device = Allocation.objects.active().get(job=victim).device
    (hold,) = CapacityHold.objects.all()
    assert (hold.job_id, hold.device_id, hold.victim_ids) == (lender.pk, victim_device.pk, [victim.pk])
    assert build_snapshot().holds == (
        core.Hold(str(lender.pk), victim_device.uuid, (str(victim.pk),), hold.since.timestamp()),
    )

    # Cycle 2: the victim is still in its grace period; the lender waits and preempts nobody else.
    second = run_cycle()
    assert second.preempted == [] and second.placed == []
    assert Job.objects.get(pk=lender.pk).pending_reason_code == "waiting_for_preemption"
    assert CapacityHold.objects.get().job_id == lender.pk
    assert JobEvent.objects.filter(to_state=JobState.PREEMPTING).count() == 1

    # The victim stops and is requeued, ahead of the lender in FIFO order.
    _stopped(victim)
    assert Job.objects.get(pk=victim.pk).state == JobState.QUEUED

    # Cycle 3: the lender, not the requeued victim, gets the freed card; the hold is gone.
    third = run_cycle()
    assert third.placed == [lender.pk] and third.preempted == []
    assert Allocation.objects.active().get(job=lender).device == victim_device
    assert Job.objects.get(pk=victim.pk).state == JobState.QUEUED
    assert not CapacityHold.objects.exists()
    assert JobEvent.objects.filter(to_state=JobState.PREEMPTING).count() == 1


def test_without_the_stored_hold_the_lenders_claim_keeps_the_card_from_the_requeued_victim(member, lender_and_borrower):
    # The same story with the hold row removed before the last cycle: the victim, first in FIFO order, would
    # take the card again — what made the lender preempt over and over before holds outlived one cycle — but
    # the card is the lender's guarantee, owed to its queued job, so it is not lent to the victim (issue 33).
    lender = job_submit(actor=member, spec=SPEC)
    victim = Job.objects.get(pk=run_cycle().preempted[0])
    _stopped(victim)
    CapacityHold.objects.all().delete()
    assert run_cycle().placed == [lender.pk]
    assert Job.objects.get(pk=victim.pk).state == JobState.QUEUED


def test_a_cancelled_preemptor_leaves_no_hold_behind(member, lender_and_borrower):
    lender = job_submit(actor=member, spec=SPEC)
    victim = Job.objects.get(pk=run_cycle().preempted[0])
    job_cancel(job=lender, actor=None)
    _stopped(victim)
    # The next cycle drops the hold and the freed card goes to whoever is next: the requeued victim.
    assert run_cycle().placed == [victim.pk]
    assert not CapacityHold.objects.exists()


def test_a_requeued_victim_does_not_borrow_again_within_its_back_off(member, lender_and_borrower, settings):
    # With the default borrowing back-off (issue 18), the victim of a reclaim waits even when the card is free
    # again, and says why; the lender's team could still start at once within its guarantee.
    settings.GPUPOOL_SCHEDULER_POLICY = {"min_runtime_before_preempt_s": 0, "ordering": "fifo"}
    lender = job_submit(actor=member, spec=SPEC)
    victim = Job.objects.get(pk=run_cycle().preempted[0])
    job_cancel(job=lender, actor=None)
    _stopped(victim)
    assert run_cycle().placed == []
    waiting = Job.objects.get(pk=victim.pk)
    assert waiting.state == JobState.QUEUED
    assert "may borrow idle capacity again in" in waiting.pending_message
    assert job_submit(actor=member, spec=SPEC).pk in run_cycle().placed
