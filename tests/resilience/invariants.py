"""The one check every fault test runs after its fault: nothing lost, duplicated, leaked or left inconsistent.

Two kinds of rules:

* *Safety* rules hold at every instant, whatever is in flight: a job's state history is one unbroken chain
  ending in its current state; active allocations belong only to jobs that are starting, running or
  stopping, such a job holds something, and each replica it holds is exactly what the replica asked for, on one
  node; no device is past 1000 millis or its memory; no replica of a job has live processes in two process
  groups (two runs) and no finished job has any.
* *Agreement* rules need the processes and the database to have caught up with each other (a status frame
  in flight, a process just exiting): every live workload runs for a job the database has on exactly those
  devices, and every running job has its one live workload. They are polled until they hold, while the
  safety rules are re-checked at every poll.

Then the audit trail must verify (hash chains, seals, checkpoints, witness file).
"""

from __future__ import annotations

import time
from collections import defaultdict

from django.db.models import Sum
from django.test import override_settings

from scheduler.fleet.models import Device
from scheduler.models import ACTIVE_JOB_STATES, FINAL_JOB_STATES, Allocation, Job, JobEvent, JobState
from tests.resilience.cluster import Cluster, workload_processes


def safety_violations(cluster: Cluster) -> list[str]:
    problems: list[str] = []
    events: dict[int, list[JobEvent]] = defaultdict(list)
    for event in JobEvent.objects.order_by("pk"):
        events[event.job_id].append(event)
    active = defaultdict(list)
    for allocation in Allocation.objects.active().select_related("node", "device"):
        active[allocation.job_id].append(allocation)
    jobs = {job.pk: job for job in Job.objects.all()}
    for job in jobs.values():
        chain = events[job.pk]
        previous = ""
        for event in chain:
            if event.from_state != previous:
                problems.append(f"job {job.pk}: event {event.from_state}->{event.to_state} follows {previous!r}")
            previous = event.to_state
        if previous != job.state:
            problems.append(f"job {job.pk} is {job.state} but its last event says {previous!r}")
        held = active.get(job.pk, [])
        if job.state in ACTIVE_JOB_STATES:
            if not held:
                problems.append(f"job {job.pk} is {job.state} but holds no device")
            # Each replica it holds, it holds whole (a gang member that finished first has let go of its share).
            for replica in {a.replica for a in held}:
                mine = [a for a in held if a.replica == replica]
                millis = sum(a.millis for a in mine)
                if millis != job.millis_per_replica:
                    problems.append(
                        f"job {job.pk} ({job.state}) replica {replica} holds {millis} millis, it asked for "
                        f"{job.millis_per_replica}"
                    )
                nodes = {a.node.name for a in mine}
                if len(nodes) != 1:
                    problems.append(f"job {job.pk} replica {replica} holds devices on {sorted(nodes)}")
        elif held:
            problems.append(f"job {job.pk} is {job.state} yet holds {len(held)} allocation(s): leaked")
    for row in Allocation.objects.active().values("device_id").annotate(millis=Sum("millis"), memory=Sum("memory_mib")):
        device = Device.objects.get(pk=row["device_id"])
        if row["millis"] > 1000 or row["memory"] > device.memory_mib:
            problems.append(f"device {device.uuid} holds {row['millis']} millis / {row['memory']} MiB")
    groups: dict[tuple[int, int], set[int]] = defaultdict(set)
    for process in workload_processes(cluster.run_id):
        groups[(process.job_id, process.replica)].add(process.pgid)
    for (job_id, replica), pgids in groups.items():
        if len(pgids) > 1:
            problems.append(f"job {job_id} replica {replica} runs twice: process groups {sorted(pgids)}")
        job = jobs.get(job_id)
        if job is not None and job.state in FINAL_JOB_STATES:
            problems.append(f"job {job_id} is {job.state} but still has live processes {sorted(pgids)}")
    return problems


def agreement_violations(cluster: Cluster) -> list[str]:
    problems: list[str] = []
    processes = workload_processes(cluster.run_id)
    by_job: dict[int, set[str]] = defaultdict(set)  # every device the job's live processes see (all replicas)
    for process in processes:
        by_job[process.job_id].update(process.devices)
    held: dict[int, tuple[str, ...]] = defaultdict(tuple)
    for allocation in Allocation.objects.active().select_related("device").order_by("device__uuid"):
        held[allocation.job_id] += (allocation.device.uuid,)
    states = dict(Job.objects.values_list("pk", "state"))
    for job_id, devices in by_job.items():
        state = states.get(job_id)
        if state not in (JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTING):
            problems.append(f"job {job_id} has a live workload but is {state}")
        elif tuple(sorted(devices)) != tuple(sorted(set(held[job_id]))):
            problems.append(f"job {job_id} runs on {sorted(devices)} but holds {held[job_id]}")
    for job_id, state in states.items():
        if state == JobState.RUNNING and job_id not in by_job:
            problems.append(f"job {job_id} is running in the database but no process runs it")
    return problems


def assert_audit_verifies(cluster: Cluster) -> None:
    from audit.trail_verifier import verify_trail

    with override_settings(GPUPOOL_AUDIT_WITNESS_PATH=str(cluster.witness_path)):
        report = verify_trail(record_result=False)
    assert report.ok, [finding.as_dict() for finding in report.findings]
    assert report.records > 0


def check_invariants(cluster: Cluster, *, settle_timeout_s: float = 30.0) -> None:
    """Assert every rule above now (safety) or within ``settle_timeout_s`` (agreement), then the audit trail."""
    deadline = time.monotonic() + settle_timeout_s
    while True:
        safety = safety_violations(cluster)
        assert not safety, "safety invariants broken:\n" + "\n".join(safety) + "\n" + cluster.describe()
        agreement = agreement_violations(cluster)
        if not agreement:
            break
        if time.monotonic() > deadline:
            raise AssertionError(
                f"processes and database still disagree after {settle_timeout_s:.0f} s:\n"
                + "\n".join(agreement)
                + "\n"
                + cluster.describe()
            )
        time.sleep(0.3)
    assert_audit_verifies(cluster)
