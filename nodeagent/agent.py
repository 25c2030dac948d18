"""The agent's connection loop: hello, heartbeats, telemetry, portal commands, reconnects.

The loop is a repeated single step (STYLE.md #7): :meth:`Agent.tick` does one step and returns the delay
until the next one, reading time only from the injected clock, so tests drive it without real time. One
step polls the workloads, takes a telemetry sample when it is due, (re)connects when the backoff allows it,
handles the frames that arrived, and sends what is due. Telemetry taken while disconnected waits in a
bounded buffer (oldest dropped first) and is sent after the reconnect marked ``buffered``. Workload status
reports wait in the runner's durable outbox (``nodeagent.outbox``) until the portal answers ``report.ack``:
they are sent after every hello and again every ``report_resend_s`` while unacknowledged, so none is lost to a
dropped connection, a portal that could not apply it, or an agent restart.

Fencing (``nodeagent.fencing``): the portal answers each heartbeat with ``heartbeat.ack`` (older portals: the
agent follows each heartbeat with a WebSocket ping and counts the pong). When no answer has come for the portal's
``fence_after_s`` the agent stops every workload (SIGTERM, the fence grace to checkpoint, SIGKILL), so none runs
on after the portal has moved its job to another node; while fenced, nothing runs on the node. The first answer
lifts the fence, and the ``stopped`` reports (reason ``fenced``) go to the portal from the outbox like any other.
The ack, not the pong, is what counts when the portal sends it: a web process whose socket still answers pings
while its handler of this agent is stuck records no heartbeat, and its node is declared lost all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from nodeagent import __version__, protocol
from nodeagent.backends.base import DeviceBackend
from nodeagent.fencing import FENCE_FILE, Fence, FenceSettings
from nodeagent.logstream import BACKLOG_BYTES, LOG_INTERVAL_S, LogShipper
from nodeagent.sampling import Sampler
from nodeagent.workloads import WorkloadRejected, WorkloadRunner

log = logging.getLogger(__name__)

#: Close codes the portal uses (see scheduler.fleet.services).
CLOSE_UNAUTHORIZED = 4401
CLOSE_REPLACED = 4409
#: A report still unacknowledged this long after it was sent is sent again on the same connection (the portal
#: answered ``retry_later``, or the frame or its ack went missing).
REPORT_RESEND_S = 5.0
#: Heartbeats whose send time is kept for the portal's ``heartbeat.ack`` (older ones confirm nothing new).
HEARTBEATS_REMEMBERED = 64
#: The longest a tick sleeps, so workload exits are noticed promptly even with slow telemetry.
MAX_TICK_DELAY_S = 1.0
#: Acknowledged log offsets are written to ``state.json`` at most this often (and when a workload's log is
#: complete); after a crash the agent resends at most this much output, which the portal ignores.
LOG_ACK_SAVE_S = 30.0


def ws_url_for(server: str, path: str = "/ws/agent/") -> str:
    """``http://host:8000`` → ``ws://host:8000/ws/agent/`` (``https`` → ``wss``); a ws(s) URL keeps its scheme."""
    parts = urlsplit(server if "://" in server else f"http://{server}")
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"server URL {server!r} must start with http://, https://, ws:// or wss://")
    if path.startswith(("ws://", "wss://")):
        return path
    base = parts.path.rstrip("/")
    return urlunsplit((scheme, parts.netloc, base + "/" + path.lstrip("/"), "", ""))


class Backoff:
    """Exponential backoff with "equal jitter": attempt n waits between half and all of min(cap, base·2ⁿ).

    The jitter spreads a fleet's reconnects after a portal restart; the floor keeps one agent from
    hammering a portal that is down.
    """

    def __init__(self, *, base_s: float = 1.0, cap_s: float = 60.0, rng: random.Random | None = None) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.rng = rng or random.Random()
        self.attempt = 0

    def bounds(self, attempt: int) -> tuple[float, float]:
        ceiling = min(self.cap_s, self.base_s * 2**attempt)
        return ceiling / 2, ceiling

    def next_delay(self) -> float:
        low, high = self.bounds(self.attempt)
        self.attempt += 1
        return self.rng.uniform(low, high)

    def reset(self) -> None:
        self.attempt = 0


