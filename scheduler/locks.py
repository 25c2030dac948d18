"""One scheduling cycle at a time, across any number of workers.

On PostgreSQL a transaction-scoped advisory lock (``pg_try_advisory_xact_lock``): it is released when the
cycle's transaction ends, also when the worker dies mid-cycle, so it can never be left behind. On SQLite
(embedded mode: one process) a process-level lock; SQLite also serialises writers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction

# Any constant 64-bit key shared by every worker; "gpupool" in ASCII.
CYCLE_LOCK_KEY = 0x677075706F6F6C
# How often a waiting caller tries the PostgreSQL lock again (a blocking pg_advisory_xact_lock could not be
# given up after a while without aborting the transaction).
LOCK_POLL_S = 0.01
_process_lock = threading.Lock()


@contextmanager
def cycle_lock(*, wait_s: float = 0.0) -> Iterator[bool]:
    """Take the cycle lock, waiting up to ``wait_s`` seconds for it (0: not at all); yields whether this caller
    holds it.

    Must be entered inside ``transaction.atomic()``: on PostgreSQL the lock lives as long as the transaction.
    """
    if connection.vendor == "postgresql":
        if not transaction.get_connection().in_atomic_block:
            raise RuntimeError("cycle_lock() must be used inside transaction.atomic()")
        deadline = time.monotonic() + wait_s
        with connection.cursor() as cursor:
            while True:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [CYCLE_LOCK_KEY])
                acquired = bool(cursor.fetchone()[0])
                if acquired or time.monotonic() >= deadline:
                    break
                time.sleep(LOCK_POLL_S)
        yield acquired
        return
    acquired = _process_lock.acquire(timeout=wait_s) if wait_s > 0 else _process_lock.acquire(blocking=False)
    try:
        yield acquired
    finally:
        if acquired:
            _process_lock.release()
