"""What agents report about workloads (``workload.status``): applied once per report, moving the job on; the
requeue of a lost node's jobs; and the sweeps for stops that were never confirmed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from kernel.db.bulk import AnyOf, update_instance
from nodeagent import protocol
from scheduler.fleet import outbox
from scheduler.fleet.models import AgentCommand, Node
from scheduler.models import ACTIVE_JOB_STATES, Allocation, Job, JobKind
from scheduler.services.cycle import request_cycle
from scheduler.services.scaling import scale_down_replica_stopped
from scheduler.snapshot import CompiledQuery
from scheduler.transitions import S, allocations_end, job_lock_for_update, job_requeue, job_transition

logger = logging.getLogger(__name__)


# --- reports from agents ------------------------------------------------------------------------------


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
    savepoint: bool = True,
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

    ``savepoint=False``: called in a transaction that rolls back whenever this raises (an agent report's, which
    also writes the report's ``AgentReport`` row), so it needs no savepoint of its own (two statements a report).
    """
    with transaction.atomic(savepoint=savepoint):
        return _workload_status_apply(
            node=node,
            job_id=job_id,
            replica=replica,
            state=state,
            exit_code=exit_code,
            last_checkpoint_at=last_checkpoint_at,
            message=message,
            log_tail=log_tail,
            reason=reason,
            command_id=command_id,
        )


def _workload_status_apply(
    *,
    node: Node,
    job_id: int,
    replica: int,
    state: str,
    exit_code: int | None,
    last_checkpoint_at: datetime | None,
    message: str,
    log_tail: str,
    reason: str,
    command_id: int,
) -> str:
    # The job row only, FOR NO KEY UPDATE (project lock order: Job before Allocation and Node rows). Without its
    # tenant: the audit record takes the tenant's id.
    job = _job_locked(job_id)
    if job is None:
        logger.warning("workload.status for unknown job %s from node %s", job_id, node.pk)
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=None, job_id=job_id, replica=replica, reason="unknown_job")
        return "unknown_job"
    # Everything else the report depends on, in one statement, read once the job's lock is held (as the four
    # separate reads it replaces were): the allocations and the starts of the run.
    run = _run_facts(job_id=job.pk, node_id=node.pk, replica=replica, command_id=command_id)
    if not run.held:
        # Only a node the job ran on may report on it: another node's agent (or a stolen credential) must not
        # fail, finish or move the checkpoint of a job it never held. Its own copy is stopped: nothing runs
        # on a node that the portal did not place there.
        logger.warning("workload.status for job %s from node %s, which never held it: ignored", job_id, node.pk)
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=job, job_id=job_id, replica=replica, reason="not_allocated")
        return "not_held"
    if run.newer_start:
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=job, job_id=job_id, replica=replica, reason="superseded")
        return "stale_run"
    changed: list[str] = []  # fields of the job set here, saved with its transition or on their own at the end
    if last_checkpoint_at is not None and (
        job.last_checkpoint_at is None or last_checkpoint_at > job.last_checkpoint_at
    ):
        job.last_checkpoint_at = last_checkpoint_at
        changed.append("last_checkpoint_at")
    if not run.active:
        # A run this node holds no devices for any more: the job was requeued (the node was declared lost, or a
        # stop timed out) while this copy went on. Its report must not finish, fail or move the job, whose
        # current run is elsewhere; a copy still running is told to stop, so the job never runs twice.
        _save_changed(job, changed)
        if state in ("starting", "running"):
            _stop_stray_copy(node=node, job=job, job_id=job_id, replica=replica, reason="not_allocated")
        return "not_allocated"
    outcome = _apply(
        job=job,
        node=node,
        run=run,
        replica=replica,
        state=state,
        exit_code=exit_code,
        changed=changed,
        message=message,
        log_tail=log_tail,
        reason=reason,
    )
    _save_changed(job, changed)
    return outcome


@dataclass(frozen=True)
class _RunFacts:
    """What a report on (job, node, replica) needs to know besides the job row, read in one statement."""

    held: bool  # the node ever held an allocation of the job
    active: bool  # the node holds the replica now (an active allocation)
    newer_start: bool  # a ``workload.start`` of the replica on the node newer than the report's run
    unacked_start: bool  # a ``workload.start`` of the replica on the node not acknowledged yet
    others_active: bool  # the job holds active allocations besides the replica's on the node


