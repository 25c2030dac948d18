"""Group commit: concurrent requests of one process share one transaction, as a database groups its log flushes.

A request thread hands its writes (a callable that runs in the caller's transaction) to :meth:`GroupCommit.run` and
waits. One committer thread per process takes whatever is queued — everything that arrived while the previous
group was committing, up to ``max_group`` — and runs it in one transaction: one BEGIN, one audit flush (each
stream's chain head locked once, the group's records inserted in one statement, still one record per job, chained
in the order the writes ran), one COMMIT. Nothing waits for a timer: a write that finds the committer idle runs at
once, alone, so a lone client's latency is the thread hand-off (tens of microseconds); under load a write waits at
most for the group ahead of it (its latency is bounded by two groups' time, at most ``2 x max_group`` writes).

A write that raises spoils the shared transaction, so the group is rolled back and each of its writes runs again
alone, in its own transaction: the failing one raises to its own caller only, the others commit — nothing is lost,
nothing is done twice (the group's transaction never committed). Writes should do their reads and checks first
(refusals then raise before anything is written, which costs the group nothing) — ``job_submit_prepare`` does.

With a connection pool (``GPUPOOL_DB_POOL_MAX_SIZE``) a waiting request hands its connection back first, so the
committer always finds one. Where grouping cannot work the write runs inline, in the caller's thread and
transaction: inside an open transaction (a test case's, or a caller's ``atomic``), and on a database that is not
PostgreSQL (the embedded SQLite demo has one writer at a time anyway), and with ``GPUPOOL_GROUP_COMMIT=0``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.db import close_old_connections, connection, transaction

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Writes per shared transaction at most (one submit's writes are 3 statements; 32 keep a group under ~10 ms).
DEFAULT_MAX_GROUP = 32
#: The committer hands its connection back after this long without a write.
IDLE_CLOSE_S = 0.5


@dataclass
class _Write(Generic[T]):
    write: Callable[[], T]
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


@dataclass
class GroupStats:
    """What the committer did since the process started (for benchmarks and tests)."""

    groups: int = 0
    writes: int = 0
    largest: int = 0
    regrouped: int = 0  # groups rolled back and run again write by write


class GroupCommit:
    def __init__(self, *, max_group: int = DEFAULT_MAX_GROUP, name: str = "group-commit") -> None:
        self.max_group = max_group
        self.name = name
        self.stats = GroupStats()
        self._queue: queue.SimpleQueue[_Write] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def run(self, write: Callable[[], T]) -> T:
        """Run ``write`` in a transaction shared with the writes other threads hand in meanwhile; return its value
        once that transaction committed (its ``on_commit`` callbacks ran), or raise what it raised."""
        grouping = getattr(settings, "GPUPOOL_GROUP_COMMIT", True)
        if not grouping or connection.in_atomic_block or connection.vendor != "postgresql":
            with transaction.atomic():
                return write()
        item: _Write[T] = _Write(write)
        self._ensure_thread()
        if (connection.settings_dict.get("OPTIONS") or {}).get("pool"):
            # Hand the request's pooled connection back while it waits: requests that each held one while waiting
            # for the committer, itself waiting for one, would exhaust the pool and stop.
            connection.close()
        self._queue.put(item)
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.value

    # --- the committer thread ------------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                group = [self._queue.get(timeout=IDLE_CLOSE_S)]
            except queue.Empty:
                # Idle: the connection goes back (to the pool, where there is one) rather than stay this thread's
                # while no request needs it.
                connection.close()
                continue
            while len(group) < self.max_group:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._commit(group)
            except BaseException as exc:  # never leave a caller waiting
                logger.exception("group commit: a group failed outside its writes")
                for item in group:
                    if not item.done.is_set():
                        item.error = exc
            finally:
                for item in group:
                    item.done.set()

    def _commit(self, group: list[_Write]) -> None:
        close_old_connections()  # a connection the database dropped is replaced
        self.stats.groups += 1
        self.stats.writes += len(group)
        self.stats.largest = max(self.stats.largest, len(group))
        if len(group) == 1:
            self._alone(group[0])
            return
        values: list[Any] = []
        committed: list[bool] = []
        try:
            with transaction.atomic():
                transaction.on_commit(lambda: committed.append(True))  # the first callback after the COMMIT
                for item in group:
                    values.append(item.write())
        except Exception:
            if committed:  # a write's on_commit callback raised after the COMMIT: the writes stand
                logger.exception("group commit: an on-commit callback failed after the group committed")
            else:
                # One write (or the shared COMMIT) failed: nothing of the group committed. Each runs again alone.
                self.stats.regrouped += 1
                for item in group:
                    self._alone(item)
                return
        for item, value in zip(group, values, strict=True):
            item.value = value

    @staticmethod
    def _alone(item: _Write) -> None:
        try:
            with transaction.atomic():
                item.value = item.write()
        except Exception as exc:
            item.error = exc
