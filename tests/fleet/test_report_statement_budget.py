"""The statement budget of what a node agent's socket does for one job: deliver its ``workload.start``, take the
agent's ack, apply its ``running`` and ``succeeded`` reports (and answer a resent one) — and that the cheaper
path still keeps every promise: applied once, each state change with its event and audit record in the same
transaction, the allocation ended, an unacknowledged start withdrawn, a scheduling cycle asked for.
"""

from __future__ import annotations

import dataclasses

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditRecord
from scheduler.fleet.models import AgentCommand, AgentReport, Device
from scheduler.fleet.outbox import START_WITHDRAWN
from scheduler.fleet.services.agent_commands import command_ack, commands_pending, workload_report_apply
from scheduler.fleet.services.inventory import node_hello
from scheduler.models import Allocation, Job, JobEvent, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tests.fleet.conftest import hello, register_node
from tests.patching import patch_request_cycle
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)  # each report's own COMMIT (and the audit flush) is counted

# Statements of one report that moves a job, everything counted:
#   1 the node's name and whether the report was seen before (one SELECT, outside the transaction)
#   1 BEGIN
#   1 the job row FOR NO KEY UPDATE (the columns a report uses)
#   1 what the report depends on besides the job: the node held the job, holds the replica now, a newer or an
#     unacknowledged start of the replica, other active allocations of the job (one SELECT of EXISTS)
#   1 UPDATE of the job (state, and exit code for a finish, in the same statement)
#   1 INSERT of the job event
#   1 INSERT of the AgentReport row (the report is applied once)
#   2 audit flush at COMMIT (lock the chain head with SET CONSTRAINTS ALL IMMEDIATE; insert the record and move
#     the head in one statement on PostgreSQL, two on SQLite)
#   1 COMMIT
# ``succeeded`` also ends the replica's allocations (1 UPDATE). Before this budget: 17 and 21 (a savepoint, the
# node row re-read inside the transaction, four separate checks, a re-read of the allocations it ends, the exit
# code written apart from the state, the start withdrawal even when the agent had acknowledged it).
_AUDIT_FLUSH_EXTRA = 0 if connection.vendor == "postgresql" else 1
RUNNING_REPORT_STATEMENT_BUDGET = 10 + _AUDIT_FLUSH_EXTRA
SUCCEEDED_REPORT_STATEMENT_BUDGET = 11 + _AUDIT_FLUSH_EXTRA
#: A report seen before: the one SELECT, no transaction.
DUPLICATE_REPORT_STATEMENT_BUDGET = 1
#: Handing a command to the agent's socket (UPDATE … RETURNING) and taking its ack (UPDATE).
DELIVER_STATEMENT_BUDGET = 1
ACK_STATEMENT_BUDGET = 1


@pytest.fixture
def cycle_requests(settings, monkeypatch) -> list[int]:
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    requests: list[int] = []
    patch_request_cycle(monkeypatch, lambda: requests.append(1))
    return requests


@pytest.fixture
def placed():
    """A function that places a one-card job of one tenant on one node: (node, job, its start command)."""
    node, _credential = register_node("budget-node")
    node_hello(node_id=node.pk, hello=dataclasses.asdict(hello("budget-node", devices=2)), now=timezone.now())
    flavor = Device.objects.filter(node=node).select_related("flavor").first().flavor.name
    tenant = TenantFactory()
    user = UserFactory()
    MembershipFactory(user=user, tenant=tenant, role="member")
    spec = {"name": "t", "tenant": tenant.slug, "resources": {"flavors": [flavor], "gpus": 1}, "command": ["true"]}

    def place() -> tuple:
        job = job_submit(actor=user, spec=spec)
        assert job.pk in run_cycle().placed
        return node, job, AgentCommand.objects.get(job=job, command_type="workload.start")

    return place


def report(job, start, state: str, report_id: int, **fields) -> dict:
    """The ``workload.status`` frame (as a dict) of replica 0's run that ``start`` began."""
    return {
        "report_id": report_id,
        "job_id": job.pk,
        "replica": 0,
        "state": state,
        "exit_code": None,
        "last_checkpoint_at": None,
        "message": "",
        "log_tail": "",
        "reason": "",
        "command_id": start.pk,
        **fields,
    }


def counted(call) -> tuple[object, int, str]:
    with CaptureQueriesContext(connection) as queries:
        result = call()
    return result, len(queries.captured_queries), "\n".join(q["sql"] for q in queries.captured_queries)


