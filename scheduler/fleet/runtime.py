"""Per-process plumbing of the agent sockets: database calls that keep their connection, the batch that
turns thousands of heartbeats a minute into one write a second, and group writes that merge what many
sockets write at the same moment.

``channels.db.database_sync_to_async`` closes the connection around every call (with ``CONN_MAX_AGE=0``
that is a new connection each time: ~25 ms on SQLite, more on PostgreSQL). The agent sockets call the
database often enough for that to be the bottleneck, so they use :func:`db` instead: the same single
thread-sensitive worker thread, one connection kept open, dropped only when it breaks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable
from datetime import datetime
from typing import Any

from scheduler import logs
from scheduler.fleet import selectors, telemetry
from scheduler.fleet.batching import GroupWrite, db
from scheduler.fleet.services.lease import node_heartbeats_record
from scheduler.fleet.services.rollups import telemetry_minutes_write

logger = logging.getLogger(__name__)

#: How often a process writes the heartbeats its agent sockets received.
HEARTBEAT_FLUSH_S = 1.0
#: How often a process re-reads which tenant holds which card of its connected nodes.
TENANT_MAP_REFRESH_S = 5.0


class FleetProcess:
    """What the agent sockets of one process share: pending heartbeats and the card → tenant maps."""

    def __init__(self) -> None:
        self.beats: dict[int, datetime] = {}
        self.connected: dict[int, int] = {}
        self.tenant_maps: dict[int, dict[int, set[str]]] = {}
        #: Groups some browser watches (any process); telemetry is sent only to these.
        self.watched: set[str] = set()
        #: Finished telemetry minutes of this process's sockets: (aggregates, device UUID → device id).
        self.minutes: GroupWrite[tuple[list, dict[str, int]]] = GroupWrite(self._write_minutes)
        #: Pieces of workloads' output from this process's sockets, each with the future of its outcome.
        self.log_pieces: GroupWrite[tuple[Any, asyncio.Future]] = GroupWrite(self._write_log_pieces)
        self._background: set[asyncio.Task] = set()
        self._failure_logged_at: dict[str, float] = {}
        self._task: asyncio.Task | None = None

    def node_connected(self, node_id: int) -> None:
        self.connected[node_id] = self.connected.get(node_id, 0) + 1
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def node_disconnected(self, node_id: int) -> None:
        count = self.connected.get(node_id, 0) - 1
        if count > 0:
            self.connected[node_id] = count
        else:
            self.connected.pop(node_id, None)
            self.tenant_maps.pop(node_id, None)

    def beat(self, node_id: int, moment: datetime) -> None:
        self.beats[node_id] = moment

    def set_tenant_map(self, node_id: int, by_device: dict[str, set[int]]) -> None:
        by_tenant: dict[int, set[str]] = {}
        for uuid, tenant_ids in by_device.items():
            for tenant_id in tenant_ids:
                by_tenant.setdefault(tenant_id, set()).add(uuid)
        self.tenant_maps[node_id] = by_tenant

    async def flush(self) -> None:
        """Write the pending heartbeats now (the loop does this every second; tests call it)."""

        beats, self.beats = self.beats, {}
        if beats:
            await db(node_heartbeats_record)(beats=beats)

    def in_background(self, write: Awaitable[object], *, what: str) -> None:
        """Run ``write`` without holding up the socket that asked for it.

        An agent socket handles its frames one after another, so every round trip it awaits delays the
        frames behind it; under load a Redis pipeline or a database write waits for a busy event loop and
        thread, and the agent-to-browser latency grew to seconds that way. A failure is logged (at most once
        per ``what`` and second), and what it carried is lost, as it would have been in the socket.
        """
        task = asyncio.ensure_future(write)
        self._background.add(task)
        task.add_done_callback(functools.partial(self._background_done, what=what))

    def _background_done(self, task: asyncio.Task, *, what: str) -> None:
        self._background.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        now = asyncio.get_running_loop().time()
        if now - self._failure_logged_at.get(what, float("-inf")) >= 1.0:
            self._failure_logged_at[what] = now
            logger.error("writing %s failed", what, exc_info=task.exception())

    def write_minutes_soon(self, aggregates: list, device_ids: dict[str, int]) -> None:
        """Write finished minutes in the background: a thousand agents cross the minute together."""
        self.in_background(self.minutes.submit([(aggregates, device_ids)]), what="telemetry minutes")

    async def settled(self) -> None:
        """Wait for the writes started in the background (tests; a closing socket)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    @staticmethod
    async def _write_minutes(batches: list[tuple[list, dict[str, int]]]) -> None:

        aggregates, device_ids = [], {}
        for batch_aggregates, batch_device_ids in batches:
            aggregates.extend(batch_aggregates)
            device_ids.update(batch_device_ids)
        await db(telemetry_minutes_write)(aggregates=aggregates, device_ids=device_ids)

    async def store_log_piece(self, piece: Any) -> Any:
        """Store an agent's log piece (``scheduler.logs.LogPiece``) together with those the other sockets of the
        process store at the same moment, and return its outcome: a thousand jobs printing every second cost a
        few transactions a second on the database thread, not a thousand."""
        outcome = asyncio.get_running_loop().create_future()
        await self.log_pieces.submit([(piece, outcome)])
        return outcome.result()

    @staticmethod
    async def _write_log_pieces(items: list[tuple[Any, asyncio.Future]]) -> None:

        outcomes = await db(logs.job_logs_append)(pieces=[piece for piece, _outcome in items])
        for (_piece, outcome), result in zip(items, outcomes, strict=True):
            outcome.set_result(result)

    async def refresh_tenant_maps(self) -> None:

        node_ids = list(self.connected)
        if node_ids:
            maps = await db(selectors.device_tenants_of_nodes)(node_ids=node_ids)
            for node_id, by_device in maps.items():
                if node_id in self.connected:
                    self.set_tenant_map(node_id, by_device)

    async def refresh_watched(self) -> None:

        self.watched = await telemetry.latest_store().awatched()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_refresh = loop.time() + TENANT_MAP_REFRESH_S
        while self.connected or self.beats:
            try:
                await self.refresh_watched()
            except Exception:
                logger.exception("reading the watched telemetry groups failed")
            await asyncio.sleep(HEARTBEAT_FLUSH_S)
            try:
                await self.flush()
                if loop.time() >= next_refresh:
                    next_refresh = loop.time() + TENANT_MAP_REFRESH_S
                    await self.refresh_tenant_maps()
            except Exception:
                logger.exception("writing heartbeats / reading tenant maps failed; retrying in a second")


_processes: dict[int, tuple[asyncio.AbstractEventLoop, FleetProcess]] = {}


def fleet_process() -> FleetProcess:
    """The shared state of this event loop's agent sockets (one per loop: tests run a loop each)."""
    loop = asyncio.get_running_loop()
    entry = _processes.get(id(loop))
    if entry is None or entry[0] is not loop:
        entry = _processes[id(loop)] = (loop, FleetProcess())
    return entry[1]
