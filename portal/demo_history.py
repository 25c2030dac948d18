"""The last hour of the demo pool, so the console has something to show at first login: finished jobs spread over
the hour, per-minute telemetry of the demo nodes' cards, a decided and a pending quota request, and two jobs the
live agents go on to run.

The jobs go through the same services as real ones — ``job_submit``, a scheduling cycle that places them, the
agent's acknowledgement, ``workload_status_report`` for running and finished, ``job_log_append`` for output —
played in the order the hour happened. Services stamp rows with the time they run, so afterwards each job's rows
(job, events, allocations, commands, output) are moved back to the minutes its timeline names: the one write here
that no service makes, because no service records the past. Telemetry is what the demo agent's simulated cards
(``nodeagent.backends.simulated``) would have measured under those allocations, folded into minutes as the agent
sockets do and stored by ``telemetry_minutes_write``. The audit trail keeps the true time of every record: it
shows the history being loaded, which is what happened.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.utils import timezone

from catalog.models import ResourceFlavor
from nodeagent.backends.base import WorkloadLoad
from scheduler.fleet.models import AgentCommand, Device, Node
from scheduler.fleet.services.agent_commands import command_ack, commands_pending
from scheduler.fleet.services.rollups import telemetry_hours_rollup, telemetry_minutes_write
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.fleet.telemetry import MinuteAggregator, minute_of
from scheduler.jobspec import EXAMPLE_COMMAND
from scheduler.logs import job_log_append
from scheduler.models import Allocation, Job, JobEvent, JobLogChunk
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tenants.models import ApprovalRequest, ApprovalStep, Tenant, User
from tenants.services.approvals import approval_approve, quota_change_request_create

if TYPE_CHECKING:
    from nodeagent.protocol import DeviceSample
    from portal.demo_nodes import DemoNodeRow

#: How far back the history reaches.
HISTORY_MINUTES = 60
#: Telemetry samples per card and minute (the live agent takes 60; four keep the load under a second).
SAMPLES_PER_MINUTE = 4

#: What the history's jobs ran: the console's example command, a minute of training-like progress.
LOOP_COMMAND = EXAMPLE_COMMAND
#: The jobs still running at first login: an hour of the same, so the live agents have work to show.
LIVE_COMMAND = (
    'python3 -c \'import time; [print("step", s, "loss", round(2.5 / s, 4), flush=True) or time.sleep(5) '
    "for s in range(1, 721)]'"
)


@dataclass(frozen=True)
class PastJob:
    """A finished job of the hour: who ran what, from ``start_min`` to ``end_min`` minutes before now."""

    name: str
    user: str
    tenant: str
    flavor: str
    start_min: float
    end_min: float
    gpus: int = 0  # whole cards per replica, or else
    millis: int = 0  # a fraction of one card
    memory_gib: int = 0  # with this much device memory
    replicas: int = 1
    kind: str = "training"
    exit_code: int = 0
    wait_s: int = 20  # how long it queued before it started

    def spec(self, command: str) -> dict:
        resources: dict = {"flavors": [self.flavor]}
        if self.gpus:
            resources["gpus"] = self.gpus
        else:
            resources |= {"millis": self.millis, "memory_mib": self.memory_gib * 1024}
        return {
            "name": self.name,
            "tenant": self.tenant,
            "kind": self.kind,
            "replicas": self.replicas,
            "resources": resources,
            "command": shlex.split(command),
        }


H100, A100, ASCEND = "nvidia-h100-80g", "nvidia-a100-40g", "ascend-910b"

#: The hour, within the demo quotas (``portal.demo.DEMO_QUOTAS``) and the cards of each flavor at every moment.
PAST_JOBS: list[PastJob] = [
    PastJob("resnet50-train", "bob", "acme-vision", H100, 58, 31, gpus=2, wait_s=35),
    PastJob("vit-finetune", "bob", "acme-vision", A100, 55, 40, millis=500, memory_gib=16),
    PastJob("bert-pretrain", "carol", "acme-nlp", H100, 52, 18, gpus=4, wait_s=50),
    PastJob("llama-pretrain", "carol", "acme-nlp", ASCEND, 50, 12, gpus=4, wait_s=75),
    PastJob("tokenizer-build", "carol", "acme-nlp", A100, 45, 44, millis=300, memory_gib=8, kind="batch", exit_code=1),
    PastJob("whisper-eval", "carol", "acme-nlp", A100, 35, 22, gpus=1, kind="batch"),
    PastJob("embedding-refresh", "alice", "acme-research", ASCEND, 30, 14, gpus=2, kind="batch"),
    PastJob("detr-finetune", "bob", "acme-vision", H100, 28, 6, gpus=1),
    PastJob("vit-distill", "bob", "acme-vision", A100, 20, 7, gpus=2, wait_s=40),
    PastJob("gpt-eval", "carol", "acme-nlp", H100, 15, 9, millis=500, memory_gib=16, kind="batch"),
    PastJob("resnet50-sweep", "bob", "acme-vision", H100, 12, 4, gpus=2, replicas=2, kind="batch", wait_s=60),
    PastJob("pangu-finetune", "carol", "acme-nlp", ASCEND, 10, 3, gpus=1),
]

#: Started a few minutes ago and still running: the live agents take them over.
LIVE_JOBS: list[PastJob] = [
    PastJob("resnet50-train-v2", "bob", "acme-vision", H100, 0, 0, gpus=1),
    PastJob("bert-finetune", "carol", "acme-nlp", H100, 0, 0, millis=500, memory_gib=16),
]


def load_history(*, nodes: list[DemoNodeRow], now: datetime | None = None) -> None:
    """Write the hour before ``now`` on ``nodes`` (the jobs of flavors no node has are left out), then submit
    the live jobs. Called once, inside :func:`portal.demo.load_demo_data`'s transaction."""
    now = now or timezone.now()
    flavors = _node_flavors(nodes)
    jobs = [job for job in PAST_JOBS if job.flavor in flavors]
    _play_jobs(jobs, now=now)
    _write_telemetry(nodes, now=now)
    _quota_requests(now=now)
    users = _users()
    for live in LIVE_JOBS:
        job_submit(actor=users[live.user], spec=live.spec(LIVE_COMMAND))


