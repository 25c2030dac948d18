"""Writes batched for an event loop: ``db`` runs a function on the database thread, ``GroupWrite`` gathers the
writes that arrive while one is in flight (agent sockets of one process, telemetry minutes, log pieces).

A leaf: it imports nothing of the fleet, so the telemetry store and the fleet process both build on it.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections

T = TypeVar("T")


def db(func: Callable[..., Any], *, executor: ThreadPoolExecutor | None = None) -> Callable[..., Any]:
    """``func`` run on the database thread (``executor``'s one thread, else the process's thread-sensitive
    one), keeping its connection between calls."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except DatabaseError:
            close_old_connections()  # a broken or obsolete connection is replaced on the next call
            raise

    if executor is None:
        return sync_to_async(call, thread_sensitive=True)
    return sync_to_async(call, thread_sensitive=False, executor=executor)


_socket_executors: list[ThreadPoolExecutor] = []
_socket_executors_lock = threading.Lock()


def socket_executor(key: int) -> ThreadPoolExecutor | None:
    """The database thread of the agent socket of node ``key``: one of ``GPUPOOL_AGENT_DB_THREADS`` threads of
    this process, the same one for a node every time (a socket's calls run one after the other anyway, each
    awaited by its handler). None when the setting is 0: the process's one thread-sensitive thread.

    Every socket's reads and reports used to run on that one thread, one round trip after another: in a burst
    of short jobs a report waited behind the other sockets' (about 23 statements per job for its start's
    delivery, its ack and its two reports), and each job held its cards that much longer. Each thread keeps one
    pooled connection (``GPUPOOL_DB_POOL_MAX_SIZE`` counts them)."""
    from django.conf import settings

    count = int(getattr(settings, "GPUPOOL_AGENT_DB_THREADS", 0))
    if count <= 0:
        return None
    with _socket_executors_lock:
        while len(_socket_executors) < count:
            _socket_executors.append(
                ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"agent-db-{len(_socket_executors)}")
            )
    return _socket_executors[key % count]


def socket_threads_close() -> None:
    """Close the connection each socket thread keeps (tests call it after each test, so that their database can
    be dropped; a web process's threads keep theirs until it exits)."""
    from django.db import connections

    with _socket_executors_lock:
        executors = list(_socket_executors)
    for executor in executors:
        executor.submit(connections.close_all).result(timeout=30)


class GroupWrite(Generic[T]):
    """Writes of one event loop that arrive while a write is in flight go out together in the next one.

    ``submit`` returns once its items are written, or raises that write's error. A thousand agent sockets
    writing in the same second then cost a handful of writes, and a lone write still leaves at once.
    """

    def __init__(self, write: Callable[[list[T]], Awaitable[object]], *, linger_s: float = 0.0) -> None:
        self._write = write
        #: Wait this long before each write so that more items join it (for writes nobody waits for).
        self._linger_s = linger_s
        self._pending: list[T] = []
        self._written: asyncio.Future | None = None  # resolves when ``_pending`` as it is now is written
        self._writer: asyncio.Task | None = None

    async def submit(self, items: Iterable[T]) -> None:
        self._pending.extend(items)
        if self._written is None:
            self._written = asyncio.get_running_loop().create_future()
        written = self._written
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._run())
        # shield: a cancelled caller must not cancel the write that the other callers wait for.
        await asyncio.shield(written)

    async def _run(self) -> None:
        try:
            while self._pending:
                if self._linger_s:
                    await asyncio.sleep(self._linger_s)
                items, self._pending = self._pending, []
                written, self._written = self._written, None
                try:
                    await self._write(items)
                except asyncio.CancelledError:
                    written.cancel()
                    raise
                except Exception as exc:
                    written.set_exception(exc)
                    written.exception()  # retrieved here too: every waiter may have been cancelled
                else:
                    written.set_result(None)
        finally:
            self._writer = None
