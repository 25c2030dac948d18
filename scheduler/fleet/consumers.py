"""WebSockets of the fleet: ``/ws/agent/`` (node agents) and ``/ws/telemetry/`` (browsers).

Both are thin: authentication, framing and fan-out here; every state change is a call into ``services``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from kernel.api import DomainError
from nodeagent import protocol
from scheduler import logs
from scheduler.fleet import selectors
from scheduler.fleet.batching import db, socket_executor
from scheduler.fleet.fencing import lease_timing
from scheduler.fleet.runtime import fleet_process
from scheduler.fleet.services.agent_commands import (
    RETRYABLE_REPORT_ERRORS,
    ReportOutcome,
    command_ack,
    commands_pending,
    workload_report_apply,
    workload_status_forward,
)
from scheduler.fleet.services.enrolment import CLOSE_REPLACED, CLOSE_UNAUTHORIZED, credential_authenticate
from scheduler.fleet.services.inventory import node_hello, node_workloads_reconcile
from scheduler.fleet.services.lease import node_disconnected
from scheduler.fleet.services.notify import agent_group
from scheduler.fleet.telemetry import (
    LATEST_FIELDS,
    ROLLUP_SPREAD_S,
    WATCH_TTL_S,
    MinuteAggregator,
    Throttle,
    latest_store,
    parse_time,
)

logger = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403


#: The channel layer alias of live telemetry (Redis pub/sub; see CHANNEL_LAYERS in portal/settings.py).
TELEMETRY_LAYER = "telemetry"
#: Largest frame a telemetry viewer may send: its frames are ``{"subscribe": {"node": <id>}}`` and the like.
MAX_VIEWER_FRAME_CHARS = 4096


def node_group(node_id: int) -> str:
    return f"node.{node_id}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}"


def bearer_token(scope: dict) -> str:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


def _peer(scope: dict) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _frame_id(raw: str | bytes | None) -> str | None:
    """The id of a refused frame, for the ``error`` frame's ``ref_id``; None when it cannot be read."""
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, RecursionError):  # not JSON, or nested past what the parser can take
        return None
    value = data.get("id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


class WithoutConnectionSweep:
    """Dispatch without channels' per-message ``close_old_connections``.

    channels ≥ 4.2 runs it before every message, as a hop onto the one thread-sensitive worker thread: at
    1,000 agents that is 1,000 hops a second, each queued behind the other sockets' database work, and with
    ``CONN_MAX_AGE=0`` it also closes the connection ``runtime.db`` keeps. These consumers reach the database
    only through ``runtime.db`` (which drops a broken connection itself) or ``database_sync_to_async`` (which
    closes connections around each call), so the sweep buys them nothing.
    """

    async def dispatch(self, message: dict) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)


