"""What agents report about workloads (``workload.status``): applied once per report, moving the job on; the
requeue of a lost node's jobs; and the sweeps for stops that were never confirmed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from nodeagent import protocol
from scheduler import outbox
from scheduler.models import ACTIVE_JOB_STATES, AgentCommand, Allocation, Job, JobKind, Node
from scheduler.services.cycle import request_cycle
from scheduler.services.scaling import _scale_down_replica_stopped
from scheduler.services.transitions import S, _end_allocations, _lock_job, _requeue, job_transition

logger = logging.getLogger(__name__)


# --- reports from agents ------------------------------------------------------------------------------


@transaction.atomic
def workload_status_report(
    *,
    node: Node,
    job_id: int,
    replica: int,
    state: str,
    exit_code: int | None,
    last_checkpoint_at: datetime | None,
    message: str = "",
    log_tail: str = "",
    reason: str = "",
    command_id: int = 0,
) -> str:
    """Apply an agent's ``workload.status`` for one replica; idempotent (a repeated report changes nothing).

    ``reason`` is the agent's cause of a final state when it knows one (``oom_killed``, ``sandbox_failed``,
    ``rejected``); a failed job's transition carries it instead of the bare ``failed``. A replica ``stopped`` with
    reason ``fenced`` (its agent lost the portal and stopped it) requeues the job, as a lost node does.

    ``command_id`` is the ``workload.start`` of the run the report is about (0 from agents before it): a report on
    an earlier run of the replica on this node — a late or repeated one, after the job was requeued and placed
    here again — is ``stale_run`` and changes nothing (before, its ``stopped`` failed the new run).

    Returns what it came to: ``applied`` (the report was for the run the node holds; it may still have changed
    nothing, e.g. a second ``succeeded``), or why it was ignored: ``unknown_job``, ``not_held`` (the node never
    held the job), ``stale_run``, ``not_allocated`` (the node no longer holds that replica). A workload still
    running that is not the node's to run is told to stop in each of those cases.
    """
    # The job row only, FOR NO KEY UPDATE (project lock order: Job before Allocation and Node rows).
    job = Job.objects.select_for_update(of=("self",), no_key=True).select_related("tenant").filter(pk=job_id).first()
    if job is None:
        logger.warning("workload.status for unknown job %s from node %s", job_id, node.pk)
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=None, job_id=job_id, replica=replica, reason="unknown_job")
        return "unknown_job"
    if not Allocation.objects.filter(job=job, node=node).exists():
        # Only a node the job ran on may report on it: another node's agent (or a stolen credential) must not
        # fail, finish or move the checkpoint of a job it never held. Its own copy is stopped: nothing runs
        # on a node that the portal did not place there.
        logger.warning("workload.status for job %s from node %s, which never held it: ignored", job_id, node.pk)
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=job, job_id=job_id, replica=replica, reason="not_allocated")
        return "not_held"
    if command_id and command_id < _current_start_id(job=job, node=node, replica=replica):
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=job, job_id=job_id, replica=replica, reason="superseded")
        return "stale_run"
    if last_checkpoint_at is not None and (
        job.last_checkpoint_at is None or last_checkpoint_at > job.last_checkpoint_at
    ):
        job.last_checkpoint_at = last_checkpoint_at
        job.save(update_fields=["last_checkpoint_at", "updated_at"])
    replica_allocations = Allocation.objects.active().filter(job=job, replica=replica, node=node)
    if not replica_allocations.exists():
        # A run this node holds no devices for any more: the job was requeued (the node was declared lost, or a
        # stop timed out) while this copy went on. Its report must not finish, fail or move the job, whose
        # current run is elsewhere; a copy still running is told to stop, so the job never runs twice.
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=job, job_id=job_id, replica=replica, reason="not_allocated")
        return "not_allocated"
    details = {"replica": replica, "node": node.name, "exit_code": exit_code}
    if log_tail:
        details["log_tail"] = log_tail[-2000:]
    text = message[:300]

    if state in ("starting", "checkpointed"):
        return "applied"
    if state == "stopped" and replica in (job.scaling_down_replicas or []):
        _scale_down_replica_stopped(job=job, replica=replica, node=node)
        return "applied"
    if state == "running":
        if job.state == S.ADMITTED and replica_allocations.exists():
            job_transition(job=job, to_state=S.RUNNING, actor=None, reason="running", message=text, details=details)
        return "applied"

    freed = _end_allocations(replica_allocations) > 0
    if freed:
        transaction.on_commit(request_cycle)
    if job.state not in ACTIVE_JOB_STATES:
        return "applied"  # already cancelled, requeued or finished: the report only confirms the stop
    remaining = Allocation.objects.active().filter(job=job)

    if state == "succeeded":
        if not remaining.exists():
            job.exit_code = exit_code
            job.save(update_fields=["exit_code"])
            job_transition(job=job, to_state=S.SUCCEEDED, actor=None, reason="succeeded", message=text, details=details)
    elif state == "stopped" and reason == protocol.FENCED and job.state != S.PREEMPTING:
        # The node's agent lost the portal and stopped the job itself (fencing), before the grace period would
        # have moved it: not the job's failure. Like a lost node: the gang's other members stop, and it resumes
        # from its checkpoint wherever it is placed next.
        outbox.stop_active_replicas(job=job, reason="gang_member_fenced")
        _end_allocations(remaining)
        why = f"Node {node.name} lost contact with the portal, and its agent stopped the job there (fencing)."
        job_transition(job=job, to_state=S.NODE_LOST, actor=None, reason="fenced", message=why, details=details)
        _requeue(job, reason="fenced", message=f"{why.removesuffix('.')}; requeued.")
    elif state == "failed" or (state == "stopped" and job.state != S.PREEMPTING):
        # A gang cannot go on without one of its members: stop the others and fail the job.
        outbox.stop_active_replicas(job=job, reason="gang_member_failed")
        _end_allocations(remaining)
        job.exit_code = exit_code
        job.save(update_fields=["exit_code"])
        why = text or (
            f"replica {replica} exited with code {exit_code}" if exit_code is not None else "replica stopped"
        )
        cause = reason[:32] if state == "failed" and reason else state
        job_transition(job=job, to_state=S.FAILED, actor=None, reason=cause, message=why, details=details)
    elif state == "stopped":
        if not remaining.exists():
            _requeue(job, reason="preempted", message="Preempted and requeued.")
    elif state == "lost":
        outbox.stop_active_replicas(job=job, reason="gang_member_lost")
        _end_allocations(remaining)
        job_transition(
            job=job, to_state=S.NODE_LOST, actor=None, reason="lost", message=text or "Workload lost.", details=details
        )
        _requeue(job, reason="lost", message="The workload was lost; requeued.")
    else:
        logger.warning("unknown workload state %r for job %s", state, job_id)
    return "applied"


def _current_start_id(*, job: Job, node: Node, replica: int) -> int:
    """The id of the newest ``workload.start`` of ``job``'s ``replica`` on ``node`` (its latest run there), or 0."""
    starts = AgentCommand.objects.filter(job=job, node=node, command_type="workload.start", payload__replica=replica)
    return starts.order_by("-pk").values_list("pk", flat=True).first() or 0


