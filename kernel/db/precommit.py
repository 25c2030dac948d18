"""Work that must run inside a transaction, after everything else it does and just before its COMMIT.

Django offers ``transaction.on_commit`` (after the commit) but nothing before it. The audit trail needs the
moment before: its records are written in the same transaction as the change they record, but linked into
their hash chains only at the very end, so that the per-stream chain-head row locks are the last locks a
transaction takes and are held only for the commit itself (see docs/locking.md). A lock taken last and held
briefly cannot be part of a wait cycle with locks taken earlier in other transactions.

An app registers a handler per key once (``register``); inside a transaction it queues payloads under that
key (``defer``). At COMMIT the backend calls each handler with the payloads that survived savepoint rollbacks,
in the order they were queued. A handler that raises rolls the whole transaction back and the error
propagates to the caller, exactly like a failing statement in the transaction would.

Under a test case's transaction (Django's ``TestCase``, pytest-django's ``db`` fixture) nothing ever commits;
there the handler runs at once for each payload, which is what the code did before this module existed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

AfterCommit = Callable[[Callable[[], None]], None]


class Handler(Protocol):
    def __call__(self, connection: Any, payloads: list[Any], after_commit: AfterCommit) -> None: ...


_handlers: dict[str, Handler] = {}


def register(key: str, handler: Handler) -> None:
    """Run ``handler(connection, payloads, after_commit)`` before each COMMIT that has payloads under ``key``.
    ``after_commit(func)`` schedules ``func`` for after that COMMIT (errors in it are logged, not raised)."""
    _handlers[key] = handler


class PreCommitMixin:
    """Mixed into a Django ``DatabaseWrapper``: queues payloads per transaction and hands them to their
    handlers just before COMMIT; drops them on rollback, on a savepoint rollback that covers them, and when
    the connection closes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (savepoint ids active when queued, key, payload)
        self.pre_commit_queue: list[tuple[frozenset, str, Any]] = []
        # True while the handlers run just before a real COMMIT (False when they run inline in a test case).
        self.in_pre_commit = False

    def _in_test_case_transaction(self) -> bool:
        blocks = self.atomic_blocks
        return bool(blocks) and getattr(blocks[0], "_from_testcase", False)

    def defer_to_commit(self, key: str, payload: Any) -> None:
        """Queue ``payload`` for ``key``'s handler at this transaction's COMMIT (must be in a transaction)."""
        if key not in _handlers:
            raise LookupError(f"no pre-commit handler registered for {key!r}")
        if self.get_autocommit():
            raise RuntimeError("defer_to_commit() needs a transaction: call it inside transaction.atomic()")
        if self._in_test_case_transaction():
            from django.db import transaction

            _handlers[key](self, [payload], lambda func: transaction.on_commit(func, using=self.alias))
            return
        self.pre_commit_queue.append((frozenset(self.savepoint_ids), key, payload))

    def _run_pre_commit(self) -> list[Callable[[], None]]:
        queue, self.pre_commit_queue = self.pre_commit_queue, []
        after: list[Callable[[], None]] = []
        by_key: dict[str, list[Any]] = {}
        for _sids, key, payload in queue:
            by_key.setdefault(key, []).append(payload)
        self.in_pre_commit = True
        try:
            for key, payloads in by_key.items():
                _handlers[key](self, payloads, after.append)
        finally:
            self.in_pre_commit = False
        return after

    def commit(self) -> None:
        after: list[Callable[[], None]] = []
        if self.pre_commit_queue:
            try:
                after = self._run_pre_commit()
            except BaseException:
                # Atomic.__exit__ rolls back only on DatabaseError; whatever failed here, the transaction's
                # changes must not commit without their records.
                self.pre_commit_queue = []
                self.rollback()
                raise
        # Handed to Django's on-commit hooks (robust: the commit stands, a failure is logged), which run once
        # autocommit is back on. Run here, between COMMIT and Atomic.__exit__'s set_autocommit(True), a
        # follow-up's query (a threshold checkpoint) opens a transaction nobody commits, and the caller gets
        # "can't change 'autocommit' now" after its change has committed.
        self.run_on_commit.extend((set(), func, True) for func in after)
        super().commit()

    def rollback(self) -> None:
        self.pre_commit_queue = []
        super().rollback()

    def savepoint_rollback(self, sid: str) -> None:
        super().savepoint_rollback(sid)
        self.pre_commit_queue = [entry for entry in self.pre_commit_queue if sid not in entry[0]]

    def close(self) -> None:
        self.pre_commit_queue = []
        super().close()