class TelemetryBuffer:
    """Telemetry frames taken while disconnected; the oldest are dropped once ``max_frames`` is reached."""

    def __init__(self, max_frames: int) -> None:
        self.frames: deque[protocol.Telemetry] = deque(maxlen=max_frames)
        self.dropped = 0

    def add(self, frame: protocol.Telemetry) -> None:
        if len(self.frames) == self.frames.maxlen:
            self.dropped += 1
        self.frames.append(frame)

    def __len__(self) -> int:
        return len(self.frames)


class ConnectionLost(Exception):
    pass


class Connection(Protocol):
    """A message connection to the portal (a WebSocket in production, a fake in tests)."""

    @property
    def closed(self) -> bool: ...

    @property
    def close_code(self) -> int | None: ...

    async def send(self, text: str) -> None:
        """Send one frame; raises :class:`ConnectionLost` when the connection is gone."""
        ...

    async def ping(self, on_pong: Callable[[], None]) -> None:
        """Send a ping; ``on_pong`` is called when its pong arrives (the portal has every frame sent before it).
        Raises :class:`ConnectionLost` when the connection is gone."""
        ...

    def received(self) -> list[str]:
        """The frames that arrived since the last call."""
        ...

    async def wait(self, timeout_s: float) -> None:
        """Return when a frame arrives, the connection closes, or ``timeout_s`` passes."""
        ...

    async def close(self) -> None: ...


Connector = Callable[[], Awaitable[Connection]]


class WebSocketConnection:
    """A ``websockets`` client connection with a reader task that queues incoming frames."""

    def __init__(self, websocket) -> None:
        self.websocket = websocket
        self._frames: deque[str] = deque()
        self._arrived = asyncio.Event()
        self._closed = False
        self._close_code: int | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for frame in self.websocket:
                self._frames.append(frame if isinstance(frame, str) else frame.decode("utf-8", "replace"))
                self._arrived.set()
        except ConnectionClosed:
            pass
        finally:
            self._mark_closed()

    def _mark_closed(self) -> None:
        self._closed = True
        self._close_code = self.websocket.close_code
        self._arrived.set()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_code(self) -> int | None:
        return self._close_code

    async def send(self, text: str) -> None:
        from websockets.exceptions import ConnectionClosed

        if self._closed:
            raise ConnectionLost("connection already closed")
        try:
            await self.websocket.send(text)
        except ConnectionClosed as exc:
            self._mark_closed()
            raise ConnectionLost(str(exc)) from exc

    async def ping(self, on_pong: Callable[[], None]) -> None:
        from websockets.exceptions import ConnectionClosed

        if self._closed:
            raise ConnectionLost("connection already closed")
        try:
            pong = await self.websocket.ping()
        except ConnectionClosed as exc:
            self._mark_closed()
            raise ConnectionLost(str(exc)) from exc

        def answered(future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is None:  # closed first: no answer
                on_pong()

        pong.add_done_callback(answered)

    def received(self) -> list[str]:
        frames = list(self._frames)
        self._frames.clear()
        if not self._closed:
            self._arrived.clear()
        return frames

    async def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), timeout=max(0.0, timeout_s))

    async def close(self) -> None:
        await self.websocket.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


def websocket_connector(url: str, credential: str, *, open_timeout_s: float = 10.0) -> Connector:
    """A connector that opens ``url`` with ``Authorization: Bearer <credential>``."""

    async def connect() -> Connection:
        from websockets.asyncio.client import connect as ws_connect

        websocket = await ws_connect(
            url,
            additional_headers={"Authorization": f"Bearer {credential}"},
            user_agent_header=f"gpupool-agent/{__version__}",
            open_timeout=open_timeout_s,
            max_size=protocol.MAX_FRAME_BYTES,
            proxy=None,
        )
        return WebSocketConnection(websocket)

    return connect


def _memory_mib() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        return 0


@dataclass
class AgentSettings:
    node_name: str
    telemetry_interval_s: float = 1.0
    heartbeat_interval_s: float = 10.0
    process_interval_s: float = 5.0
    ecc_interval_s: float = 60.0
    buffer_frames: int = 300
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    labels: dict[str, str] = field(default_factory=dict)
    report_resend_s: float = REPORT_RESEND_S
    #: Stop the workloads when the agent exits (the demo) instead of leaving them to the next agent.
    stop_workloads_on_exit: bool = False
    #: Live logs: how often new output of a running workload is sent, and how much unsent output is kept before
    #: the oldest is skipped (``nodeagent.logstream``).
    log_interval_s: float = LOG_INTERVAL_S
    log_backlog_bytes: int = BACKLOG_BYTES
    #: Fencing set on the command line instead of by the portal (``--fence-after``; after 0: never fence).
    fence: FenceSettings | None = None
    #: The address other nodes reach this node by (``--address``), announced in the hello.
    address: str = ""
    #: The ports this node hands to jobs (``--job-ports``, "first-last"); "": the portal's default.
    job_ports: str = ""


