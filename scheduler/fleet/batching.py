"""Writes batched for an event loop: ``db`` runs a function on the database thread, ``GroupWrite`` gathers the
writes that arrive while one is in flight (agent sockets of one process, telemetry minutes, log pieces).

A leaf: it imports nothing of the fleet, so the telemetry store and the fleet process both build on it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections

T = TypeVar("T")


def db(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` run on the database thread, keeping its connection between calls."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except DatabaseError:
            close_old_connections()  # a broken or obsolete connection is replaced on the next call
            raise

    return sync_to_async(call, thread_sensitive=True)


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