def _run_facts(*, job_id: int, node_id: int, replica: int, command_id: int) -> _RunFacts:
    vendor = connection.vendor
    sql = _RUN_FACTS_SQL.get(vendor)
    if sql is None:
        # The start's replica is in its JSON payload (PostgreSQL: text, SQLite: JSON value compared).
        replica_of = (
            "(c.payload ->> 'replica') = %s" if vendor == "postgresql" else "json_extract(c.payload, '$.replica') = %s"
        )
        starts = (
            f"SELECT 1 FROM {AgentCommand._meta.db_table} c WHERE c.job_id = %s AND c.node_id = %s"
            f" AND c.command_type = 'workload.start' AND {replica_of}"
        )
        allocations = f"SELECT 1 FROM {Allocation._meta.db_table} a WHERE a.job_id = %s"
        sql = _RUN_FACTS_SQL[vendor] = (
            f"SELECT EXISTS({allocations} AND a.node_id = %s),"
            f" EXISTS({allocations} AND a.node_id = %s AND a.replica = %s AND a.ended_at IS NULL),"
            f" EXISTS({starts} AND c.id > %s),"
            f" EXISTS({starts} AND c.acked_at IS NULL),"
            f" EXISTS({allocations} AND a.ended_at IS NULL AND NOT (a.node_id = %s AND a.replica = %s))"
        )
    replica_param = str(replica) if vendor == "postgresql" else replica
    # An agent from before ``command_id`` (0) is not told apart from the run it reports on: no start is "newer".
    newer_than = command_id if command_id else _NO_NEWER_START
    params = [
        job_id,
        node_id,
        job_id,
        node_id,
        replica,
        job_id,
        node_id,
        replica_param,
        newer_than,
        job_id,
        node_id,
        replica_param,
        job_id,
        node_id,
        replica,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return _RunFacts(*(bool(value) for value in row))


#: The statement of ``_run_facts`` per database vendor (written once: composing it through the ORM cost more CPU
#: than the database spends answering it).
_RUN_FACTS_SQL: dict[str, str] = {}
#: Larger than any command id: ``c.id > %s`` is then false.
_NO_NEWER_START = 2**62

#: The job columns a report reads or writes (the others are deferred: loaded on first use, which no common report
#: needs). ``job_transition`` reads ``state``, ``started_at``, ``kind``, ``scaling_down_replicas`` and the tenant's
#: id; a scale-down's stop (``scale_down_replica_stopped``) reads ``replicas`` too.
_REPORT_JOB_FIELDS = (
    "id",
    "tenant",
    "kind",
    "state",
    "replicas",
    "started_at",
    "last_checkpoint_at",
    "scaling_down_replicas",
)
#: The job row FOR NO KEY UPDATE with those columns, compiled once per process (``CompiledQuery``: composing it
#: through the ORM cost more CPU than the database spends answering it).
_JOB_LOCKED = CompiledQuery(
    lambda pks: (
        Job.objects.select_for_update(of=("self",), no_key=True).filter(AnyOf("pk", pks)).only(*_REPORT_JOB_FIELDS)
    ),
    arguments=1,
    instances=True,
)


def _job_locked(job_id: int) -> Job | None:
    """The job row, FOR NO KEY UPDATE where the database has it, with the columns a report uses."""
    rows = _JOB_LOCKED.rows([job_id])
    return rows[0] if rows else None


def _save_changed(job: Job, changed: list[str]) -> None:
    if changed:
        update_instance(job, [*changed, "updated_at"])
        changed.clear()


def _apply(
    *,
    job: Job,
    node: Node,
    run: _RunFacts,
    replica: int,
    state: str,
    exit_code: int | None,
    changed: list[str],
    message: str,
    log_tail: str,
    reason: str,
) -> str:
    """The report's effect on a run the node holds (``run.active``); ``changed`` as in the caller, emptied when a
    transition saved those fields with the job's state."""
    job_id = job.pk
    details = {"replica": replica, "node": node.name, "exit_code": exit_code}
    if log_tail:
        details["log_tail"] = log_tail[-2000:]
    text = message[:300]

    if state in ("starting", "checkpointed"):
        return "applied"
    if state == "stopped" and replica in (job.scaling_down_replicas or []):
        _save_changed(job, changed)
        scale_down_replica_stopped(job=job, replica=replica, node=node)
        return "applied"
    if state == "running":
        if job.state == S.ADMITTED:
            _transition(job, changed, to_state=S.RUNNING, reason="running", message=text, details=details)
        return "applied"

    # The replica's run on this node has ended: its allocations end, and its start, if no agent acknowledged
    # it, is withdrawn (the run is known: no need to read it back as ``allocations_end`` does).
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Allocation._meta.db_table} SET ended_at = %s"
            " WHERE job_id = %s AND node_id = %s AND replica = %s AND ended_at IS NULL",
            [connection.ops.adapt_datetimefield_value(timezone.now()), job_id, node.pk, replica],
        )
        freed = cursor.rowcount > 0
    if freed:
        if run.unacked_start:
            outbox.workload_starts_withdraw(runs=[(job_id, replica, node.pk)])
        transaction.on_commit(request_cycle)
    if job.state not in ACTIVE_JOB_STATES:
        return "applied"  # already cancelled, requeued or finished: the report only confirms the stop
    remaining = Allocation.objects.active().filter(job=job)

    if state == "succeeded":
        if not run.others_active:
            job.exit_code = exit_code
            changed.append("exit_code")
            _transition(job, changed, to_state=S.SUCCEEDED, reason="succeeded", message=text, details=details)
    elif state == "stopped" and reason == protocol.FENCED and job.state != S.PREEMPTING:
        # The node's agent lost the portal and stopped the job itself (fencing), before the grace period would
        # have moved it: not the job's failure. Like a lost node: the gang's other members stop, and it resumes
        # from its checkpoint wherever it is placed next.
        outbox.stop_active_replicas(job=job, reason="gang_member_fenced")
        allocations_end(remaining)
        why = f"Node {node.name} lost contact with the portal, and its agent stopped the job there (fencing)."
        _transition(job, changed, to_state=S.NODE_LOST, reason="fenced", message=why, details=details)
        job_requeue(job, reason="fenced", message=f"{why.removesuffix('.')}; requeued.")
    elif state == "failed" or (state == "stopped" and job.state != S.PREEMPTING):
        # A gang cannot go on without one of its members: stop the others and fail the job.
        outbox.stop_active_replicas(job=job, reason="gang_member_failed")
        allocations_end(remaining)
        job.exit_code = exit_code
        changed.append("exit_code")
        why = text or (
            f"replica {replica} exited with code {exit_code}" if exit_code is not None else "replica stopped"
        )
        cause = reason[:32] if state == "failed" and reason else state
        _transition(job, changed, to_state=S.FAILED, reason=cause, message=why, details=details)
    elif state == "stopped":
        if not run.others_active:
            _save_changed(job, changed)
            job_requeue(job, reason="preempted", message="Preempted and requeued.")
    elif state == "lost":
        outbox.stop_active_replicas(job=job, reason="gang_member_lost")
        allocations_end(remaining)
        _transition(
            job, changed, to_state=S.NODE_LOST, reason="lost", message=text or "Workload lost.", details=details
        )
        job_requeue(job, reason="lost", message="The workload was lost; requeued.")
    else:
        logger.warning("unknown workload state %r for job %s", state, job_id)
    return "applied"