def run_one_job(node, job, start, first_report_id: int) -> dict[str, tuple[object, int, str]]:
    running = report(job, start, "running", first_report_id)
    succeeded = report(job, start, "succeeded", first_report_id + 1, exit_code=0, log_tail="done\n")
    return {
        "deliver": counted(lambda: commands_pending(node_id=node.pk, command_id=start.pk)),
        "ack": counted(lambda: command_ack(node_id=node.pk, command_id=start.pk)),
        "running": counted(lambda: workload_report_apply(node_id=node.pk, status=running)),
        "succeeded": counted(lambda: workload_report_apply(node_id=node.pk, status=succeeded)),
        "resent": counted(lambda: workload_report_apply(node_id=node.pk, status=succeeded)),
    }


def test_one_jobs_agent_messages_stay_within_their_statement_budget(placed, cycle_requests):
    run_one_job(*placed(), first_report_id=1)  # first use: the tenant's audit data key, the node's first report
    node, job, start = placed()
    transitions = AuditRecord.objects.filter(action="job.transition", target=f"job:{job.pk}")
    audited_before = transitions.count()
    cycle_requests.clear()
    steps = run_one_job(node, job, start, first_report_id=11)

    (pending, count, sql) = steps["deliver"]
    assert count <= DELIVER_STATEMENT_BUDGET, sql
    assert [(pk, payload["type"], payload["job_id"]) for pk, payload in pending] == [
        (start.pk, "workload.start", job.pk)
    ]
    (known, count, sql) = steps["ack"]
    assert known and count <= ACK_STATEMENT_BUDGET, sql
    (outcome, count, sql) = steps["running"]
    assert (outcome.ok, outcome.code) == (True, "")
    assert count <= RUNNING_REPORT_STATEMENT_BUDGET, sql
    (outcome, count, sql) = steps["succeeded"]
    assert (outcome.ok, outcome.code) == (True, "")
    assert count <= SUCCEEDED_REPORT_STATEMENT_BUDGET, sql
    (outcome, count, sql) = steps["resent"]
    assert outcome.code == "duplicate"
    assert count <= DUPLICATE_REPORT_STATEMENT_BUDGET, sql

    # What the reports promise, at that cost.
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)
    assert job.started_at is not None and job.finished_at is not None
    assert list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True).order_by("pk"))[-2:] == [
        JobState.RUNNING,
        JobState.SUCCEEDED,
    ]
    assert transitions.count() == audited_before + 2  # running, succeeded
    assert not Allocation.objects.active().filter(job=job).exists()
    assert cycle_requests == [1]  # the card came free
    assert AgentReport.objects.filter(node=node, report_id__in=[11, 12]).count() == 2
    start.refresh_from_db()
    assert start.ack_ok is True and start.sent_at is not None and start.attempts == 1


def test_a_finish_whose_start_was_never_acknowledged_withdraws_the_start(placed, cycle_requests):
    node, job, start = placed()
    running = report(job, start, "running", 1)
    succeeded = report(job, start, "succeeded", 2, exit_code=0)
    assert workload_report_apply(node_id=node.pk, status=running).ok
    assert workload_report_apply(node_id=node.pk, status=succeeded).ok

    start.refresh_from_db()
    assert (start.ack_ok, start.error) == (False, START_WITHDRAWN)
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    assert commands_pending(node_id=node.pk) == []


def test_a_finish_of_one_replica_leaves_a_gang_running_until_the_last(placed, cycle_requests):
    # The other active allocations are read in the same statement as the rest: a job with a replica still
    # holding its card does not succeed, and does when that one reports too.
    node, job, start = placed()
    Job.objects.filter(pk=job.pk).update(replicas=2)
    other = Allocation.objects.filter(job=job).first()
    device = Device.objects.filter(node=node).exclude(pk=other.device_id).get()
    Allocation.objects.create(
        job=job,
        replica=1,
        tenant_id=job.tenant_id,
        flavor_id=other.flavor_id,
        device=device,
        node=node,
        millis=other.millis,
        memory_mib=other.memory_mib,
        started_at=timezone.now(),
    )
    command_ack(node_id=node.pk, command_id=start.pk)
    assert workload_report_apply(node_id=node.pk, status=report(job, start, "running", 1)).ok
    assert workload_report_apply(node_id=node.pk, status=report(job, start, "succeeded", 2, exit_code=0)).ok
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert Allocation.objects.active().filter(job=job).count() == 1

    last = report(job, start, "succeeded", 3, replica=1, exit_code=0, command_id=0)
    assert workload_report_apply(node_id=node.pk, status=last).ok
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    assert not Allocation.objects.active().filter(job=job).exists()