def _users() -> dict:
    return {user.username: user for user in User.objects.filter(username__in={"admin", "alice", "bob", "carol"})}


def _node_flavors(nodes: list[DemoNodeRow]) -> set[str]:
    ids = [device_id for node in nodes for device_id in node.device_ids.values()]
    return set(Device.objects.filter(pk__in=ids).values_list("flavor__name", flat=True))


# --- jobs ---------------------------------------------------------------------------------------------------


def _play_jobs(jobs: list[PastJob], *, now: datetime) -> None:
    """Submit, place, run and finish ``jobs`` in the order of their starts and ends, then date them."""
    users = _users()
    # Ends before starts at the same minute: the cards are free again for the job that follows.
    moments = sorted(
        [(job.start_min, 1, index) for index, job in enumerate(jobs)]
        + [(job.end_min, 0, index) for index, job in enumerate(jobs)],
        key=lambda moment: (-moment[0], moment[1]),
    )
    placed: dict[int, Job] = {}
    for _minute, is_start, index in moments:
        past = jobs[index]
        if is_start:
            job = job_submit(actor=users[past.user], spec=past.spec(LOOP_COMMAND))
            run_cycle()
            job.refresh_from_db()
            if job.state != "admitted":
                raise RuntimeError(f"demo history: {past.name} was not placed ({job.pending_message})")
            for node_id in set(Allocation.objects.filter(job=job).values_list("node_id", flat=True)):
                for command_id, _payload in commands_pending(node_id=node_id):
                    command_ack(node_id=node_id, command_id=command_id)
            placed[index] = job
            _report(job, state="running", exit_code=None)
            continue
        job = placed[index]
        for replica, node_id in _replicas(job):
            job_log_append(
                node_id=node_id, job_id=job.pk, replica=replica, offset=0, text=_output(past, replica=replica)
            )
        _report(job, state="succeeded" if past.exit_code == 0 else "failed", exit_code=past.exit_code)
    for index, job in placed.items():
        _date(job, jobs[index], now=now)


def _replicas(job: Job) -> list[tuple[int, int]]:
    return sorted(set(Allocation.objects.filter(job=job).values_list("replica", "node_id")))


def _report(job: Job, *, state: str, exit_code: int | None) -> None:
    """What the node's agent reports for each replica of ``job``."""
    for replica, node_id in _replicas(job):
        workload_status_report(
            node=Node.objects.get(pk=node_id),
            job_id=job.pk,
            replica=replica,
            state=state,
            exit_code=exit_code,
            last_checkpoint_at=None,
            message="" if exit_code in (None, 0) else f"replica {replica} exited with code {exit_code}",
        )


def _output(past: PastJob, *, replica: int) -> str:
    """The job's output as its command would have printed it (cut short where it failed)."""
    if past.exit_code:
        return (
            "Traceback (most recent call last):\n"
            '  File "<string>", line 1, in <module>\n'
            "FileNotFoundError: [Errno 2] No such file or directory: 'corpus/shard-0001.txt'\n"
        )
    epochs = 30 if past.replicas == 1 else 15
    return "".join(f"epoch {epoch} of 30\n" for epoch in range(1, epochs + 1)) + (
        f"replica {replica} done\n" if past.replicas > 1 else "done\n"
    )


