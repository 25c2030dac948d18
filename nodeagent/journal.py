"""The agent's on-disk record of the workloads it started, so that a restarted agent never loses or double-starts one.

``state.json`` in the work dir lists every active workload with its pid and the kernel's start time of that pid
(``{"version": 1, "workloads": [...]}``, one workload per line); a restarted agent reads it and re-adopts the
processes that still run. Finished workloads (kept a day, so a repeated start is recognised) are appended to
``finished.jsonl`` instead, a line per change, the newest line of a run winning; it is compacted when it holds
twice the lines it needs. So the file rewritten at every start and end stays as small as the node's running work,
not a day of it.

The invariant this module keeps: a workload's finished line is appended to ``finished.jsonl`` before
``state.json`` drops it, so an agent killed in between finds it still active or finished, never neither. Both
files are read back by :class:`WorkloadRecord`'s fields, so their format is the contract between an agent and
the one that replaces it (an agent upgraded mid-run recovers its predecessor's files).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent import protocol

# The runner's logger: these are its workloads' records, and an operator's filter on it keeps seeing them.
log = logging.getLogger("nodeagent.workloads")

STATE_FILE = "state.json"
FINISHED_FILE = "finished.jsonl"


@dataclass
class WorkloadRecord:
    """One run of one replica as the journal stores it: its fields are the keys of its JSON line, so none is
    renamed or removed (an upgraded agent reads its predecessor's files); a new one needs a default."""

    command_id: int
    job_id: int
    replica: int
    job_dir: str
    working_dir: str
    checkpoint_dir: str | None
    devices: list[dict] = field(default_factory=list)
    pid: int | None = None
    pid_start_time: int | None = None
    started_at: float = 0.0
    max_runtime_s: int | None = None
    state: str = "starting"
    exit_code: int | None = None
    stop_reason: str | None = None
    term_sent_at: float | None = None
    #: A stop with a drain (``workload.stop``'s ``drain_s``): SIGTERM is sent at this time, not before.
    term_after: float | None = None
    kill_after: float | None = None
    finished_at: float | None = None
    message: str = ""
    #: The newest checkpoint time already reported to the portal (``checkpointed`` status).
    reported_checkpoint_at: str | None = None
    #: ``oom_killed``, ``sandbox_failed``, ``rejected`` when the final state has such a cause (``reason`` of the
    #: status report).
    reason: str = ""
    #: The sandbox it runs in: ``none`` or ``namespaces``, with the uid, the cgroup name and the exit code file
    #: in the agent's control dir (None: ``exit_code`` in the job dir, written by the wrapper).
    sandbox: str = "none"
    uid: int | None = None
    cgroup: str | None = None
    exit_file: str | None = None
    #: The container's name when the job named an OCI image (run by ``container_runtime``).
    container: str | None = None
    #: Live logs (``nodeagent.logstream``): this run's output starts at byte ``log_start_pos`` of ``output.log``
    #: (a rerun on this node appends to it), which is offset ``log_base`` of the replica's log on the portal;
    #: the portal has acknowledged it up to ``log_acked``. ``log_inode`` is (st_dev, st_ino) of the file the agent
    #: opened; None for a workload that never started (nothing is streamed for it).
    log_base: int = 0
    log_start_pos: int = 0
    log_acked: int = 0
    log_inode: list[int] | None = None
    #: The job's output dir on this node (``workload.start``'s ``output_dir`` in its job dir) and the most bytes it
    #: may hold; collected when the workload ends (``nodeagent.outputs``).
    output_dir: str | None = None
    output_max_bytes: int = 0
    #: The addresses of the nodes the job runs on (``workload.start``'s ``peer_addresses``): the only machines
    #: whose connections reach this workload's sockets (``nodeagent.netpolicy``).
    peer_addresses: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.replica)

    @property
    def active(self) -> bool:
        return self.state not in protocol.WORKLOAD_FINAL_STATES


class Records(dict):
    """The agent's workloads by (job, replica), remembering which were put since the last save (new, or a new run
    of a replica), and which may still have output for the log shipper: so that a step, a save and the shipper
    look at the active workloads and those, not at a day of finished ones."""

    def __init__(self) -> None:
        super().__init__()
        self.put_since_save: set[tuple[int, int]] = set()
        self.log_watch: set[tuple[int, int]] = set()

    def __setitem__(self, key: tuple[int, int], record: WorkloadRecord) -> None:
        super().__setitem__(key, record)
        self.put_since_save.add(key)
        self.log_watch.add(key)


