"""WebSockets of the scheduler: ``/ws/jobs/<id>/logs/`` follows a job's output as it is stored.

Thin: who may follow is ``scheduler.logs.job_get_readable`` (the job's own visibility), what is sent is
``scheduler.logs.job_log_slice``, the same answer as ``GET /api/v1/jobs/{id}/logs/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from kernel.api import NotFoundError
from scheduler import logs
from scheduler import messages as scheduler_messages
from tenants.services.tokens import TokenRejected, api_token_authenticate

logger = logging.getLogger(__name__)

CLOSE_UNAUTHORIZED = 4401
CLOSE_BAD_REQUEST = 4400
CLOSE_NOT_FOUND = 4404


def _bearer_user(scope: dict) -> Any | None:
    """The user of an ``Authorization: Bearer gp_…`` API token (a command line follows without a session)."""

    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, raw = value.decode("latin1").partition(" ")
            if scheme.lower() == "bearer" and raw.strip():
                try:
                    return api_token_authenticate(raw=raw.strip()).user
                except TokenRejected:
                    return None
    return None


class JobLogConsumer(AsyncJsonWebsocketConsumer):
    """Follow one replica's log: ``/ws/jobs/<id>/logs/?replica=0&offset=0``.

    Sends ``{"type": "log", job, replica, offset, next_offset, text, complete, truncated_before}`` frames (the
    API's slice) as the log grows — told by the agent socket after each store (group ``joblog.<id>.<replica>``),
    and looking again every ``idle_check_s`` so that the job's end is seen when no more output comes — and
    closes (1000) after the frame with ``complete`` true. A reconnecting follower passes its last
    ``next_offset`` and misses nothing. Refusals: ``{"type": "error", code, detail}`` then close 4401 (not signed
    in), 4404 (no such job visible to you), 4400 (bad replica or offset).
    """

    idle_check_s = 5.0
    frame_bytes = logs.DEFAULT_SLICE_BYTES

    async def connect(self) -> None:
        self.group: str | None = None
        self.task: asyncio.Task | None = None
        self.wake = asyncio.Event()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            user = await database_sync_to_async(_bearer_user)(self.scope)
        await self.accept()
        if user is None:
            await self.refuse(CLOSE_UNAUTHORIZED, "unauthorized", "sign in, or send Authorization: Bearer <API token>")
            return
        self.user = user
        self.job_id = self.scope["url_route"]["kwargs"]["job_id"]
        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        try:
            self.replica = int(query.get("replica", ["0"])[0])
            self.offset = int(query.get("offset", ["0"])[0])
        except ValueError:
            await self.refuse(CLOSE_BAD_REQUEST, "invalid", "replica and offset must be whole numbers")
            return
        try:
            job = await database_sync_to_async(logs.job_get_readable)(user=user, pk=self.job_id)
        except NotFoundError as exc:
            await self.refuse(CLOSE_NOT_FOUND, exc.code, exc.message)
            return
        count = logs.replica_count(job)
        if not 0 <= self.replica < count or self.offset < 0:
            detail = f"ask for replica 0 to {count - 1} and an offset from 0"
            await self.refuse(CLOSE_BAD_REQUEST, "invalid", detail)
            return
        self.group = logs.job_log_group(job.pk, self.replica)
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.task = asyncio.ensure_future(self.follow())

    async def refuse(self, close_code: int, code: str, detail: str) -> None:
        await self.send_json({"type": "error", "code": code, "detail": detail})
        await self.close(code=close_code)

    def read(self) -> logs.LogSlice | None:
        """The next slice, the job fetched again each time (its state, and whether the caller still sees it)."""
        try:
            job = logs.job_get_readable(user=self.user, pk=self.job_id)
        except NotFoundError:
            return None
        return logs.job_log_slice(job=job, replica=self.replica, offset=self.offset, limit_bytes=self.frame_bytes)

    async def follow(self) -> None:
        try:
            await self.follow_until_complete()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("following the log of job %s failed", self.job_id)
            await self.close(code=1011)  # the client reconnects from its last next_offset

    async def follow_until_complete(self) -> None:
        while True:
            self.wake.clear()  # before reading: a store during the read wakes the next wait
            piece = await database_sync_to_async(self.read)()
            if piece is None:
                await self.refuse(
                    CLOSE_NOT_FOUND, "not_found", scheduler_messages.NO_JOB_ID_VISIBLE_YOU(pk=self.job_id)
                )
                return
            if piece.text or piece.complete:
                await self.send_json({"type": "log", **piece.as_dict()})
            self.offset = piece.next_offset
            if piece.complete:
                await self.close(code=1000)
                return
            if piece.text:
                continue  # perhaps more stored than one frame carries
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.idle_check_s)

    async def log_appended(self, event: dict) -> None:
        self.wake.set()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs) -> None:
        """Followers only listen; what they send is ignored."""

    async def disconnect(self, code: int) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