class AgentConsumer(WithoutConnectionSweep, AsyncWebsocketConsumer):
    """One node agent. Authenticated by ``Authorization: Bearer <node credential>``; the newest connection of a
    node wins. Telemetry is kept in memory per connection (latest values to Redis, minute aggregates flushed
    once a minute) and fanned out as one frame per node per tick."""

    #: Wall clock for lease and rollups; tests replace it.
    clock: Callable[[], datetime] = staticmethod(timezone.now)

    async def connect(self) -> None:
        self.node_id: int | None = None
        self.node_name = ""
        self.hello_done = False
        self.heartbeat_acks = False
        self.replaced = False
        self.device_ids: dict[str, int] = {}
        self.aggregator = MinuteAggregator()
        self.db_executor = None
        credential = await db(credential_authenticate)(credential=bearer_token(self.scope), peer=_peer(self.scope))
        # Accept before closing so the agent sees the 4401 code (a refused handshake is only an HTTP 403).
        await self.accept()
        if credential is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        node_id = credential.node_id
        # From here on the socket's database work runs on its node's thread (``socket_executor``).
        self.db_executor = socket_executor(node_id)
        await self.channel_layer.group_send(
            agent_group(node_id), {"type": "agent.replaced", "channel": self.channel_name}
        )
        await self.channel_layer.group_add(agent_group(node_id), self.channel_name)
        # A revocation between the check above and joining the group would have been missed: look again.
        if not await self.on_node_thread(selectors.credential_is_active)(credential_id=credential.pk):
            await self.channel_layer.group_discard(agent_group(node_id), self.channel_name)
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.node_id = node_id
        self.node_name = credential.node.name
        # Nodes write their finished minute at different seconds past it, not a thousand at :00.
        self.rollup_delay = timedelta(seconds=node_id % ROLLUP_SPREAD_S)
        timing = lease_timing()
        await self.send_message(
            protocol.Config(
                telemetry_interval_s=float(settings.GPUPOOL_TELEMETRY_INTERVAL_S),
                heartbeat_interval_s=float(timing.heartbeat_interval_s),
                fence_after_s=float(timing.fence_after_s),
                fence_grace_s=float(timing.fence_grace_s),
                requeue_after_s=float(timing.requeue_after_s),
                heartbeat_acks=True,
            )
        )

    async def disconnect(self, code: int) -> None:
        if self.node_id is None:
            return
        await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)
        if self.hello_done:
            fleet_process().node_disconnected(self.node_id)
        await self.flush_rollups(None, wait=True)
        if not self.replaced:
            await self.on_node_thread(node_disconnected)(node_id=self.node_id, now=self.clock())

    def on_node_thread(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """``func`` run on this node's database thread (``socket_executor``; the process's one thread before the
        node is known)."""
        return db(func, executor=self.db_executor)

    async def send_message(self, message: protocol.Message) -> None:
        await self.send(text_data=protocol.encode(message))

    async def send_error(self, code: str, detail: str, ref_id: str | None = None) -> None:
        await self.send_message(protocol.Error(code=code, detail=detail, ref_id=ref_id))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.node_id is None:
            return
        raw = text_data if text_data is not None else bytes_data
        try:
            message = protocol.decode(raw or "")
        except protocol.ProtocolError as exc:
            logger.warning("node %s sent a bad frame: %s", self.node_name, exc)
            await self.send_error(exc.code, exc.detail, _frame_id(raw))
            return
        if message.type not in protocol.AGENT_TO_PORTAL:
            await self.send_error(
                protocol.ErrorCode.UNKNOWN_TYPE, f"{message.type!r} is a portal-to-agent frame", message.id
            )
            return
        if message.type != "hello" and not self.hello_done:
            await self.send_error("hello_required", "send hello (the node's inventory) first", message.id)
            return
        handler = getattr(self, "on_" + message.type.replace(".", "_"))
        try:
            await handler(message)
        except DomainError as exc:
            logger.warning("node %s: %s refused: %s", self.node_name, message.type, exc.message)
            await self.send_error(exc.code, exc.message, message.id)
        except Exception:
            # One bad frame must not cost the node its connection.
            logger.exception("node %s: handling %s failed", self.node_name, message.type)
            await self.send_error("internal_error", f"the portal could not process this {message.type}", message.id)

    # --- frames from the agent -------------------------------------------------------------------------------

    async def on_hello(self, message: protocol.Hello) -> None:
        if message.node_name != self.node_name:
            await self.send_error(
                "node_name_mismatch",
                f"this credential belongs to node {self.node_name!r}, not {message.node_name!r}; register again",
                message.id,
            )
            return
        self.device_ids = await self.on_node_thread(node_hello)(
            node_id=self.node_id, hello=dataclasses.asdict(message), now=self.clock()
        )
        await self.reconcile_workloads(message)
        fleet = fleet_process()
        if not self.hello_done:
            fleet.node_connected(self.node_id)
        fleet.set_tenant_map(
            self.node_id, await self.on_node_thread(selectors.device_tenants_of_node)(node_id=self.node_id)
        )
        self.hello_done = True
        self.heartbeat_acks = message.heartbeat_acks
        await self.send_pending_commands()

    async def on_heartbeat(self, message: protocol.Heartbeat) -> None:
        # Written with the other sockets' heartbeats about once a second (runtime.FleetProcess).
        fleet_process().beat(self.node_id, self.clock())
        if self.heartbeat_acks:  # the agent fences on these answers (nodeagent.fencing)
            await self.send_message(protocol.HeartbeatAck(seq=message.seq))
        await self.flush_finished_minutes(self.clock())

    async def on_telemetry(self, message: protocol.Telemetry) -> None:
        now = self.clock()
        sampled_at = parse_time(message.sampled_at or message.sent_at, default=now)
        devices: dict[str, dict] = {}
        at_text = sampled_at.isoformat()
        for sample in message.samples:
            if sample.uuid not in self.device_ids:
                continue  # not in this node's hello: not ours to record
            # Attribute reads, not dataclasses.asdict: this runs 8,000 times a second for 1,000 nodes.
            values = {name: getattr(sample, name) for name in LATEST_FIELDS}
            self.aggregator.add(uuid=sample.uuid, sample=values, at=sampled_at)
            devices[sample.uuid] = {**values, "at": at_text}
        # A batch buffered while disconnected is history: rollups only, never shown as live.
        if devices and not message.buffered:
            # Watchers first; the latest values (snapshots, /metrics) are written behind the socket's back.
            await self.fan_out(devices, sent_at=message.sent_at)
            fleet_process().in_background(latest_store().aput(self.node_id, devices), what="latest telemetry")
        await self.flush_finished_minutes(now)

    async def reconcile_workloads(self, message: protocol.Hello) -> None:
        """Requeue what the node lost and stop what it should not run (see ``node_workloads_reconcile``).

        Before the unacknowledged commands go out, so a ``workload.start`` still on its way is not mistaken
        for a lost workload. A failure here costs the reconcile, not the hello: the next hello tries again.
        """
        workloads = [dataclasses.asdict(workload) for workload in message.workloads]
        try:
            result = await self.on_node_thread(node_workloads_reconcile)(
                node_id=self.node_id, workloads=workloads, complete=message.workloads_complete
            )
        except Exception:
            logger.exception("node %s: reconciling the workloads of its hello failed", self.node_name)
            return
        if result.requeued or result.stopped:
            logger.warning(
                "node %s: %d job(s) requeued (workload missing), %d workload(s) told to stop (not its to run)",
                self.node_name,
                result.requeued,
                len(result.stopped),
            )

    async def on_workload_status(self, message: protocol.WorkloadStatus) -> None:
        status = dataclasses.asdict(message)
        if message.report_id is None:  # an agent from before the outbox: it expects no ack
            await self.on_node_thread(workload_status_forward)(node_id=self.node_id, status=status)
            return
        try:
            outcome = await self.on_node_thread(workload_report_apply)(node_id=self.node_id, status=status)
        except RETRYABLE_REPORT_ERRORS as exc:
            # Not acked: the agent keeps the report and sends it again (a deadlock or a database restart must
            # not leave a job running for ever, as an unresent "succeeded" once did).
            logger.warning(
                "node %s: report %s (job %s %s) not applied, the agent will resend it: %s",
                self.node_name,
                message.report_id,
                message.job_id,
                message.state,
                exc,
            )
            await self.send_error(
                "retry_later", f"report {message.report_id} could not be applied now; send it again", message.id
            )
            return
        except DomainError as exc:
            logger.error(
                "node %s: report %s (job %s %s) refused: %s",
                self.node_name,
                message.report_id,
                message.job_id,
                message.state,
                exc.message,
            )
            outcome = ReportOutcome(ok=False, code=exc.code, detail=exc.message)
        except Exception as exc:
            # Resending would fail the same way for ever: acknowledge it as refused, and keep the trace.
            logger.exception(
                "node %s: report %s (job %s %s) failed",
                self.node_name,
                message.report_id,
                message.job_id,
                message.state,
            )
            outcome = ReportOutcome(
                ok=False, code="internal_error", detail=f"the portal could not apply this report ({type(exc).__name__})"
            )
        await self.send_message(
            protocol.ReportAck(report_id=message.report_id, ok=outcome.ok, code=outcome.code, detail=outcome.detail)
        )

    async def on_workload_log(self, message: protocol.WorkloadLog) -> None:
        """Store a piece of a workload's output (``scheduler.logs``), tell the log's followers, ack it."""
        piece = logs.LogPiece(
            node_id=self.node_id,
            job_id=message.job_id,
            replica=message.replica,
            offset=message.offset,
            text=message.text,
        )
        try:
            outcome = await fleet_process().store_log_piece(piece)
        except RETRYABLE_REPORT_ERRORS as exc:
            logger.warning(
                "node %s: log of job %s not stored, the agent will resend it: %s", self.node_name, message.job_id, exc
            )
            await self.send_error("retry_later", "the log piece could not be stored now; send it again", message.id)
            return
        except Exception as exc:
            # Resending would fail the same way for ever: refuse it, and keep the trace.
            logger.exception("node %s: storing the log of job %s failed", self.node_name, message.job_id)
            outcome = logs.LogAppendOutcome(
                next_offset=message.next_offset, ok=False, code="internal_error", detail=type(exc).__name__
            )
        if outcome.stored_bytes:
            # After the commit, from here and in the background: neither the database thread nor this socket waits
            # on Redis. A lost nudge costs the followers a few seconds: they look again on their own.
            nudge = {"type": "log.appended", "next_offset": outcome.next_offset}
            group = logs.job_log_group(message.job_id, message.replica)
            fleet_process().in_background(self.channel_layer.group_send(group, nudge), what="log follower nudges")
        await self.send_message(
            protocol.WorkloadLogAck(
                job_id=message.job_id,
                replica=message.replica,
                offset=message.offset,
                next_offset=outcome.next_offset,
                ok=outcome.ok,
                code=outcome.code,
                detail=outcome.detail,
            )
        )

    async def on_ack(self, message: protocol.Ack) -> None:
        known = await self.on_node_thread(command_ack)(
            node_id=self.node_id, command_id=message.command_id, ok=message.ok, error=message.error
        )
        if not known:
            logger.info("node %s acked unknown command %s", self.node_name, message.command_id)

    # --- fan-out and rollups -----------------------------------------------------------------------------------

    async def fan_out(self, devices: dict[str, dict], *, sent_at: str) -> None:
        """One frame per node per tick to the node's watchers, and to each tenant holding some of its devices
        a frame with only that tenant's devices."""
        # Only to groups someone watches: a group send costs Redis round trips even when the group is empty.
        fleet = fleet_process()
        layer = get_channel_layer(TELEMETRY_LAYER)
        batch = {"node": self.node_id, "name": self.node_name, "sent_at": sent_at, "devices": devices}
        if node_group(self.node_id) in fleet.watched:
            await layer.group_send(
                node_group(self.node_id), {"type": "telemetry.batch", "node": self.node_id, "batch": batch}
            )
        for tenant_id, uuids in fleet.tenant_maps.get(self.node_id, {}).items():
            own = {uuid: values for uuid, values in devices.items() if uuid in uuids}
            if own and tenant_group(tenant_id) in fleet.watched:
                await layer.group_send(
                    tenant_group(tenant_id),
                    {"type": "telemetry.batch", "node": self.node_id, "batch": {**batch, "devices": own}},
                )

    async def flush_finished_minutes(self, now: datetime) -> None:
        """Hand over the minutes that ended at least this node's ``rollup_delay`` ago."""
        if self.aggregator.has_finished(now - self.rollup_delay):
            await self.flush_rollups(now - self.rollup_delay)

    async def flush_rollups(self, now: datetime | None, *, wait: bool = False) -> None:
        """Hand the finished minutes (all of them when ``now`` is None) to the process's group write; only a
        closing socket waits for it."""
        finished = self.aggregator.drain(now)
        if not finished:
            return
        if wait:
            await fleet_process().minutes.submit([(finished, self.device_ids)])
        else:
            fleet_process().write_minutes_soon(finished, self.device_ids)

    async def send_pending_commands(self, command_id: int | None = None) -> None:
        commands = await self.on_node_thread(commands_pending)(node_id=self.node_id, command_id=command_id)
        for _pk, payload in commands:
            await self.send(text_data=json.dumps(payload, separators=(",", ":")))

    # --- channel layer events ----------------------------------------------------------------------------------

    async def agent_command(self, event: dict) -> None:
        # Before hello the agent is not ready; the hello handler sends everything unacked anyway.
        if self.hello_done:
            await self.send_pending_commands(command_id=event.get("command_id"))

    async def agent_disconnect(self, event: dict) -> None:
        await self.close(code=event.get("code", CLOSE_UNAUTHORIZED))

    async def agent_replaced(self, event: dict) -> None:
        if event.get("channel") != self.channel_name:
            self.replaced = True
            await self.close(code=CLOSE_REPLACED)


class TelemetryConsumer(WithoutConnectionSweep, AsyncJsonWebsocketConsumer):
    """A browser watching live telemetry.

    A system admin subscribes to nodes (``{"subscribe": {"node": <id>}}``); a tenant user is joined to the
    groups of its tenant subtree and sees only devices allocated to those tenants. Frames to one subscriber
    are coalesced per node and throttled to one message per ``throttle_interval_s``; the first message after
    connecting or subscribing carries the latest known values (a snapshot), so a reconnecting viewer resyncs.
    """

    channel_layer_alias = TELEMETRY_LAYER
    throttle_interval_s = 1.0
    monotonic: Callable[[], float] = staticmethod(time.monotonic)

    async def connect(self) -> None:
        self.groups_joined: set[str] = set()
        self.pending: dict[int, dict] = {}
        self.flush_task: asyncio.Task | None = None
        self.watch_task: asyncio.Task | None = None
        self.throttle = Throttle(interval_s=self.throttle_interval_s, clock=self.monotonic)
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.is_admin = selectors.is_telemetry_admin(user)
        self.tenant_ids: list[int] = []
        if not self.is_admin:
            self.tenant_ids = await database_sync_to_async(selectors.telemetry_tenant_ids_for)(user)
            if not self.tenant_ids:
                await self.send_json({"type": "error", "code": "forbidden", "detail": "you may watch no telemetry"})
                await self.close(code=CLOSE_FORBIDDEN)
                return
            for tenant_id in self.tenant_ids:
                await self.join(tenant_group(tenant_id))
            visible = await database_sync_to_async(selectors.tenant_devices)(tenant_ids=self.tenant_ids)
            await self.add_snapshot(visible)
        await self.send_json({"type": "welcome", "admin": self.is_admin, "tenants": self.tenant_ids})

    async def join(self, group: str) -> None:
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.add(group)
        await latest_store().awatch([group])
        # Agent sockets of this process see the watch at once; those of other processes within a second.
        fleet_process().watched.add(group)
        if self.watch_task is None:
            self.watch_task = asyncio.ensure_future(self.renew_watches())

    async def renew_watches(self) -> None:
        while True:
            await asyncio.sleep(WATCH_TTL_S / 3)
            if self.groups_joined:
                await latest_store().awatch(self.groups_joined)

    async def disconnect(self, code: int) -> None:
        for task in (self.flush_task, getattr(self, "watch_task", None)):
            if task is not None:
                task.cancel()
        for group in getattr(self, "groups_joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs) -> None:
        """A viewer's frame that is binary, oversized, not JSON or nested past what the parser takes gets an
        ``error`` frame and the socket stays open (an unhandled parse error would close it with 1011)."""
        if text_data is None or len(text_data) > MAX_VIEWER_FRAME_CHARS:
            await self.send_json(
                {
                    "type": "error",
                    "code": "malformed",
                    "detail": f"send a JSON text frame of at most {MAX_VIEWER_FRAME_CHARS} characters",
                }
            )
            return
        try:
            content = await self.decode_json(text_data)
        except (ValueError, RecursionError):
            await self.send_json({"type": "error", "code": "malformed", "detail": "send a JSON object"})
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: dict, **kwargs) -> None:
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "code": "malformed", "detail": "send a JSON object"})
            return
        for action in ("subscribe", "unsubscribe"):
            target = content.get(action)
            if isinstance(target, dict) and "node" in target:
                await self.change_subscription(action, target["node"])
                return
        await self.send_json(
            {"type": "error", "code": "malformed", "detail": 'send {"subscribe": {"node": <id>}} or "unsubscribe"'}
        )

    async def change_subscription(self, action: str, node: object) -> None:
        if not self.is_admin:
            await self.send_json(
                {
                    "type": "error",
                    "code": "forbidden",
                    "detail": "only system admins watch whole nodes; you see the devices allocated to your tenants",
                }
            )
            return
        if isinstance(node, bool) or not isinstance(node, int):
            await self.send_json({"type": "error", "code": "invalid", "detail": "node must be a node id (integer)"})
            return
        if action == "unsubscribe":
            await self.channel_layer.group_discard(node_group(node), self.channel_name)
            self.groups_joined.discard(node_group(node))
            self.pending.pop(node, None)
            return
        if not await database_sync_to_async(selectors.node_exists)(node_id=node):
            await self.send_json({"type": "error", "code": "not_found", "detail": f"there is no node {node}"})
            return
        await self.join(node_group(node))
        await self.send_json({"type": "subscribed", "node": node})
        await self.add_snapshot({node: None})

    async def add_snapshot(self, visible: dict[int, set[str] | None]) -> None:
        """Queue the latest values of ``visible`` (node → device UUIDs, None = all) as the next message."""
        if not visible:
            return
        latest = await latest_store().aget_nodes(visible.keys())
        names = await database_sync_to_async(selectors.node_names)(node_ids=list(visible))
        for node_id, uuids in visible.items():
            devices = {
                uuid: values for uuid, values in latest.get(node_id, {}).items() if uuids is None or uuid in uuids
            }
            if devices:
                batch = {"node": node_id, "name": names.get(node_id, ""), "sent_at": None, "devices": devices}
                self.queue(node_id, {**batch, "snapshot": True})
        await self.maybe_flush()

    def queue(self, node_id: int, batch: dict) -> None:
        entry = self.pending.get(node_id)
        if entry is None:
            self.pending[node_id] = {**batch, "devices": dict(batch["devices"]), "coalesced": 0}
            return
        entry["devices"].update(batch["devices"])
        entry["coalesced"] += 1
        for key in ("name", "sent_at"):
            if batch.get(key):
                entry[key] = batch[key]

    async def telemetry_batch(self, event: dict) -> None:
        self.queue(event["node"], event["batch"])
        await self.maybe_flush()

    async def maybe_flush(self) -> None:
        if not self.pending:
            return
        delay = self.throttle.delay()
        if delay <= 0:
            if self.flush_task is not None:
                self.flush_task.cancel()
                self.flush_task = None
            await self.flush()
        elif self.flush_task is None:
            self.flush_task = asyncio.ensure_future(self.flush_later(delay))

    async def flush_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.flush_task = None
        await self.flush()

    async def flush(self) -> None:
        if not self.pending:
            return
        nodes = list(self.pending.values())
        self.pending = {}
        self.throttle.sent()
        await self.send_json({"type": "telemetry", "nodes": nodes})
