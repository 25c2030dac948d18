"""The agent's durable outbox of workload status reports: what the portal has not acknowledged is never lost.

Every report gets a report id and is appended to a journal in the work dir (``outbox.jsonl``) and fsync'd
before :meth:`ReportOutbox.add` returns, so a report queued before the agent was killed (or the machine lost
power) is still there when the agent starts again. The agent sends the pending reports after every hello and
again every few seconds while they stay unacknowledged; the portal answers ``report.ack`` with the id once it
applied the report (or found it a duplicate, or refused it for good), and the ack is journalled too: written
before :meth:`ReportOutbox.ack` returns (it survives the agent being killed) but not fsync'd, which would double
the disk flushes per workload. An ack lost with the machine's power only makes the agent send that report once
more after the restart, and the portal acknowledges the duplicate without applying it again (the next fsync of
the journal, that of the next report, writes the acks before it to disk as well).

The journal is one JSON object per line: ``{"report": <frame>, "queued_at": <unix time>}`` when a report is
queued, ``{"ack": <report id>}`` when it was acknowledged, ``{"last_id": <report id>}`` after a compaction.
Once enough acks piled up it is rewritten with the pending reports only (temporary file, fsync, rename, fsync
of the directory). A torn last line — the agent killed in the middle of a write — is skipped on load.

Report ids are ``max(last id + 1, wall clock in microseconds)``: increasing within one outbox, and an agent
whose work dir was wiped still starts above every id it used before (unless the clock went back), so the
portal's duplicate check on (node, report id) never mistakes a new report for an old one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from nodeagent import protocol

log = logging.getLogger(__name__)

OUTBOX_FILE = "outbox.jsonl"
#: Rewrite the journal once this many acknowledged reports are in it.
COMPACT_AFTER_ACKS = 256
#: Bound of the outbox: past it the oldest pending reports are dropped (and logged). A portal that answers no
#: acks at all (older than the outbox) would otherwise make it grow for ever.
MAX_PENDING = 10_000


@dataclass
class _Pending:
    status: protocol.WorkloadStatus
    queued_at: float
    #: When it was last written to a connection (the agent's clock); None = not on the current connection.
    sent_at: float | None = None


def _fsync_directory(path: Path) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


class ReportOutbox:
    """Pending reports in the order they were queued, with their journal on disk.

    Iterating, indexing and ``len`` give the pending :class:`~nodeagent.protocol.WorkloadStatus` frames.
    """

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
        compact_after_acks: int = COMPACT_AFTER_ACKS,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.path = Path(path)
        self.clock = clock
        self.compact_after_acks = compact_after_acks
        self.max_pending = max_pending
        self.last_id = 0
        self._pending: dict[int, _Pending] = {}
        self._acked_in_journal = 0
        self._load()

    # --- reading the journal -----------------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        damaged = 0
        for number, line in enumerate(raw.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                self._replay(entry)
            except (ValueError, TypeError, KeyError, protocol.ProtocolError) as exc:
                damaged += 1
                log.warning("outbox: skipping unreadable line %d of %s (%s)", number, self.path, exc)
        if damaged:
            # Appending after a torn line would glue the next entry onto it: start from a clean file.
            self._compact()
        if self._pending:
            log.info("outbox: %d report(s) from before the restart wait for the portal's ack", len(self._pending))

    def _replay(self, entry: dict) -> None:
        if "report" in entry:
            status = protocol.from_dict(entry["report"])
            if not isinstance(status, protocol.WorkloadStatus) or status.report_id is None:
                raise ValueError("not a workload.status with a report_id")
            self._pending[status.report_id] = _Pending(status=status, queued_at=float(entry.get("queued_at", 0)))
            self.last_id = max(self.last_id, status.report_id)
        elif "ack" in entry:
            report_id = int(entry["ack"])
            self._pending.pop(report_id, None)
            self._acked_in_journal += 1
            self.last_id = max(self.last_id, report_id)
        elif "last_id" in entry:
            self.last_id = max(self.last_id, int(entry["last_id"]))
        else:
            raise ValueError("unknown journal entry")

    # --- writing -----------------------------------------------------------------------------------------------

    def _append(self, entry: dict, *, sync: bool = True) -> None:
        """Append one journal line; it is in the kernel when this returns, and on disk too with ``sync``."""
        line = json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n"
        created = not self.path.exists()
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            if sync or created:
                os.fsync(handle.fileno())
        if created:
            _fsync_directory(self.path.parent)

    def _compact(self) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        with temporary.open("w", encoding="utf-8") as handle:
            handle.write(json.dumps({"last_id": self.last_id}) + "\n")
            for pending in self._pending.values():
                entry = {"report": protocol.to_dict(pending.status), "queued_at": pending.queued_at}
                handle.write(json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        _fsync_directory(self.path.parent)
        self._acked_in_journal = 0

    def next_id(self) -> int:
        return min(protocol.MAX_REPORT_ID, max(self.last_id + 1, int(time.time() * 1_000_000)))

    def add(self, status: protocol.WorkloadStatus) -> protocol.WorkloadStatus:
        """Give ``status`` the next report id, journal it durably and return the frame to send."""
        report_id = self.next_id()
        frame = replace(status, report_id=report_id, id=f"report-{report_id}")
        queued_at = self.clock()
        self._append({"report": protocol.to_dict(frame), "queued_at": queued_at})
        self.last_id = report_id
        self._pending[report_id] = _Pending(status=frame, queued_at=queued_at)
        if len(self._pending) > self.max_pending:
            oldest = next(iter(self._pending))
            dropped = self._pending.pop(oldest).status
            log.error(
                "outbox: over %d unacknowledged reports; dropping the oldest (report %s: job %s replica %s %s). "
                "Is the portal acknowledging reports (report.ack)?",
                self.max_pending,
                oldest,
                dropped.job_id,
                dropped.replica,
                dropped.state,
            )
            self._append({"ack": oldest})
        return frame

    def ack(self, report_id: int) -> bool:
        """The portal is done with ``report_id``: forget it (durably). False for an id that is not pending."""
        if self._pending.pop(report_id, None) is None:
            return False
        self._append({"ack": report_id}, sync=False)
        self._acked_in_journal += 1
        if self._acked_in_journal >= self.compact_after_acks:
            self._compact()
        return True

    # --- sending -----------------------------------------------------------------------------------------------

    def due(self, now: float, *, resend_after_s: float) -> list[protocol.WorkloadStatus]:
        """Reports not yet sent on this connection, or sent at least ``resend_after_s`` ago without an ack."""
        return [
            pending.status
            for pending in self._pending.values()
            if pending.sent_at is None or now - pending.sent_at >= resend_after_s
        ]

    def mark_sent(self, report_id: int, now: float) -> None:
        pending = self._pending.get(report_id)
        if pending is not None:
            pending.sent_at = now

    def reset_sent(self) -> None:
        """A new connection: everything pending is sent again (the old socket may have lost any of it)."""
        for pending in self._pending.values():
            pending.sent_at = None

    def next_resend_at(self, *, resend_after_s: float) -> float | None:
        sent = [pending.sent_at for pending in self._pending.values() if pending.sent_at is not None]
        return min(sent) + resend_after_s if sent else None

    def keys(self) -> set[tuple[int, int]]:
        """(job, replica) of every pending report."""
        return {(pending.status.job_id, pending.status.replica) for pending in self._pending.values()}

    # --- the pending frames as a sequence ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[protocol.WorkloadStatus]:
        return iter([pending.status for pending in self._pending.values()])

    def __len__(self) -> int:
        return len(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def __getitem__(self, index: int) -> protocol.WorkloadStatus:
        return list(self)[index]
