"""Commands to node agents: written as ``AgentCommand`` rows inside the caller's transaction, announced to the
node's agent consumer only after commit (so an agent never hears of a decision that was rolled back)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from kernel.channel_send import run_with_channel_layer
from kernel.db.bulk import insert_rows, mark_saved, reserve_ids
from nodeagent import protocol
from scheduler import launch, serving, storage_paths
from scheduler.fleet.models import AgentCommand, Node
from scheduler.logs import job_log_ends
from scheduler.models import Allocation, Job

logger = logging.getLogger(__name__)

DEFAULT_STOP_GRACE_S = 30.0
#: Rows per INSERT (PostgreSQL takes at most 65,535 parameters per statement).
BULK_BATCH = 1000


def _create(*, node: Node | int, job: Job | None, message: protocol.Message) -> AgentCommand:
    node_id = node if isinstance(node, int) else node.pk
    command = AgentCommand.objects.create(node_id=node_id, job=job, command_type=message.type, payload={})
    # The frame carries its own row's id, so the agent's ack names it; the pk exists only after the insert.
    message.command_id = command.pk
    message.id = f"cmd-{command.pk}"
    command.payload = protocol.to_dict(message)
    command.save(update_fields=["payload"])
    announce_after_commit([command])
    return command


def workload_start_message(*, job: Job, replica: int, allocations: Iterable[Allocation]) -> protocol.WorkloadStart:
    """The ``workload.start`` frame for one replica (``command_id`` is filled in when the row exists)."""
    return workload_start_frame(
        job=job,
        replica=replica,
        devices=[(a.device.index, a.device.uuid, a.millis, a.memory_mib) for a in allocations],
        log_offset=job_log_ends(job_ids=[job.pk]).get((job.pk, replica), 0),
    )


def workload_start_frame(
    *,
    job: Job,
    replica: int,
    devices: Iterable[tuple[int, str, int, int]],
    log_offset: int = 0,
    layout: launch.Launch | None = None,
) -> protocol.WorkloadStart:
    """The ``workload.start`` frame for one replica given its devices as ``(index, uuid, millis, memory_mib)``
    (what a cycle has at hand without loading each allocation's device row). ``log_offset``: where this run's
    output continues the replica's log (``scheduler.logs.job_log_ends``; 0 for a first run). ``layout``: the
    job's ports and addresses (``scheduler.launch``), whose launch variables the replica gets; they override
    the job's own variables of the same names, as Kubeflow's operators do."""
    env = {**job.env}
    if layout is not None:
        env.update(launch.launch_env(layout, replica=replica, replicas=job.replicas))
    env["GPUPOOL_REPLICA"] = str(replica)
    env["GPUPOOL_REPLICAS"] = str(job.replicas)
    if job.last_checkpoint_at is not None:
        # A requeued job resumes: tell it when its last checkpoint was taken.
        env["GPUPOOL_LAST_CHECKPOINT_AT"] = protocol.format_time(job.last_checkpoint_at)
    return protocol.WorkloadStart(
        command_id=0,
        job_id=job.pk,
        replica=replica,
        command=list(job.command),
        env=env,
        working_dir=job.working_dir or None,
        devices=[
            protocol.DeviceAssignment(uuid=uuid, millis=millis, memory_mib=memory_mib or None)
            for _index, uuid, millis, memory_mib in sorted(devices)
        ],
        checkpoint_dir=storage_paths.checkpoint_dir(
            tenant_id=job.tenant_id, job_id=job.pk, requested=job.checkpoint_dir or ""
        )
        or None,
        shared_dir=storage_paths.tenant_dir(job.tenant_id) or "",
        output_dir=(job.spec or {}).get("output_dir") or "",
        output_max_bytes=settings.GPUPOOL_OUTPUT_MAX_BYTES if (job.spec or {}).get("output_dir") else 0,
        max_runtime_s=job.max_runtime_s,
        # The agent's sandbox: the tenant's uid, and the replica's cgroup limits (0 means "no limit").
        tenant_id=job.tenant_id,
        cpu_cores=job.cpu_millicores_per_replica / 1000 or None,
        host_memory_mib=job.host_memory_mib_per_replica or None,
        image=(job.spec or {}).get("image") or None,
        log_offset=log_offset,
        hostfile=layout.hostfile() if layout is not None else "",
        peer_addresses=layout.peer_addresses() if layout is not None else [],
        launcher=(job.spec or {}).get("launcher") or "",
    )


def workload_start_create(*, job: Job, replica: int, allocations: Iterable[Allocation]) -> AgentCommand:
    """``workload.start`` for one replica; all its allocations are on one node."""
    allocations = list(allocations)
    message = workload_start_message(job=job, replica=replica, allocations=allocations)
    return _create(node=allocations[0].node_id, job=job, message=message)


def commands_bulk_create(items: list[tuple[int, Job | None, protocol.Message]]) -> list[AgentCommand]:
    """Many commands at once, ``(node id, job, message)`` each: two statements however many (a cycle's starts)."""
    if not items:
        return []
    # Ids first (PostgreSQL), so each frame carries its row's id in the same COPY; SQLite inserts, then
    # writes the payloads.
    ids = reserve_ids(AgentCommand, len(items))
    if ids is not None:
        now = timezone.now()
        commands = []
        for pk, (node_id, job, message) in zip(ids, items, strict=True):
            message.command_id = pk
            message.id = f"cmd-{pk}"
            commands.append(
                AgentCommand(
                    pk=pk,
                    node_id=node_id,
                    job=job,
                    command_type=message.type,
                    payload=protocol.to_dict(message),
                    created_at=now,
                )
            )
        insert_rows(
            AgentCommand,
            ("id", "node_id", "job_id", "command_type", "payload", "created_at", "error", "attempts"),
            [(c.pk, c.node_id, c.job_id, c.command_type, c.payload, now, "", 0) for c in commands],
        )
        mark_saved(commands)  # they are rows now
    else:
        commands = AgentCommand.objects.bulk_create(
            AgentCommand(node_id=node_id, job=job, command_type=message.type, payload={})
            for node_id, job, message in items
        )
        for command, (_node_id, _job, message) in zip(commands, items, strict=True):
            message.command_id = command.pk
            message.id = f"cmd-{command.pk}"
            command.payload = protocol.to_dict(message)
        AgentCommand.objects.bulk_update(commands, ["payload"], batch_size=BULK_BATCH)
    announce_after_commit(commands)
    return commands


def workload_stop_create(
    *, job: Job, replica: int, node_id: int, grace_s: float = DEFAULT_STOP_GRACE_S, reason: str = "cancelled"
) -> AgentCommand:
    message = protocol.WorkloadStop(
        command_id=0,
        job_id=job.pk,
        replica=replica,
        grace_s=float(grace_s),
        reason=reason,
        drain_s=serving.stop_drain_s(job),
    )
    # The serving proxy drops the replica before the node hears of the stop (on-commit callbacks run in order):
    # a replica taken back stops receiving traffic first, and its SIGTERM waits ``drain_s`` for the requests the
    # proxy had already routed to it.
    serving.sync_on_commit(job)
    return _create(node=node_id, job=job, message=message)


#: ``AgentCommand.error`` of a ``workload.start`` withdrawn before any agent acknowledged it.
START_WITHDRAWN = "withdrawn: the run ended before the agent acknowledged its start"


def workload_starts_withdraw(*, runs: Iterable[tuple[int, int, int]]) -> int:
    """Withdraw the unacknowledged ``workload.start`` of each run (job id, replica, node id) that has ended.

    A node cut off from the portal gets every unacknowledged command when it reconnects: a start for a run whose
    allocation ended meanwhile (its node was declared lost and the job moved on, or it was cancelled) would run a
    copy beside the job's next run. Withdrawn starts are marked acknowledged (``ack_ok`` false, ``error``
    :data:`START_WITHDRAWN`) and never sent again; a start that did arrive is still ended by the
    ``workload.stop`` that goes with the end of the run. Returns the number withdrawn.
    """
    runs_filter = Q()
    for job_id, replica, node_id in runs:
        runs_filter |= Q(job_id=job_id, node_id=node_id, payload__replica=replica)
    if not runs_filter:
        return 0
    return (
        AgentCommand.objects.unacked()
        .filter(runs_filter, command_type="workload.start")
        .update(acked_at=timezone.now(), ack_ok=False, error=START_WITHDRAWN)
    )


def stop_active_replicas(
    *, job: Job, grace_s: float = DEFAULT_STOP_GRACE_S, reason: str, exclude_replica: int | None = None
) -> list[AgentCommand]:
    """A ``workload.stop`` for every replica of ``job`` that holds an active allocation (one per node)."""
    pairs = (
        Allocation.objects.active()
        .filter(job=job)
        .values_list("replica", "node_id")
        .distinct()
        .order_by("replica", "node_id")
    )
    return [
        workload_stop_create(job=job, replica=replica, node_id=node_id, grace_s=grace_s, reason=reason)
        for replica, node_id in pairs
        if replica != exclude_replica
    ]


def announce_after_commit(commands: Iterable[AgentCommand]) -> None:
    """After commit, tell each node's agent consumer (group ``agent.node.<id>``) that a command waits."""
    items = [(command.node_id, command.pk) for command in commands]
    if items:
        transaction.on_commit(lambda: _announce(items))


def _announce(items: list[tuple[int, int]]) -> None:

    async def send_all(layer) -> None:
        # All in one trip into the event loop: one trip per command cost ~4 ms of thread hand-off each, seconds
        # after a cycle that starts thousands of workloads.
        for node_id, command_id in items:
            try:
                await layer.group_send(f"agent.node.{node_id}", {"type": "agent.command", "command_id": command_id})
            except Exception:
                # The row is committed: the consumer resends every unacked command on (re)connect.
                logger.warning("could not announce command %s to node %s", command_id, node_id, exc_info=True)

    try:
        run_with_channel_layer(send_all)
    except Exception:
        logger.warning("could not announce %d commands", len(items), exc_info=True)