def _date(job: Job, past: PastJob, *, now: datetime) -> None:
    """Move the rows the services wrote for ``job`` to the minutes of its timeline."""
    started = now - timedelta(minutes=past.start_min)
    ended = now - timedelta(minutes=past.end_min)
    submitted = started - timedelta(seconds=past.wait_s)
    running = started + timedelta(seconds=3)
    at_state = {
        "submitted": submitted,
        "queued": submitted,
        "admitted": started,
        "running": running,
        "succeeded": ended,
        "failed": ended,
    }
    type(job).objects.filter(pk=job.pk).update(
        submitted_at=submitted,
        queued_at=submitted,
        admitted_at=started,
        started_at=running,
        finished_at=ended,
        updated_at=ended,
    )
    for state, moment in at_state.items():
        JobEvent.objects.filter(job=job, to_state=state).update(created_at=moment)
    Allocation.objects.filter(job=job).update(started_at=started, ended_at=ended)
    AgentCommand.objects.filter(job=job).update(created_at=started, sent_at=started, acked_at=started)
    JobLogChunk.objects.filter(job=job).update(created_at=ended)


# --- telemetry ----------------------------------------------------------------------------------------------


def _write_telemetry(nodes: list[DemoNodeRow], *, now: datetime) -> None:
    """Per-minute rollups of every demo card over the hour: what its simulated backend measures under the
    history's allocations, sampled ``SAMPLES_PER_MINUTE`` times a minute."""
    current = minute_of(now)
    first = current - timedelta(minutes=HISTORY_MINUTES)
    allocations = list(
        Allocation.objects.filter(ended_at__gt=first, started_at__lt=current).values_list(
            "device__uuid", "millis", "memory_mib", "started_at", "ended_at"
        )
    )
    aggregator = MinuteAggregator()
    step = timedelta(seconds=60 / SAMPLES_PER_MINUTE)
    for node in nodes:
        backend = node.demo.backend()
        uuids = set(node.device_ids)
        moment = first + step / 2
        while moment < current:
            backend.observe_workloads(
                [
                    WorkloadLoad(uuid=uuid, millis=millis, memory_mib=memory_mib or None, pid=None)
                    for uuid, millis, memory_mib, started, ended in allocations
                    if uuid in uuids and started <= moment < ended
                ]
            )
            for sample in backend.sample():
                aggregator.add(uuid=sample.uuid, sample=_sample_dict(sample), at=moment)
            moment += step
        backend.close()
    device_ids = {uuid: device_id for node in nodes for uuid, device_id in node.device_ids.items()}
    telemetry_minutes_write(aggregates=aggregator.drain(None), device_ids=device_ids)
    telemetry_hours_rollup(now=now)


def _sample_dict(sample: DeviceSample) -> dict:
    return {
        "utilization_pct": sample.utilization_pct,
        "memory_used_mib": sample.memory_used_mib,
        "power_w": sample.power_w,
        "temperature_c": sample.temperature_c,
    }


# --- approvals ----------------------------------------------------------------------------------------------


def _quota_requests(*, now: datetime) -> None:
    """alice (tenant admin of research) asked for more Ascend cards for NLP, which the system admin granted, and
    now asks for a larger A100 guarantee for Vision, which waits in the system admin's inbox."""
    users = _users()
    granted = quota_change_request_create(
        actor=users["alice"],
        tenant=Tenant.objects.get(slug="acme-nlp"),
        flavor=ResourceFlavor.objects.get(name=ASCEND),
        values={"guaranteed_millis": 4000},
        reason="The LLaMA pretraining run needs four Ascend cards of its own for the next two weeks.",
    )
    approval_approve(
        actor=users["admin"], approval=granted, comment="Fits: research keeps four Ascend cards for its other teams."
    )
    asked, decided = now - timedelta(minutes=50), now - timedelta(minutes=47)
    ApprovalRequest.objects.filter(pk=granted.pk).update(created_at=asked, decided_at=decided, updated_at=decided)
    ApprovalStep.objects.filter(request=granted).update(created_at=decided)
    pending = quota_change_request_create(
        actor=users["alice"],
        tenant=Tenant.objects.get(slug="acme-vision"),
        flavor=ResourceFlavor.objects.get(name=A100),
        values={"guaranteed_millis": 2000},
        reason="Evaluation sweeps for the ViT models need a second A100 through next week.",
    )
    asked = now - timedelta(minutes=8)
    ApprovalRequest.objects.filter(pk=pending.pk).update(created_at=asked, updated_at=asked)
