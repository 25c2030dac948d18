"""One scheduling cycle at a time, across any number of workers.

On PostgreSQL a transaction-scoped advisory lock (``pg_try_advisory_xact_lock``): it is released when the
cycle's transaction ends, also when the worker dies mid-cycle, so it can never be left behind. On SQLite
(embedded mode: one process) a process-level lock; SQLite also serialises writers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction

# Any constant 64-bit key shared by every worker; "gpupool" in ASCII.
CYCLE_LOCK_KEY = 0x677075706F6F6C
_process_lock = threading.Lock()


@contextmanager
def cycle_lock() -> Iterator[bool]:
    """Try to take the cycle lock; yields whether this caller holds it (never waits).

    Must be entered inside ``transaction.atomic()``: on PostgreSQL the lock lives as long as the transaction.
    """
    if connection.vendor == "postgresql":
        if not transaction.get_connection().in_atomic_block:
            raise RuntimeError("cycle_lock() must be used inside transaction.atomic()")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [CYCLE_LOCK_KEY])
            acquired = bool(cursor.fetchone()[0])
        yield acquired
        return
    acquired = _process_lock.acquire(blocking=False)
    try:
        yield acquired
    finally:
        if acquired:
            _process_lock.release()
