"""What a scheduling cycle costs the worker, without changing what it decides: the snapshot's and the persist
step's reads are compiled once (``CompiledQuery``) and give what their querysets give; a plan with nothing to
write reads and writes nothing; a job placed for the first time has no log to look up; the cycle claim is not
renewed before every cycle."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kernel.db.bulk import AnyOf
from scheduler import persist, snapshot
from scheduler.core import types as core
from scheduler.fleet.services.workload_reports import node_jobs_requeue
from scheduler.models import CapacityHold, InferenceReservation, Job, JobKind, JobState
from scheduler.services import cycle as cycle_services
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from scheduler.snapshot import CompiledQuery
from tenants.models import Quota
from tests.scheduler.factories import FlavorFactory, JobFactory, TenantFactory, node_with_devices

SPEC = {"name": "cost", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["true"]}


@pytest.fixture
def compiles(monkeypatch):
    """How many times Django compiles a SELECT while the returned list's context counts (``counting[0]``)."""
    counted = [0]
    counting = [False]
    real = SQLCompiler.as_sql

    def as_sql(self, *args, **kwargs):
        if counting[0]:
            counted[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SQLCompiler, "as_sql", as_sql)
    return counted, counting


def _a_varied_pool(member, tenant):
    """Labels and topology on a node, a parent tenant and a quota, a running job, a pending job that cannot
    fit (a node selector), one preempted before, a hold and an inference reservation."""
    tenant.parent = TenantFactory(slug="org")
    tenant.save(update_fields=["parent"])
    flavor = FlavorFactory()
    Quota.objects.create(tenant=tenant, flavor=flavor, guaranteed_millis=2000, limit_millis=3000)
    node = node_with_devices(3, name="node-a", labels={"zone": "a"}, topology={"nvlink_domains": {"d0": [0, 1]}})
    running = job_submit(actor=member, spec=SPEC)
    assert run_cycle().placed == [running.pk]
    job_submit(actor=member, spec={**SPEC, "name": "elsewhere", "node_selector": {"zone": "b"}})
    JobFactory(tenant=tenant, state=JobState.QUEUED, preemption_count=1, preempted_by=[running.pk])
    waiting = JobFactory(tenant=tenant, state=JobState.QUEUED, node_selector={"zone": "a"})
    device = node.devices.get(index=2)
    CapacityHold.objects.create(
        job=waiting, device=device, victim_ids=[running.pk], since=timezone.now() - timedelta(seconds=30)
    )
    service = JobFactory(tenant=tenant, state=JobState.RUNNING, kind=JobKind.INFERENCE, millis_per_replica=500)
    InferenceReservation.objects.create(
        job=service, replica=1, tenant=tenant, flavor=flavor, device=device, node=node, millis=500, memory_mib=1024
    )
    return node


def test_the_compiled_snapshot_is_the_one_the_querysets_build(member, tenant, monkeypatch):
    _a_varied_pool(member, tenant)
    now = timezone.now()
    previous = {"at": now.timestamp() - 60, "usage": {"team-a": {"sim-80g": 500.0}}}
    stored: dict[int, tuple] = {}
    compiled = snapshot.build_snapshot(now=now, previous_usage=previous, stored_explanations=stored)

    monkeypatch.setattr(CompiledQuery, "rows", lambda self, *values: list(self._build(*values)))
    stored_by_querysets: dict[int, tuple] = {}
    by_querysets = snapshot.build_snapshot(now=now, previous_usage=previous, stored_explanations=stored_by_querysets)

    assert compiled == by_querysets
    assert stored == stored_by_querysets
    assert compiled.allocations and compiled.pending and compiled.holds and compiled.reservations
    assert {n.name: n.labels for n in compiled.nodes} == {"node-a": {"zone": "a"}}
    assert {t.name: t.parent for t in compiled.tenants} == {"org": None, "team-a": "org"}
    assert [(q.tenant, q.limit_millis) for q in compiled.quotas] == [("team-a", 3000)]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="elsewhere a query with arguments is built for each call")
def test_a_warm_snapshot_and_persist_step_compile_no_sql(member, tenant, compiles, monkeypatch):
    counted, counting = compiles
    node_with_devices(2, name="node-a")
    run_cycle()  # warm: every CompiledQuery compiles once
    job_submit(actor=member, spec=SPEC)
    run_cycle()

    real_snapshot = snapshot.build_snapshot

    def watched(*args, **kwargs):
        counting[0] = True
        try:
            return real_snapshot(*args, **kwargs)
        finally:
            counting[0] = False

    monkeypatch.setattr(snapshot, "build_snapshot", watched)
    real_batch = persist.PlanBatch.__init__

    def batch(self, *args, **kwargs):
        counting[0] = True
        try:
            real_batch(self, *args, **kwargs)
        finally:
            counting[0] = False

    monkeypatch.setattr(persist.PlanBatch, "__init__", batch)
    job = job_submit(actor=member, spec=SPEC)
    assert run_cycle().placed == [job.pk]
    assert counted[0] == 0


