"""Group commit on PostgreSQL: writes handed in by many threads share transactions; a failing write fails only its
own caller, and nothing of its group is lost or written twice."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, transaction

from audit.models import AuditRecord
from audit.trail_verifier import verify_trail
from kernel.db.group_commit import GroupCommit
from scheduler.models import Job, JobEvent
from scheduler.services.jobs import job_submit_prepare, job_submit_write

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

SPEC = {"name": "g", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["true"]}


def _in_threads(count: int, target) -> list[BaseException]:
    failures: list[BaseException] = []
    start = threading.Barrier(count)

    def run(index: int) -> None:
        try:
            start.wait()
            target(index)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


def test_concurrent_submits_share_transactions_and_each_job_gets_its_own_audit_record(
    postgres, member, node, no_cycle_requests, settings, tmp_path
):
    settings.GPUPOOL_AUDIT_WITNESS_PATH = str(tmp_path / "witness.jsonl")
    group = GroupCommit(max_group=8)
    made: list[int] = []

    def submit(index: int) -> None:
        for n in range(25):  # 200 submits from 8 threads
            prepared = job_submit_prepare(actor=member, spec={**SPEC, "name": f"g-{index}-{n}"})
            made.append(group.run(lambda prepared=prepared: job_submit_write(prepared)).pk)

    assert _in_threads(8, submit) == []
    assert len(made) == len(set(made)) == 200 == Job.objects.count()
    assert JobEvent.objects.count() == 400
    assert group.stats.writes == 200 and group.stats.largest > 1  # they did share transactions
    assert group.stats.groups < 200
    records = list(AuditRecord.objects.filter(action="job.submit").order_by("stream", "seq"))
    assert sorted(int(r.target.split(":")[1]) for r in records) == sorted(made)  # one per job, none twice
    assert verify_trail(record_result=False).ok


def test_a_failing_write_fails_only_its_caller_and_the_rest_of_its_group_commits(postgres, member, node):
    group = GroupCommit(max_group=64)
    gate = threading.Event()
    results: dict[int, object] = {}

    def slow_first() -> int:
        gate.wait(5)  # holds the committer so that the next writes queue up as one group
        return job_submit_write(job_submit_prepare(actor=member, spec={**SPEC, "name": "first"})).pk

    def write(index: int) -> object:
        if index == 3:
            job_submit_write(job_submit_prepare(actor=member, spec={**SPEC, "name": "bad"}))
            raise IntegrityError("this write broke its transaction")
        return job_submit_write(job_submit_prepare(actor=member, spec={**SPEC, "name": f"w-{index}"})).pk

    def run(index: int) -> None:
        try:
            results[index] = group.run(slow_first) if index == 0 else group.run(lambda: write(index))
        except IntegrityError as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(0,))]
    threads[0].start()
    while group.stats.groups == 0:
        threading.Event().wait(0.01)
    threads += [threading.Thread(target=run, args=(i,)) for i in range(1, 8)]
    for thread in threads[1:]:
        thread.start()
    threading.Event().wait(0.3)
    gate.set()
    for thread in threads:
        thread.join()
    connection.close()

    assert isinstance(results[3], IntegrityError)
    assert all(isinstance(results[i], int) for i in (0, 1, 2, 4, 5, 6, 7))
    assert group.stats.regrouped == 1  # the group of writes 1..7 was rolled back and run again one by one
    names = sorted(Job.objects.values_list("name", flat=True))
    assert names == sorted(["first", *[f"w-{i}" for i in (1, 2, 4, 5, 6, 7)]])  # none lost, none twice, "bad" gone


def test_inside_an_open_transaction_the_write_runs_inline(postgres, member, node):
    group = GroupCommit()
    with transaction.atomic():
        job = group.run(lambda: job_submit_write(job_submit_prepare(actor=member, spec=SPEC)))
        assert Job.objects.filter(pk=job.pk).exists()
    assert group.stats.groups == 0