def _transition(job: Job, changed: list[str], **kwargs) -> None:
    """``job_transition`` by the system, saving the fields in ``changed`` in the same UPDATE."""
    job_transition(job=job, actor=None, also_save=changed, **kwargs)
    changed.clear()


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
        job = job_lock_for_update(job_id)
        replicas = Allocation.objects.active().filter(job=job)
        for replica, node_id in replicas.values_list("replica", "node_id").distinct().order_by("replica", "node_id"):
            outbox.workload_stop_create(job=job, replica=replica, node_id=node_id, reason=reason)
        allocations_end(Allocation.objects.filter(job=job))
        if job.state in ACTIVE_JOB_STATES:
            job_transition(job=job, to_state=S.NODE_LOST, actor=None, reason=reason, message=why)
            job_requeue(job, reason=reason, message=f"{why.removesuffix('.')}; requeued.")
            count += 1
    if job_ids:
        transaction.on_commit(request_cycle)
    return count


# --- stops never confirmed ---------------------------------------------------------------------------


def jobs_awaiting_stop_sweep(*, older_than_s: float = 300.0) -> int:
    """Requeue preempting jobs whose agents never confirmed the stop (e.g. a silent node) after a timeout, and
    release the cards of cancelled jobs whose stop was never confirmed."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    cancelled = Allocation.objects.active().filter(job__state=S.CANCELLED, job__updated_at__lt=cutoff)
    for job_id in sorted(set(cancelled.values_list("job_id", flat=True))):
        with transaction.atomic():
            allocations_end(Allocation.objects.filter(job=job_lock_for_update(job_id)))
            transaction.on_commit(request_cycle)
    stale = list(
        Job.objects.filter(state=S.PREEMPTING, updated_at__lt=cutoff).filter(~Q(allocations__isnull=True)).distinct()
    )
    count = 0
    for job in stale:
        with transaction.atomic():
            locked = job_lock_for_update(job.pk)
            if locked.state != S.PREEMPTING:
                continue
            allocations_end(Allocation.objects.filter(job=locked))
            job_requeue(locked, reason="stop_timeout", message="The node did not confirm the stop in time; requeued.")
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
            job = job_lock_for_update(pk)
            for replica in list(job.scaling_down_replicas):
                nodes = Allocation.objects.active().filter(job=job, replica=replica).values_list("node_id", flat=True)
                for node in Node.objects.filter(pk__in=set(nodes)).order_by("pk"):
                    scale_down_replica_stopped(job=job, replica=replica, node=node)
            if job.scaling_down_replicas:  # replicas whose allocations had already ended
                job.scaling_down_replicas = []
                job.save(update_fields=["scaling_down_replicas", "updated_at"])
            count += 1
    return count
