"""Persist in bulk: a few statements however many places, the same rows as one by one, explanations written only
when they change, and the database's refusal of one place in a bulk write costs only that place."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditRecord
from scheduler import persist
from scheduler.core import types as core
from scheduler.fleet.models import AgentCommand
from scheduler.models import Allocation, Job, JobEvent, JobState
from scheduler.persist import persist_plan
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_cancel, job_submit
from tests.scheduler.factories import node_with_devices

SPEC = {"name": "bulk", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["true"]}


@pytest.fixture(autouse=True)
def _quiet(no_cycle_requests):
    return no_cycle_requests


def _places(jobs, node) -> tuple[core.Place, ...]:
    devices = list(node.devices.order_by("index"))
    return tuple(
        core.Place(
            job_id=str(job.pk),
            tenant="team-a",
            flavor="sim-80g",
            assignments=(core.Assignment(0, node.name, device.uuid, 1000, 0),),
        )
        for job, device in zip(jobs, devices, strict=False)
    )


def _explain(job, code=core.PendingReason.INSUFFICIENT_CAPACITY, position=1) -> core.Explain:
    return core.Explain(
        job_id=str(job.pk), code=code, message="Waiting for a card.", position_in_tenant=position, position_overall=1
    )


def test_placing_many_jobs_takes_as_many_statements_as_placing_one(member):
    small, large = node_with_devices(1, name="small"), node_with_devices(24, name="large")
    one = [job_submit(actor=member, spec=SPEC)]
    many = [job_submit(actor=member, spec=SPEC) for _ in range(24)]
    with CaptureQueriesContext(connection) as first:
        assert persist_plan(core.Plan(places=_places(one, small))).placed == [one[0].pk]
    with CaptureQueriesContext(connection) as second:
        assert sorted(persist_plan(core.Plan(places=_places(many, large))).placed) == [j.pk for j in many]

    # COPY statements are not in Django's query log; the rest must not grow with the places. (The audit records,
    # buffered to the commit in production, are appended at once under a test's transaction: left out here.)
    def scheduler_queries(captured):
        return [q["sql"][:90] for q in captured if "audit_" not in q["sql"]]

    assert len(scheduler_queries(second)) <= len(scheduler_queries(first)), "\n".join(scheduler_queries(second))
    assert Allocation.objects.active().count() == 25


def test_a_bulk_place_writes_what_a_transition_one_by_one_writes(member, node):
    job = job_submit(actor=member, spec=SPEC)
    Job.objects.filter(pk=job.pk).update(pending_reason_code="insufficient_capacity", position_overall=3)
    persist_plan(core.Plan(places=_places([job], node)))
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED and job.admitted_at is not None
    assert job.state_message == "Placed on node-a."
    assert (job.pending_reason_code, job.pending_message, job.position_in_tenant, job.position_overall) == (
        "",
        "",
        None,
        None,
    )
    event = JobEvent.objects.filter(job=job).latest("pk")
    assert (event.from_state, event.to_state, event.reason) == ("queued", "admitted", "placed")
    assert event.details == {"devices": [node.devices.get(index=0).uuid], "borrowed_millis": 0}
    record = AuditRecord.objects.filter(target=f"job:{job.pk}", action="job.transition").latest("seq")
    assert record.tenant_id == job.tenant_id
    command = AgentCommand.objects.get(job=job)
    assert command.payload["command_id"] == command.pk and command.payload["id"] == f"cmd-{command.pk}"


def test_explanations_are_written_only_when_they_change(member, node):
    jobs = [job_submit(actor=member, spec=SPEC) for _ in range(3)]
    plan = core.Plan(explanations=tuple(_explain(job, position=n + 1) for n, job in enumerate(jobs)))
    assert persist_plan(plan).explained == 3
    with CaptureQueriesContext(connection) as unchanged:
        assert persist_plan(plan).explained == 0
    assert not [q for q in unchanged if q["sql"].lstrip().upper().startswith(("UPDATE", "WITH"))]
    moved = core.Plan(explanations=(_explain(jobs[0], position=1), _explain(jobs[1], position=7)))
    assert persist_plan(moved).explained == 1
    assert Job.objects.get(pk=jobs[1].pk).position_in_tenant == 7
    # What the snapshot read stands in for reading the jobs again; a job no longer pending keeps its fields.
    stored = {jobs[2].pk: ("old", "old", None, None)}
    job_cancel(job=jobs[2], actor=member)
    assert persist_plan(core.Plan(explanations=(_explain(jobs[2]),)), stored_explanations=stored).explained == 0
    assert Job.objects.get(pk=jobs[2].pk).pending_reason_code == ""


def test_the_cycle_writes_explanations_from_what_its_snapshot_read(member, node):
    for _ in range(4):  # two cards: two placed, two explained
        job_submit(actor=member, spec=SPEC)
    assert run_cycle().explained == 2
    assert run_cycle().explained == 0  # nothing changed: nothing written


@pytest.mark.django_db(transaction=True)
def test_a_place_the_database_refuses_in_a_bulk_write_skips_only_that_place(postgres, member, monkeypatch):
    node = node_with_devices(3, name="refusing")
    jobs = [job_submit(actor=member, spec=SPEC) for _ in range(3)]
    taken = node.devices.get(index=1)
    Allocation.objects.create(
        job=jobs[0], replica=5, tenant=jobs[0].tenant, flavor=taken.flavor, device=taken, node=node,
        millis=1000, memory_mib=taken.memory_mib, started_at=jobs[0].submitted_at,
    )  # fmt: skip
    real_init = persist.PlanBatch.__init__

    def blind(self, *args, **kwargs):  # the checks in memory miss the card's allocation: only the trigger sees it
        real_init(self, *args, **kwargs)
        self.used.clear()

    monkeypatch.setattr(persist.PlanBatch, "__init__", blind)
    outcome = persist_plan(core.Plan(places=_places(jobs, node)))
    assert sorted(outcome.placed) == [jobs[0].pk, jobs[2].pk]
    assert outcome.skipped == [{"job_id": str(jobs[1].pk), "reason": "refused by the database"}]
    assert Job.objects.get(pk=jobs[1].pk).state == JobState.QUEUED
    assert Allocation.objects.active().filter(device=taken).count() == 1
    assert AgentCommand.objects.filter(job__in=[jobs[0], jobs[2]]).count() == 2


def test_the_preempt_path_locks_the_job_row_only(member, node):
    job = job_submit(actor=member, spec=SPEC)
    persist_plan(core.Plan(places=_places([job], node)))
    preempt = core.Preempt(job_id=str(job.pk), victim_of="0", reason=core.PreemptReason.PRIORITY, grace_s=5)
    with CaptureQueriesContext(connection) as seen:
        assert persist_plan(core.Plan(preemptions=(preempt,))).preempted == [job.pk]
    if connection.vendor != "postgresql":
        return  # SQLite has no row locks (it serialises writers)
    locks = [q["sql"] for q in seen if "FOR" in q["sql"] and "UPDATE" in q["sql"]]
    assert locks and all("tenants_tenant" not in sql.split(" FOR ", 1)[1] for sql in locks), locks
    assert all("FOR NO KEY UPDATE OF" in sql for sql in locks if "scheduler_job" in sql), locks


@pytest.mark.parametrize("reason", [core.PreemptReason.RELOCATE, core.PreemptReason.NEWER_OWN])
def test_a_relocation_or_an_aged_gangs_preemption_is_recorded_with_its_reason_and_message(member, node, reason):
    job = job_submit(actor=member, spec=SPEC)
    persist_plan(core.Plan(places=_places([job], node)))
    message = "job 7 of team-x, within its guarantee, needs 8 gpu cards on one node"
    preempt = core.Preempt(job_id=str(job.pk), victim_of="7", reason=reason, grace_s=5, message=message)

    assert persist_plan(core.Plan(preemptions=(preempt,))).preempted == [job.pk]

    job.refresh_from_db()
    event = JobEvent.objects.filter(job=job).latest("pk")
    assert (job.state, job.preemption_count) == (JobState.PREEMPTING, 1)
    assert (event.reason, event.message) == (str(reason), message)
