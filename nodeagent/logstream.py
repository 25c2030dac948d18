"""Live logs: ship each workload's output to the portal while it runs, in bounded pieces, resumable by offset.

A workload's output is ``output.log`` in its job dir (``nodeagent.workloads``). The agent reads what is new
every ``interval_s`` (and at once, to the end, when the workload finishes) and sends it as ``workload.log``
frames of at most :data:`~nodeagent.protocol.MAX_LOG_CHUNK_BYTES`. Offsets are byte positions in the replica's
log as the portal keeps it: a run starts at the ``log_offset`` of its ``workload.start`` (what earlier runs of
the job left), so a requeued job's log goes on instead of starting over.

Nothing here needs a journal of its own: the file *is* the outbox. The portal acknowledges each piece with
``workload.log.ack``; what is not acknowledged is sent again after ``resend_s``, and from the last acknowledged
offset after a reconnect or an agent restart (``WorkloadRecord.log_acked``, saved with ``state.json``). The
portal stores pieces idempotently, so a piece sent twice costs nothing. Bounds: at most ``in_flight_bytes``
unacknowledged per replica while it runs, and when more than ``backlog_bytes`` of output waits (a job that
prints faster than the link carries, or a long disconnect) the oldest of it is skipped — the portal keeps only
the newest anyway — and the portal sees a gap.

The file is opened without following links and must be the file the agent created (same inode): a sandboxed
workload owns its job dir and could otherwise replace ``output.log`` with a link to a file of the agent's.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nodeagent import protocol

log = logging.getLogger(__name__)

#: How often a running workload's new output is sent.
LOG_INTERVAL_S = 1.0
#: Unacknowledged output per running replica on the wire (16 frames of 64 KiB).
IN_FLIGHT_BYTES = 1024 * 1024
#: More unsent output than this and the oldest of it is skipped (the portal keeps 8 MiB per replica by default).
BACKLOG_BYTES = 8 * 1024 * 1024
#: A piece still unacknowledged this long after it was sent is sent again.
RESEND_S = 5.0


def complete_utf8_length(data: bytes) -> int:
    """The length of ``data`` without an incomplete UTF-8 sequence at its end (1-3 bytes that may be completed
    by the next read), so a character is never split between two pieces."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:  # ASCII: nothing pending
            return len(data)
        if byte >= 0xC0:  # a lead byte: is its sequence complete?
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= needed else len(data) - back
    return len(data)  # only continuation bytes: invalid anyway, nothing to wait for


def skip_continuation(data: bytes) -> int:
    """How many bytes at the start of ``data`` continue a character that began before it (at most 3)."""
    count = 0
    while count < min(3, len(data)) and 0x80 <= data[count] < 0xC0:
        count += 1
    return count


class LogSource(Protocol):
    """What the shipper needs of a workload (``nodeagent.journal.WorkloadRecord``)."""

    job_id: int
    replica: int
    job_dir: str
    log_base: int
    log_start_pos: int
    log_acked: int
    log_inode: tuple[int, int] | list[int] | None

    @property
    def active(self) -> bool: ...


def open_output(path: Path, inode: tuple[int, int] | list[int] | None) -> int | None:
    """A read descriptor of the workload's output file, or None when it is missing or is not the file the agent
    created (a link, a FIFO, another inode: a workload put something else in its place)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(descriptor)
    except OSError:
        os.close(descriptor)
        return None
    if not stat.S_ISREG(info.st_mode) or (inode is not None and (info.st_dev, info.st_ino) != tuple(inode)):
        os.close(descriptor)
        return None
    return descriptor


@dataclass
class _Cursor:
    """What this connection has sent of one replica's log (memory only: a new connection starts at acked)."""

    sent: int
    #: The run it follows: a new run of the replica (another record) starts a new cursor.
    record: object = None
    sent_at: float | None = None
    next_read_at: float = float("-inf")
    #: Whether the workload still ran at the last read: its end is read at once, not at the next interval.
    was_active: bool = True