class Agent:
    def __init__(
        self,
        *,
        settings: AgentSettings,
        backend: DeviceBackend,
        runner: WorkloadRunner,
        connector: Connector,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.runner = runner
        self.connector = connector
        self.clock = clock
        self.backoff = Backoff(base_s=settings.backoff_base_s, cap_s=settings.backoff_cap_s, rng=rng)
        self.buffer = TelemetryBuffer(settings.buffer_frames)
        self.sampler = Sampler(
            backend, process_interval_s=settings.process_interval_s, ecc_interval_s=settings.ecc_interval_s
        )
        self.logs = LogShipper(
            self.runner.log_sources,
            on_done=self.runner.log_done,
            clock=clock,
            interval_s=settings.log_interval_s,
            backlog_bytes=settings.log_backlog_bytes,
        )
        self.fence = Fence(path=runner.work_dir / FENCE_FILE, clock=clock, override=settings.fence)
        self._log_acks_saved_at = float("-inf")
        #: The workloads whose acknowledged log offset moved since the last save.
        self._log_acks_unsaved: set[tuple[int, int]] = set()
        self.connection: Connection | None = None
        self.heartbeat_seq = 0
        #: When each recent heartbeat was sent (by ``seq``), to date the portal's ``heartbeat.ack``.
        self._heartbeats_sent: dict[int, float] = {}
        #: The portal said (``config``) that it answers heartbeats: fencing counts those answers, not pongs.
        self._portal_acks_heartbeats = False
        self._connected_at = float("-inf")
        self.connects = 0
        self._next_connect_at = float("-inf")
        self._next_telemetry_at = float("-inf")
        self._next_heartbeat_at = float("-inf")

    @property
    def connected(self) -> bool:
        return self.connection is not None and not self.connection.closed

    # --- the step ----------------------------------------------------------------------------------------

    async def tick(self) -> float:
        """One step of the agent; returns the seconds until the next step is due."""
        now = self.clock()
        if self.connection is not None and self.connection.closed:
            self._lost(now)
        if self.connection is None and now >= self._next_connect_at:
            await self._connect(now)
        if self.connected:
            for text in self.connection.received():
                await self._handle(text)
        await self._drop_a_silent_connection(now)
        self._keep_fenced(now)
        self.runner.poll()
        self.backend.observe_workloads(self.runner.loads())
        telemetry = self._take_telemetry(now)
        if not self.connected:
            if telemetry is not None:
                self.buffer.add(telemetry)
            return self._delay(now)
        # Output before reports: a workload's last lines reach the portal before the report that ends its job.
        await self._flush_logs()
        await self._flush_reports()
        if telemetry is not None and not await self._send(telemetry, now):
            self.buffer.add(telemetry)
        if self.connected and now >= self._next_heartbeat_at:
            self.heartbeat_seq += 1
            if await self._send(protocol.Heartbeat(seq=self.heartbeat_seq), now):
                self._next_heartbeat_at = now + self.settings.heartbeat_interval_s
                self._heartbeats_sent[self.heartbeat_seq] = now
                self._heartbeats_sent.pop(self.heartbeat_seq - HEARTBEATS_REMEMBERED, None)
                if not self._portal_acks_heartbeats:
                    await self._ping(now)
        return self._delay(now)

    async def _ping(self, sent_at: float) -> None:
        """Ping after a heartbeat (portals that do not answer heartbeats): the pong confirms the portal's web
        server has it."""
        try:
            await self.connection.ping(lambda: self.fence.confirm(sent_at))
        except ConnectionLost:
            self._lost(sent_at)

    async def _drop_a_silent_connection(self, now: float) -> None:
        """A socket open for half the fence time on which the portal answered no heartbeat is closed and opened
        again: the web process still holds the connection but its handler of this agent is stuck (seen after a
        Redis restart), and a new connection gets a new handler — before the fence has to stop anything."""
        settings = self.fence.settings
        if not (self.connected and self._portal_acks_heartbeats and settings is not None and settings.enabled):
            return
        if now - max(self.fence.confirmed_at, self._connected_at) < settings.after_s / 2:
            return
        log.warning(
            "agent: the portal has answered no heartbeat for %.0f s on an open connection; reconnecting",
            now - max(self.fence.confirmed_at, self._connected_at),
        )
        with contextlib.suppress(Exception):
            await self.connection.close()
        self._lost(now)

    def _keep_fenced(self, now: float) -> None:
        """Fence once the portal has not confirmed hearing the agent for the fence time, and while fenced keep
        every workload stopped (a start that slipped in before the portal's answer included)."""
        if self.fence.due(now):
            self.fence.fenced = True
            settings = self.fence.settings
            log.error(
                "agent: no answer from the portal for %.0f s (fence after %.0f s): stopping every workload "
                "(%.0f s to checkpoint) before the portal runs their jobs elsewhere",
                self.fence.silent_s(now),
                settings.after_s,
                settings.grace_s,
            )
        if self.fence.fenced:
            stopped = self.runner.fence(grace_s=self.fence.settings.grace_s, silent_s=self.fence.silent_s(now))
            if stopped:
                log.warning("agent: fenced workloads %s", ", ".join(f"{job}/{replica}" for job, replica in stopped))

    def _delay(self, now: float) -> float:
        due = [self._next_telemetry_at, MAX_TICK_DELAY_S + now]
        if self.connected:
            due.append(self._next_heartbeat_at)
            resend_at = self.runner.outbox.next_resend_at(resend_after_s=self.settings.report_resend_s)
            if resend_at is not None:
                due.append(resend_at)
        elif self.connection is None:
            due.append(self._next_connect_at)
        return max(0.0, min(due) - now)

    def _take_telemetry(self, now: float) -> protocol.Telemetry | None:
        if now < self._next_telemetry_at:
            return None
        interval = self.settings.telemetry_interval_s
        # Keep the cadence, but skip missed slots instead of bursting after a stall.
        on_time = now - self._next_telemetry_at < interval
        self._next_telemetry_at = self._next_telemetry_at + interval if on_time else now + interval
        moment = protocol.utc_now_text()
        try:
            samples = self.sampler.sample(now)
        except Exception:  # a driver hiccup costs one sample, not the agent
            log.exception("agent: sampling the devices failed; skipping this telemetry frame")
            return None
        return protocol.Telemetry(sent_at=moment, sampled_at=moment, samples=samples)

    # --- connection --------------------------------------------------------------------------------------

    def _reconnect_delay(self) -> float:
        delay = self.backoff.next_delay()
        cap = self.fence.retry_cap_s()
        return delay if cap is None else min(delay, cap)

    async def _connect(self, now: float) -> None:
        try:
            connection = await self.connector()
        except Exception as exc:  # any failure to connect (refused, DNS, TLS, HTTP 4xx) is retried later
            delay = self._reconnect_delay()
            self._next_connect_at = now + delay
            log.warning("agent: cannot connect to the portal (%s); retrying in %.1f s", _describe(exc), delay)
            return
        self.connection = connection
        self.connects += 1
        self._connected_at = now
        self.backoff.reset()
        log.info("agent: connected to the portal as %s", self.settings.node_name)
        # Whatever the old socket carried may be lost: every unacknowledged report goes again after the hello.
        self.runner.outbox.reset_sent()
        self.logs.reset()
        if not await self._send(self._hello(), now):
            return
        await self._flush_logs()
        await self._flush_reports()
        await self._flush_buffer(now)
        self._next_heartbeat_at = now  # the first heartbeat right away: the portal marks the node alive

    def _hello(self) -> protocol.Hello:
        return protocol.Hello(
            node_name=self.settings.node_name,
            agent_version=__version__,
            hostname=socket.gethostname(),
            cpu_cores=os.cpu_count() or 0,
            memory_mib=_memory_mib(),
            labels={"gpupool.io/backend": self.backend.name, **self.settings.labels},
            topology=self.backend.topology(),
            devices=self.backend.inventory(),
            workloads=self.runner.known(),
            workloads_complete=True,
            sandbox=self.runner.sandbox_mode,
            heartbeat_acks=True,
            address=self.settings.address,
            job_ports=self.settings.job_ports,
            network_isolation=self.runner.network.mode.value if self.runner.network is not None else "none",
        )

    def _lost(self, now: float) -> None:
        code = self.connection.close_code if self.connection is not None else None
        self.connection = None
        delay = self._reconnect_delay()
        self._next_connect_at = now + delay
        if code == CLOSE_UNAUTHORIZED:
            log.error(
                "agent: the portal rejected this node's credential (revoked or replaced); run "
                "`gpupool-agent register` with a new bootstrap token. Retrying in %.1f s",
                delay,
            )
        elif code == CLOSE_REPLACED:
            log.warning("agent: another agent connected with this node's credential; retrying in %.1f s", delay)
        else:
            log.warning("agent: connection to the portal lost (code %s); reconnecting in %.1f s", code, delay)

    async def _send(self, message: protocol.Message, now: float) -> bool:
        if not self.connected:
            return False
        try:
            await self.connection.send(protocol.encode(message))
        except ConnectionLost:
            self._lost(now)
            return False
        return True

    async def _flush_reports(self) -> None:
        """Send the reports not yet sent on this connection and those unacknowledged for ``report_resend_s``.

        A report leaves the outbox only when the portal acks it (:meth:`_handle`), never on a send.
        """
        outbox = self.runner.outbox
        for status in outbox.due(self.clock(), resend_after_s=self.settings.report_resend_s):
            now = self.clock()
            if not await self._send(status, now):
                return
            outbox.mark_sent(status.report_id, now)

    async def _flush_logs(self) -> None:
        """Send the workloads' new output (``nodeagent.logstream``); the portal acks each piece."""
        now = self.clock()
        for piece in self.logs.due(now):
            if not await self._send(piece, now):
                return
        if self._log_acks_unsaved and now - self._log_acks_saved_at >= LOG_ACK_SAVE_S:
            self._save_log_acks(now)

    def _save_log_acks(self, now: float) -> None:
        try:
            self.runner.save(keys=self._log_acks_unsaved)
        except OSError:
            log.exception("agent: cannot save the acknowledged log offsets")
            return
        self._log_acks_saved_at = now
        self._log_acks_unsaved = set()

    async def _flush_buffer(self, now: float) -> None:
        if self.buffer.dropped:
            log.warning("agent: %d telemetry frames were dropped while disconnected", self.buffer.dropped)
            self.buffer.dropped = 0
        sent_at = protocol.utc_now_text()
        while self.buffer.frames and self.connected:
            frame = dataclasses.replace(self.buffer.frames[0], buffered=True, sent_at=sent_at)
            if not await self._send(frame, now):
                return
            self.buffer.frames.popleft()

    # --- frames from the portal --------------------------------------------------------------------------

    async def _handle(self, text: str) -> None:
        try:
            message = protocol.decode(text)
        except protocol.ProtocolError as exc:
            log.warning("agent: ignoring a bad frame from the portal: %s", exc)
            return
        now = self.clock()
        if isinstance(message, protocol.WorkloadStart):
            await self._command(message, now, lambda: self.runner.start(message))
        elif isinstance(message, protocol.WorkloadStop):
            await self._command(message, now, lambda: self.runner.stop(message))
        elif isinstance(message, protocol.HeartbeatAck):
            sent_at = self._heartbeats_sent.get(message.seq)
            if sent_at is not None:
                self.fence.confirm(sent_at)
        elif isinstance(message, protocol.ReportAck):
            if not message.ok:
                log.error(
                    "agent: the portal refused report %s for good (%s: %s); dropping it",
                    message.report_id,
                    message.code,
                    message.detail,
                )
            self.runner.outbox.ack(message.report_id)
        elif isinstance(message, protocol.WorkloadLogAck):
            if self.logs.acknowledge(message, self.runner.records):
                self._log_acks_unsaved.add((message.job_id, message.replica))
                record = self.runner.records.get((message.job_id, message.replica))
                if record is not None and not record.active:
                    self._save_log_acks(now)  # a finished workload's log: not sent again after a restart
        elif isinstance(message, protocol.Config):
            self._configure(message)
            self._portal_acks_heartbeats = message.heartbeat_acks
            if message.fence_after_s is not None:
                self.fence.configure(
                    after_s=message.fence_after_s,
                    grace_s=message.fence_grace_s,
                    requeue_after_s=message.requeue_after_s,
                )
            if message.command_id is not None:
                await self._send(protocol.Ack(command_id=message.command_id), now)
        elif isinstance(message, protocol.Error):
            if message.code == protocol.ErrorCode.UNKNOWN_TYPE and (message.ref_id or "").startswith("log-"):
                self.logs.unsupported()
                return
            if message.code == "retry_later" and (message.ref_id or "").startswith("log-"):
                return  # sent again after the resend interval
            log.warning("agent: the portal reported %s: %s (frame %s)", message.code, message.detail, message.ref_id)
        else:
            log.warning("agent: ignoring %s frame, which only agents send", message.type)

    async def _command(self, message: protocol.WorkloadStart | protocol.WorkloadStop, now: float, action) -> None:
        ack = protocol.Ack(command_id=message.command_id)
        try:
            action()
        except WorkloadRejected as exc:  # the runner recorded and reported it as failed
            ack = protocol.Ack(command_id=message.command_id, ok=False, error=str(exc))
        except Exception as exc:  # a bug or a full disk must not take the agent down
            log.exception("agent: %s for job %s failed", message.type, message.job_id)
            ack = protocol.Ack(command_id=message.command_id, ok=False, error=f"agent error: {exc}")
            self._report_unstarted(message, f"agent error: {exc}")
        await self._flush_reports()
        await self._send(ack, now)

    def _report_unstarted(self, message: protocol.WorkloadStart | protocol.WorkloadStop, reason: str) -> None:
        """A start that failed in an unexpected way and left nothing running is reported failed, so the job
        does not hold its devices in ``admitted`` for ever."""
        if not isinstance(message, protocol.WorkloadStart):
            return
        record = self.runner.records.get((message.job_id, message.replica))
        if record is not None and record.active:
            return
        try:
            self.runner.outbox.add(
                protocol.WorkloadStatus(
                    job_id=message.job_id,
                    replica=message.replica,
                    state="failed",
                    message=reason,
                    command_id=message.command_id,
                )
            )
        except OSError:
            log.exception("agent: cannot queue the failed status of job %s", message.job_id)

    def _configure(self, config: protocol.Config) -> None:
        settings = self.settings
        settings.telemetry_interval_s = max(0.1, config.telemetry_interval_s)
        settings.heartbeat_interval_s = max(0.5, config.heartbeat_interval_s)
        settings.process_interval_s = max(settings.telemetry_interval_s, config.process_sample_interval_s)
        self.sampler.process_interval_s = settings.process_interval_s
        # The config usually arrives right after the first heartbeat, which scheduled the next one with the
        # agent's own (longer) default: without this a portal that asks for 1 s heartbeats with a 5 s lease
        # hears nothing for 10 s and declares every freshly connected node lost.
        now = self.clock()
        self._next_heartbeat_at = min(self._next_heartbeat_at, now + settings.heartbeat_interval_s)
        self._next_telemetry_at = min(self._next_telemetry_at, now + settings.telemetry_interval_s)
        log.info(
            "agent: telemetry every %.1f s, heartbeat every %.1f s",
            settings.telemetry_interval_s,
            settings.heartbeat_interval_s,
        )

    # --- the loop ----------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set. Workloads keep running after the agent exits (re-adopted on restart)."""
        try:
            while not stop.is_set():
                try:
                    delay = await self.tick()
                except Exception:  # keep serving the node's workloads whatever one step tripped over
                    log.exception("agent: a step failed; continuing")
                    delay = MAX_TICK_DELAY_S
                await self._wait(delay, stop)
        finally:
            if self.connection is not None:
                with contextlib.suppress(Exception):
                    await self.connection.close()
            self.backend.close()
            self.runner.close(stop_workloads=self.settings.stop_workloads_on_exit)

    async def _wait(self, delay: float, stop: asyncio.Event) -> None:
        """Sleep ``delay`` seconds, or less: until a frame arrives, a workload ends (``runner.exit_fds``), or
        ``stop`` is set."""
        loop = asyncio.get_running_loop()
        waiters = [asyncio.ensure_future(stop.wait())]
        if self.connected:
            waiters.append(asyncio.ensure_future(self.connection.wait(delay)))
        ended = loop.create_future()
        watched = []
        for fd in self.runner.exit_fds():
            try:
                loop.add_reader(fd, _settle_once, ended)
            except (OSError, ValueError):
                continue
            watched.append(fd)
        waiters.append(ended)
        try:
            await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fd in watched:
                loop.remove_reader(fd)
            for waiter in waiters:
                waiter.cancel()


def _settle_once(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _describe(exc: BaseException) -> str:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return f"HTTP {status}: the portal refused this node's credential; register again"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