def _stop_stray_copy(*, node: Node, job: Job | None, job_id: int, replica: int, reason: str) -> None:
    """Tell ``node`` to stop its copy of ``job_id``/``replica`` unless a stop for it is already on its way."""
    pending = AgentCommand.objects.unacked().filter(
        node=node, command_type="workload.stop", payload__job_id=job_id, payload__replica=replica
    )
    if pending.exists():
        return
    logger.warning("node %s runs job %s replica %s, which is not its to run: stopping it", node.name, job_id, replica)
    if job is not None:
        outbox.workload_stop_create(job=job, replica=replica, node_id=node.pk, reason=reason)
    else:  # no job row to point at (a job the portal does not know)
        stop = protocol.WorkloadStop(command_id=0, job_id=job_id, replica=replica, reason=reason)
        outbox.commands_bulk_create([(node.pk, None, stop)])


@transaction.atomic
def node_jobs_requeue(
    *, node: Node, reason: str = "node_lost", job_ids: Collection[int] | None = None, message: str = ""
) -> int:
    """Every job with an active allocation on ``node`` loses all its allocations and goes back to the queue.

    Replicas on other nodes are told to stop (a gang cannot go on without its lost members), and so are the
    lost node's own: a node declared lost may only be cut off (or too slow to heartbeat), and the stop waits in
    the outbox until its agent is heard from again, so the old copy never runs beside the requeued one.
    ``job_ids`` limits it to those jobs (a reconnected agent that no longer has them); ``message`` replaces
    "Node <name> was lost." in the job's history. Returns the number of jobs requeued.
    """
    held = Allocation.objects.active().filter(node=node)
    if job_ids is not None:
        held = held.filter(job_id__in=list(job_ids))
    job_ids = sorted(set(held.values_list("job_id", flat=True)))
    why = message or f"Node {node.name} was lost."
    count = 0
    for job_id in job_ids:
        job = _lock_job(job_id)
        replicas = Allocation.objects.active().filter(job=job)
        for replica, node_id in replicas.values_list("replica", "node_id").distinct().order_by("replica", "node_id"):
            outbox.workload_stop_create(job=job, replica=replica, node_id=node_id, reason=reason)
        _end_allocations(Allocation.objects.filter(job=job))
        if job.state in ACTIVE_JOB_STATES:
            job_transition(job=job, to_state=S.NODE_LOST, actor=None, reason=reason, message=why)
            _requeue(job, reason=reason, message=f"{why.removesuffix('.')}; requeued.")
            count += 1
    if job_ids:
        transaction.on_commit(request_cycle)
    return count


