"""A short job history in the database, built through the services, with known run times: the input of the
trace export, what-if and their API tests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Allocation, Job
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_cancel, job_submit

FLAVOR = "sim-80g"


def spec(name: str, resources: dict) -> dict:
    return {"name": name, "tenant": "team-a", "resources": {"flavors": [FLAVOR], **resources}, "command": ["x"]}


@dataclass(frozen=True)
class History:
    start: datetime  # the window's start: every job below was submitted after it
    jobs: dict[str, Job]
    gpu_seconds: float  # cards x run time of the jobs that ran


def _ran(job: Job, node, *, submitted: datetime, start: datetime, end: datetime) -> None:
    """Finish ``job`` as its agent would report it, then move its history to the given times."""
    workload_status_report(node=node, job_id=job.pk, replica=0, state="succeeded", exit_code=0, last_checkpoint_at=None)
    Job.objects.filter(pk=job.pk).update(submitted_at=submitted, started_at=start, finished_at=end)
    Allocation.objects.filter(job=job).update(started_at=start, ended_at=end)


def job_history(member, node, *, hours_ago: float = 3) -> History:
    """On a 2-card node: a 1-card job ran 600 s and a half card 1200 s side by side, then a 2-card job 1800 s;
    one job was cancelled before it ran, one was submitted before the window."""
    t0 = timezone.now() - timedelta(hours=hours_ago)
    whole = job_submit(actor=member, spec=spec("whole", {"gpus": 1}))
    half = job_submit(actor=member, spec=spec("half", {"millis": 500, "memory_mib": 10000}))
    run_cycle()
    _ran(whole, node, submitted=t0, start=t0 + timedelta(seconds=60), end=t0 + timedelta(seconds=660))
    _ran(
        half,
        node,
        submitted=t0 + timedelta(seconds=30),
        start=t0 + timedelta(seconds=60),
        end=t0 + timedelta(seconds=1260),
    )
    pair = job_submit(actor=member, spec=spec("pair", {"gpus": 2}))
    run_cycle()
    _ran(
        pair,
        node,
        submitted=t0 + timedelta(seconds=700),
        start=t0 + timedelta(seconds=1300),
        end=t0 + timedelta(seconds=3100),
    )
    cancelled = job_submit(actor=member, spec=spec("cancelled", {"gpus": 2}))
    job_cancel(job=cancelled, actor=member)
    Job.objects.filter(pk=cancelled.pk).update(submitted_at=t0 + timedelta(seconds=800))
    old = job_submit(actor=member, spec=spec("old", {"gpus": 1}))
    run_cycle()
    _ran(old, node, submitted=t0 - timedelta(days=3), start=t0 - timedelta(days=3), end=t0 - timedelta(days=2))
    jobs = {"whole": whole, "half": half, "pair": pair, "cancelled": cancelled, "old": old}
    return History(start=t0 - timedelta(seconds=1), jobs=jobs, gpu_seconds=600 * 1 + 1200 * 0.5 + 1800 * 2)