def replace_file(path: Path, text: str) -> None:
    """Write ``path`` whole: a reader sees the old file or the new one, never half of one."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


@dataclass
class _SavedLine:
    """A record's line (in ``state.json`` or ``finished.jsonl``) with the field values it was encoded from."""

    values: tuple
    line: str
    record: WorkloadRecord | None


class Journal:
    """``state.json`` and ``finished.jsonl`` of one work dir, written from :attr:`records` (which it owns)."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.records: Records = Records()
        self._lines: dict[tuple[int, int], _SavedLine] = {}
        self._finished_lines = 0  # lines in finished.jsonl now (compacted when twice what it needs)
        self._active_keys: set[tuple[int, int]] = set()  # records whose saved line is in state.json

    @property
    def state_path(self) -> Path:
        return self.work_dir / STATE_FILE

    @property
    def finished_path(self) -> Path:
        return self.work_dir / FINISHED_FILE

    def active_records(self) -> list[WorkloadRecord]:
        """The workloads not finished, without looking at the finished ones (an active one was saved as active,
        or was put since the last save)."""
        records = self.records
        found = (records.get(key) for key in self._active_keys | records.put_since_save)
        return [record for record in found if record is not None and record.active]

    def save(self, *, everything: bool = False) -> None:
        """Write ``state.json`` (``{"version": 1, "workloads": [...]}``, one active workload per line) after
        appending to ``finished.jsonl`` the finished workloads that changed since the last save.

        Each record's line is kept and encoded again only when one of its fields changed (fields are replaced,
        never changed in place: lists included), and the C encoder is used (``indent`` would bypass it). Only
        the active workloads and new ones are looked at, unless ``everything``: the runner changes a finished
        one only through its ``save`` (log offsets) and when it forgets old ones, so a start or an end costs the
        same whatever a day of finished workloads holds.
        """
        lines = self._lines
        active = self._active_keys
        if everything:
            for key in [key for key in lines if key not in self.records]:
                del lines[key]
                active.discard(key)
            keys = list(self.records)
        else:
            # The active ones, and those put since the last save: new, or a new run of a replica (another object).
            keys = [key for key in active | self.records.put_since_save if key in self.records]
        appended = []
        for key in keys:
            record = self.records[key]
            values = tuple(vars(record).values())
            cached = lines.get(key)
            if cached is None or cached.record is not record or cached.values != values:
                lines[key] = _SavedLine(values, json.dumps(vars(record)), record)
                if not record.active:
                    appended.append(lines[key].line)
            if record.active:
                active.add(key)
            else:
                active.discard(key)
        self.records.put_since_save.clear()  # once `active` holds those that are
        if appended:
            # Before state.json drops them: killed in between, the next agent finds them here, finished.
            with self.finished_path.open("a", encoding="utf-8") as journal:
                journal.write("\n".join(appended) + "\n")
            self._finished_lines += len(appended)
        if self._finished_lines > 2 * (len(lines) - len(active)) + 64:
            self._compact()
        body = ",\n".join(lines[key].line for key in sorted(active))
        replace_file(self.state_path, f'{{"version": 1, "workloads": [\n{body}\n]}}\n')

    def _compact(self) -> None:
        """Rewrite ``finished.jsonl`` with one line per finished workload kept."""
        body = "".join(saved.line + "\n" for key, saved in self._lines.items() if key not in self._active_keys)
        replace_file(self.finished_path, body)
        self._finished_lines = body.count("\n")

    def load_finished(self) -> None:
        """Put the finished workloads of ``finished.jsonl`` in :attr:`records`, the newest line of each replica
        winning."""
        try:
            text = self.finished_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("workloads: cannot read %s (%s); finished workloads forgotten", self.finished_path, exc)
            return
        for line in text.splitlines():
            if not line.strip():
                continue
            self._finished_lines += 1
            try:
                record = WorkloadRecord(**json.loads(line))
            except (ValueError, TypeError) as exc:  # a line cut short by a crash while appending
                log.warning("workloads: skipping a bad line of %s (%s)", self.finished_path, exc)
                continue
            self.records[record.key] = record
            self._lines[record.key] = _SavedLine(tuple(vars(record).values()), line, record)
        self.records.put_since_save.clear()  # their lines are the journal's: nothing to save

    def read_state(self) -> Iterator[WorkloadRecord] | None:
        """The workloads ``state.json`` lists, decoded one at a time as the caller takes them (not put in
        :attr:`records`: the runner decides which still run); None when it is missing or cannot be read."""
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.error("workloads: cannot read %s (%s); starting with no known workloads", self.state_path, exc)
            return None
        return (WorkloadRecord(**raw) for raw in data.get("workloads", []))