class LogShipper:
    """Turns the workloads' output files into ``workload.log`` frames and tracks the portal's acks."""

    def __init__(
        self,
        records: Callable[[], Iterable[LogSource]],
        *,
        clock: Callable[[], float],
        on_done: Callable[[tuple[int, int]], None] | None = None,
        interval_s: float = LOG_INTERVAL_S,
        chunk_bytes: int = protocol.MAX_LOG_CHUNK_BYTES,
        in_flight_bytes: int = IN_FLIGHT_BYTES,
        backlog_bytes: int = BACKLOG_BYTES,
        resend_s: float = RESEND_S,
    ) -> None:
        self.records = records
        #: Told the key of each replica whose log is done (the runner then stops offering it; ``due`` looks only
        #: at what ``records`` gives, so a day of finished workloads costs nothing per step).
        self.on_done = on_done
        self.clock = clock
        self.interval_s = interval_s
        self.chunk_bytes = min(chunk_bytes, protocol.MAX_LOG_CHUNK_BYTES)
        self.in_flight_bytes = max(in_flight_bytes, self.chunk_bytes)
        self.backlog_bytes = max(backlog_bytes, self.chunk_bytes)
        self.resend_s = resend_s
        self.cursors: dict[tuple[int, int], _Cursor] = {}
        #: Runs whose log is all acknowledged after they finished, or that the portal refused: not read again. By
        #: replica, with the run (its record): a later run of the same replica is another record, and is read.
        self.done: dict[tuple[int, int], object] = {}
        #: False while connected to a portal that does not know ``workload.log`` (it answered ``unknown_type``).
        self.enabled = True

    def reset(self) -> None:
        """A new connection: whatever was in flight on the old one is sent again from the acknowledged offset."""
        self.cursors.clear()
        self.enabled = True

    def due(self, now: float) -> list[protocol.WorkloadLog]:
        """The frames to send now, in order: new output of running workloads every ``interval_s``, everything
        of finished ones, and pieces unacknowledged for ``resend_s`` again."""
        if not self.enabled:
            return []
        frames: list[protocol.WorkloadLog] = []
        records = list(self.records())
        known = {(record.job_id, record.replica): record for record in records}
        # Runs no longer offered: done and told (the runner no longer offers them), or forgotten (a day after
        # they ended), or replaced by a new run.
        self.done = {key: run for key, run in self.done.items() if known.get(key) is run}
        for key in [key for key, cursor in self.cursors.items() if known.get(key) is not cursor.record]:
            del self.cursors[key]
        for record in records:
            key = (record.job_id, record.replica)
            if self.done.get(key) is record:
                continue
            if record.log_inode is None:  # never started (refused), or by an agent before live logs: no output
                if not record.active:
                    self._done(key, record)
                continue
            cursor = self.cursors.get(key)
            if cursor is None:
                cursor = self.cursors[key] = _Cursor(sent=record.log_acked, record=record)
            if cursor.sent > record.log_acked and cursor.sent_at is not None and now - cursor.sent_at >= self.resend_s:
                cursor.sent = record.log_acked  # unacknowledged for too long: the portal missed it or failed
            just_ended = cursor.was_active and not record.active
            if now < cursor.next_read_at and not just_ended:
                continue
            cursor.next_read_at = now + self.interval_s
            cursor.was_active = record.active
            frames.extend(self._read(record, cursor, now))
        return frames

    def _read(self, record: LogSource, cursor: _Cursor, now: float) -> list[protocol.WorkloadLog]:
        key = (record.job_id, record.replica)
        descriptor = open_output(Path(record.job_dir) / "output.log", record.log_inode)
        if descriptor is None:
            if not record.active:
                self._done(key, record)
            return []
        frames: list[protocol.WorkloadLog] = []
        try:
            size = os.fstat(descriptor).st_size
            end = record.log_base + max(0, size - record.log_start_pos)

            def position(offset: int) -> int:
                return record.log_start_pos + (offset - record.log_base)

            if end - cursor.sent > self.backlog_bytes:
                skip_to = end - self.backlog_bytes
                skip_to += skip_continuation(os.pread(descriptor, 3, position(skip_to)))
                log.warning(
                    "logs: job %s replica %s printed faster than it could be sent; skipping %d bytes of its output",
                    record.job_id,
                    record.replica,
                    skip_to - cursor.sent,
                )
                cursor.sent = record.log_acked = skip_to
            if not record.active and record.log_acked >= end:
                self._done(key, record)
                return []
            limit = end if not record.active else min(end, record.log_acked + self.in_flight_bytes)
            while cursor.sent < limit:
                data = os.pread(descriptor, min(self.chunk_bytes, limit - cursor.sent), position(cursor.sent))
                if not data:
                    break
                length = complete_utf8_length(data)
                if length == 0:
                    if record.active or cursor.sent + len(data) < end:
                        break  # a character still being written (or cut by the in-flight window)
                    length = len(data)  # the last bytes of a finished workload: sent as they are
                piece = protocol.WorkloadLog(
                    id=f"log-{record.job_id}-{record.replica}-{cursor.sent}",
                    job_id=record.job_id,
                    replica=record.replica,
                    offset=cursor.sent,
                    text=protocol.decode_output(data[:length]),
                )
                frames.append(piece)
                cursor.sent += length
                cursor.sent_at = now
        except OSError as exc:
            log.warning("logs: cannot read the output of job %s replica %s: %s", record.job_id, record.replica, exc)
        finally:
            os.close(descriptor)
        return frames

    def acknowledge(self, ack: protocol.WorkloadLogAck, records: dict[tuple[int, int], LogSource]) -> bool:
        """Apply the portal's ack; True when the acknowledged offset moved (worth saving with the state)."""
        key = (ack.job_id, ack.replica)
        record = records.get(key)
        if record is None:
            return False
        if not ack.ok:
            log.warning(
                "logs: the portal refused the output of job %s replica %s (%s: %s); no more of it is sent",
                ack.job_id,
                ack.replica,
                ack.code,
                ack.detail,
            )
            self._done(key, record)
            return False
        # Acks come in the order the pieces went; one for a piece past a lost one is not a contiguous ack.
        if ack.offset > record.log_acked or ack.next_offset <= record.log_acked:
            return False
        record.log_acked = ack.next_offset
        cursor = self.cursors.get(key)
        if cursor is not None:
            cursor.sent = max(cursor.sent, record.log_acked)
            if cursor.sent == record.log_acked:
                cursor.sent_at = None
        return True

    def _done(self, key: tuple[int, int], record: LogSource) -> None:
        self.done[key] = record
        self.cursors.pop(key, None)
        if self.on_done is not None:
            self.on_done(key)

    def unsupported(self) -> None:
        """The portal does not take ``workload.log`` (older than live logs): stop sending on this connection."""
        if self.enabled:
            log.warning("logs: the portal does not take live logs (workload.log); only the final log tail is sent")
        self.enabled = False