def test_persisting_a_plan_with_nothing_to_write_runs_no_statement(member, node):
    with CaptureQueriesContext(connection) as nothing:
        outcome = persist.persist_plan(core.Plan(), holds_stored=False)
    assert (outcome.placed, outcome.preempted, outcome.explained) == ([], [], 0)
    assert nothing.captured_queries == []
    # Holds stored by the last cycle and none kept: they are deleted, as before.
    with CaptureQueriesContext(connection) as holds:
        persist.persist_plan(core.Plan())
    assert [q["sql"] for q in holds.captured_queries] == ['DELETE FROM "scheduler_capacityhold"']


def test_a_cycle_drops_the_holds_its_plan_no_longer_keeps(member, node):
    job = job_submit(actor=member, spec=SPEC)
    CapacityHold.objects.create(job=job, device=node.devices.get(index=0), victim_ids=[], since=timezone.now())
    assert run_cycle().placed == [job.pk]
    assert not CapacityHold.objects.exists()


def test_a_first_placement_looks_up_no_log_but_a_requeued_job_does(member, node):
    job = job_submit(actor=member, spec=SPEC)
    with CaptureQueriesContext(connection) as first:
        assert run_cycle().placed == [job.pk]
    assert not [q for q in first.captured_queries if "scheduler_joblogchunk" in q["sql"]]

    node_jobs_requeue(node=node)
    with CaptureQueriesContext(connection) as again:
        assert run_cycle().placed == [job.pk]
    assert [q for q in again.captured_queries if "scheduler_joblogchunk" in q["sql"]]


def test_a_compiled_query_gives_the_querysets_instances_and_values(member, node):
    jobs = [job_submit(actor=member, spec={**SPEC, "node_selector": {"zone": str(n)}}) for n in range(3)]
    pks = [jobs[0].pk, jobs[2].pk]
    instances = CompiledQuery(lambda ids: Job.objects.filter(AnyOf("pk", ids)), arguments=1, instances=True)
    values = CompiledQuery(
        lambda ids: Job.objects.filter(AnyOf("pk", ids)).order_by("pk").values_list("pk", "node_selector", "flavors"),
        arguments=1,
    )
    for _ in range(2):  # compiled, then from the stored SQL
        got = {job.pk: job for job in instances.rows(pks)}
        expected = {job.pk: job for job in Job.objects.filter(pk__in=pks)}
        assert set(got) == set(pks)
        for pk, job in expected.items():
            fields = [f.attname for f in Job._meta.concrete_fields]
            assert [getattr(got[pk], f) for f in fields] == [getattr(job, f) for f in fields]
            assert not got[pk]._state.adding
        assert values.rows(pks) == list(
            Job.objects.filter(pk__in=pks).order_by("pk").values_list("pk", "node_selector", "flavors")
        )
    assert values.rows([jobs[1].pk]) == [(jobs[1].pk, {"zone": "1"}, ["sim-80g"])]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="elsewhere the queryset is built for each call")
def test_a_compiled_query_refuses_an_argument_it_cannot_pass_as_one_array(db):
    in_list = CompiledQuery(lambda ids: Job.objects.filter(pk__in=ids).values_list("pk"), arguments=1)
    with pytest.raises(ValueError, match="one array parameter"):
        in_list.rows([1])


def test_the_claim_is_renewed_once_a_quarter_of_its_ttl_not_before_every_cycle(monkeypatch):
    from django.core.cache import cache

    cache.delete_many([cycle_services.CYCLE_DIRTY_KEY, cycle_services.CYCLE_CLAIM_KEY])
    cache.set(cycle_services.CYCLE_CLAIM_KEY, 1)
    cycles = []

    def busy(**kwargs):
        cycles.append(1)
        if len(cycles) < 5:
            cache.set(cycle_services.CYCLE_DIRTY_KEY, 1)  # a change during the cycle: another one follows
        return cycle_services.CycleResult(ran=True)

    monkeypatch.setattr(cycle_services, "run_cycle", busy)
    renewals = []
    real_set = cycle_services.cache.set

    def counting_set(key, *args, **kwargs):
        if key == cycle_services.CYCLE_CLAIM_KEY:
            renewals.append(kwargs.get("timeout"))
        return real_set(key, *args, **kwargs)

    monkeypatch.setattr(cycle_services.cache, "set", counting_set)
    assert cycle_services.run_requested_cycles().cycles == 5
    assert renewals == [cycle_services.CYCLE_CLAIM_TTL_S]
    assert cache.get(cycle_services.CYCLE_CLAIM_KEY) is None and cache.get(cycle_services.CYCLE_DIRTY_KEY) is None