# --- stops never confirmed ---------------------------------------------------------------------------


def jobs_awaiting_stop_sweep(*, older_than_s: float = 300.0) -> int:
    """Requeue preempting jobs whose agents never confirmed the stop (e.g. a silent node) after a timeout."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    stale = list(
        Job.objects.filter(state=S.PREEMPTING, updated_at__lt=cutoff).filter(~Q(allocations__isnull=True)).distinct()
    )
    count = 0
    for job in stale:
        with transaction.atomic():
            locked = _lock_job(job.pk)
            if locked.state != S.PREEMPTING:
                continue
            _end_allocations(Allocation.objects.filter(job=locked))
            _requeue(locked, reason="stop_timeout", message="The node did not confirm the stop in time; requeued.")
            count += 1
    return count + _scale_down_stop_sweep(cutoff=cutoff)


def _scale_down_stop_sweep(*, cutoff: datetime) -> int:
    """Replicas stopped for a scale-down whose stop was never confirmed: treated as stopped after the timeout,
    as preempted jobs are, so the service's capacity does not stay in limbo."""
    stale = Job.objects.filter(
        kind=JobKind.INFERENCE, state__in=[S.ADMITTED, S.RUNNING], updated_at__lt=cutoff
    ).exclude(scaling_down_replicas=[])
    count = 0
    for pk in stale.values_list("pk", flat=True):
        with transaction.atomic():
            job = _lock_job(pk)
            for replica in list(job.scaling_down_replicas):
                nodes = Allocation.objects.active().filter(job=job, replica=replica).values_list("node_id", flat=True)
                for node in Node.objects.filter(pk__in=set(nodes)).order_by("pk"):
                    _scale_down_replica_stopped(job=job, replica=replica, node=node)
            if job.scaling_down_replicas:  # replicas whose allocations had already ended
                job.scaling_down_replicas = []
                job.save(update_fields=["scaling_down_replicas", "updated_at"])
            count += 1
    return count
