"""Sending to channel groups from synchronous code (services after commit, the Celery worker).

``async_to_sync(layer.group_send)`` from a thread without an event loop (the worker, a script) starts a new event
loop for each call, and the Redis channel layer keeps its connections per event loop: every call opened a fresh
Redis connection, about 4 ms of a scheduling cycle that announces its commands. Here such sends run on one event
loop per process, in a daemon thread started on first use (and again in a forked child), so its connections are
reused. The in-memory layer of embedded mode lives in the server's own loop and its queues are not thread-safe:
sends to it still go through ``async_to_sync``, which runs them on that loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer

#: How long a sender waits for its sends to finish (the Redis client's own timeouts are shorter).
SEND_TIMEOUT_S = 30.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None


def _sender_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid():  # a forked child has the object but not the thread
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="channel-layer-sends", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


def run_with_channel_layer(send: Callable[[object], Awaitable[None]], alias: str = "default") -> None:
    """Await ``send(layer)`` (``layer`` the channel layer ``alias``) from synchronous code; nothing when no layer
    is configured. Raises what ``send`` raises."""
    layer = get_channel_layer(alias)
    if layer is None:
        return
    if isinstance(layer, InMemoryChannelLayer):
        async_to_sync(send)(layer)
        return
    asyncio.run_coroutine_threadsafe(send(layer), _sender_loop()).result(SEND_TIMEOUT_S)


def group_send(group: str, event: dict, alias: str = "default") -> None:
    """``layer.group_send(group, event)`` from synchronous code (see the module)."""

    async def send(layer) -> None:
        await layer.group_send(group, event)

    run_with_channel_layer(send, alias)
