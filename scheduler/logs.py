"""Live logs of jobs: what node agents stream (``workload.log``) kept as ``JobLogChunk`` rows, read back by offset.

Each replica of a job has one log: a byte stream (UTF-8) that the runs of the replica continue one after another
(a requeued job's next run starts where the last one ended: ``workload.start.log_offset``). A row holds the
text of bytes ``[offset, offset + len(text as UTF-8))`` of it; rows never overlap and hold at most
:data:`MAX_CHUNK_BYTES`, and small pieces that follow on are merged into the row before them, so a job that
prints a line a second costs one row per 64 KiB, not one per second.

Writes: :func:`job_logs_append` (agents' pieces, many at once; idempotent: what is stored already is skipped,
so a resent piece changes nothing) and :func:`job_logs_purge` (retention). Reads: :func:`job_log_slice` (the API, the
console and the follow socket), :func:`job_log_ends` (where a new run's output continues). The caller checks
who may read: the API and the socket fetch the job through ``selectors.job_get_visible`` first.

Settings: ``GPUPOOL_JOB_LOG_MAX_BYTES`` (8 MiB; 0 = no limit) — each replica's log keeps its newest bytes up
to this, the older rows are deleted as new ones come (``truncated_before`` says where the kept part starts);
``GPUPOOL_JOB_LOG_RETENTION_DAYS`` (30; 0 = keep) — the logs of jobs finished longer ago are deleted by the
``scheduler.job_logs_purge`` beat task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from kernel.api import DomainError, NotFoundError
from kernel.db.bulk import update_rows
from nodeagent import protocol
from scheduler import messages as scheduler_messages
from scheduler import selectors
from scheduler.models import FINAL_JOB_STATES, Allocation, Job, JobLogChunk

__all__ = [
    "MAX_CHUNK_BYTES",
    "LogAppendOutcome",
    "LogPiece",
    "LogSlice",
    "job_get_readable",
    "job_log_append",
    "job_log_ends",
    "job_log_group",
    "job_log_slice",
    "job_logs_append",
    "job_logs_purge",
    "replica_count",
]

#: Largest row (and largest piece an agent sends).
MAX_CHUNK_BYTES = protocol.MAX_LOG_CHUNK_BYTES
#: What one read returns unless it asks for another size, and the most it may ask for.
DEFAULT_SLICE_BYTES = 256 * 1024
MAX_SLICE_BYTES = 8 * 1024 * 1024


def log_max_bytes() -> int | None:
    """The most bytes one replica's log keeps; None: no limit."""
    return int(getattr(settings, "GPUPOOL_JOB_LOG_MAX_BYTES", 8 * 1024 * 1024)) or None


def log_retention_days() -> int | None:
    """Days the logs of a finished job are kept; None: for ever."""
    return int(getattr(settings, "GPUPOOL_JOB_LOG_RETENTION_DAYS", 30)) or None


def job_log_group(job_id: int, replica: int) -> str:
    """The channel group told when a replica's log grew (the follow socket, ``scheduler.consumers``)."""
    return f"joblog.{job_id}.{replica}"


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


# --- writes ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogPiece:
    """Bytes ``[offset, offset + len(text as UTF-8))`` of a replica's log, as node ``node_id``'s agent sent them."""

    node_id: int
    job_id: int
    replica: int
    offset: int
    text: str

    @property
    def end(self) -> int:
        return self.offset + _size(self.text)


@dataclass(frozen=True)
class LogAppendOutcome:
    """The answer to one piece (``workload.log.ack``): ``ok`` false, with ``code``, when it was refused for good.
    ``stored_bytes`` is how much of it was new (0 for a piece sent again)."""

    next_offset: int
    stored_bytes: int = 0
    ok: bool = True
    code: str = ""
    detail: str = ""


def _refusal(piece: LogPiece, holders: list[tuple[int, Any]], job_exists: bool) -> LogAppendOutcome | None:
    """Why ``piece``'s node may not write the replica's log (``holders``: (node, ended_at) of every allocation the
    replica ever had), or None when it may: the node holds the replica now, or held it last (the end of a run that
    stopped, arriving after its final report). A node that never held it, or whose run was replaced by one
    elsewhere, is refused: its output is not this run's."""
    mine = [ended_at for holder, ended_at in holders if holder == piece.node_id]
    where = f"job {piece.job_id} replica {piece.replica}"
    if not mine:
        detail = f"node {piece.node_id} never ran {where}"
        return LogAppendOutcome(piece.end, ok=False, code="not_held" if job_exists else "unknown_job", detail=detail)
    runs_here = any(ended_at is None for ended_at in mine)
    runs_elsewhere = any(holder != piece.node_id and ended_at is None for holder, ended_at in holders)
    if runs_elsewhere and not runs_here:
        detail = f"{where} runs on another node now; this run's output is no longer taken"
        return LogAppendOutcome(piece.end, ok=False, code="not_allocated", detail=detail)
    return None


def _invalid(piece: LogPiece) -> LogAppendOutcome | None:
    size = _size(piece.text)
    if 0 < size <= MAX_CHUNK_BYTES and piece.offset >= 0 and piece.replica >= 0 and "\0" not in piece.text:
        return None
    detail = f"a log piece is 1 to {MAX_CHUNK_BYTES} bytes of text without NUL, at an offset from 0"
    return LogAppendOutcome(piece.offset + size, ok=False, code="invalid_log", detail=detail)


def _uncovered(start: int, end: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` no span in ``spans`` (sorted, non-overlapping) covers."""
    gaps = []
    position = start
    for span_start, span_end in spans:
        if span_end <= position:
            continue
        if span_start >= end:
            break
        if span_start > position:
            gaps.append((position, span_start))
        position = max(position, span_end)
    if position < end:
        gaps.append((position, end))
    return gaps


@dataclass
class _Row:
    """A stored (``pk``) or new row of one replica's log, while a batch is applied."""

    pk: int | None
    offset: int
    text: str
    changed: bool = False

    @property
    def end(self) -> int:
        return self.offset + _size(self.text)


def _apply(rows: list[_Row], piece: LogPiece) -> int:
    """Add the bytes of ``piece`` that ``rows`` (one replica's, sorted) lack; returns how many were new."""
    data = piece.text.encode("utf-8")
    stored = 0
    for gap_start, gap_end in _uncovered(piece.offset, piece.end, [(row.offset, row.end) for row in rows]):
        text = protocol.decode_output(data[gap_start - piece.offset : gap_end - piece.offset])
        stored += gap_end - gap_start
        before = next((row for row in rows if row.end == gap_start), None)
        if before is not None and before.end - before.offset + gap_end - gap_start <= MAX_CHUNK_BYTES:
            before.text += text  # follows on: one row per 64 KiB, not one per second of output
            before.changed = True
        else:
            rows.append(_Row(pk=None, offset=gap_start, text=text))
            rows.sort(key=lambda row: row.offset)
    return stored


def job_logs_append(*, pieces: Sequence[LogPiece]) -> list[LogAppendOutcome]:
    """Store agents' log pieces, many at once (the agent sockets of a process write theirs together); returns one
    outcome per piece, in order.

    Idempotent: what is stored already is skipped, so a piece sent again (or one that overlaps what is stored)
    changes nothing twice. A piece that follows on from a row is merged into it while the row stays within
    :data:`MAX_CHUNK_BYTES`. Past ``GPUPOOL_JOB_LOG_MAX_BYTES`` the oldest bytes are deleted. A piece that is not
    a valid one, or comes from a node that may not write that log (:func:`_refusal`), is refused in its outcome;
    database errors propagate (the agents send their pieces again). A handful of statements per call, however
    many pieces.
    """
    outcomes: list[LogAppendOutcome | None] = [_invalid(piece) for piece in pieces]
    valid = [index for index, outcome in enumerate(outcomes) if outcome is None]
    if not valid:
        return [outcome for outcome in outcomes if outcome is not None]
    job_ids = {pieces[index].job_id for index in valid}
    holders: dict[tuple[int, int], list[tuple[int, Any]]] = {}
    for job_id, replica, node_id, ended_at in Allocation.objects.filter(job_id__in=job_ids).values_list(
        "job_id", "replica", "node_id", "ended_at"
    ):
        holders.setdefault((job_id, replica), []).append((node_id, ended_at))
    placed = {job_id for job_id, _replica in holders}
    unplaced = job_ids - placed
    existing = placed | (set(Job.objects.filter(pk__in=unplaced).values_list("pk", flat=True)) if unplaced else set())
    allowed = []
    for index in valid:
        piece = pieces[index]
        refused = _refusal(piece, holders.get((piece.job_id, piece.replica), []), piece.job_id in existing)
        if refused is None:
            allowed.append(index)
        outcomes[index] = refused
    if allowed:
        _store(pieces, allowed, outcomes)
    return outcomes  # type: ignore[return-value]  # every slot is filled by now


def _store(pieces: Sequence[LogPiece], allowed: list[int], outcomes: list[LogAppendOutcome | None]) -> None:
    spans: dict[tuple[int, int], tuple[int, int]] = {}
    for index in allowed:
        piece = pieces[index]
        low, high = spans.get((piece.job_id, piece.replica), (piece.offset, piece.end))
        spans[(piece.job_id, piece.replica)] = (min(low, piece.offset), max(high, piece.end))
    where = Q()
    for (job_id, replica), (low, high) in spans.items():
        where |= Q(job_id=job_id, replica=replica, offset__lt=high, offset__gte=max(0, low - MAX_CHUNK_BYTES))
    with transaction.atomic():
        # Locked: a piece resent while the first copy is being stored waits, then finds it stored.
        found = JobLogChunk.objects.select_for_update().filter(where).order_by("job_id", "replica", "offset")
        rows: dict[tuple[int, int], list[_Row]] = {key: [] for key in spans}
        for pk, job_id, replica, offset, text in found.values_list("pk", "job_id", "replica", "offset", "text"):
            rows[(job_id, replica)].append(_Row(pk=pk, offset=offset, text=text))
        grew: set[tuple[int, int]] = set()
        for index in allowed:
            piece = pieces[index]
            stored = _apply(rows[(piece.job_id, piece.replica)], piece)
            outcomes[index] = LogAppendOutcome(next_offset=piece.end, stored_bytes=stored)
            if stored:
                grew.add((piece.job_id, piece.replica))
        new = [
            JobLogChunk(job_id=job_id, replica=replica, offset=row.offset, text=row.text)
            for (job_id, replica), replica_rows in rows.items()
            for row in replica_rows
            if row.pk is None
        ]
        JobLogChunk.objects.bulk_create(new, ignore_conflicts=True)
        grown = [(row.pk, row.text) for replica_rows in rows.values() for row in replica_rows if row.pk and row.changed]
        update_rows(JobLogChunk, columns=(("id", "bigint"), ("text", "text")), rows=grown, set_sql="text = v.text")
        cap = log_max_bytes()
        if cap is not None:
            for job_id, replica in grew:
                if rows[(job_id, replica)][-1].end > cap:
                    _keep_newest(job_id=job_id, replica=replica, cap=cap)


def job_log_append(*, node_id: int, job_id: int, replica: int, offset: int, text: str) -> LogAppendOutcome:
    """Store one piece (:func:`job_logs_append`)."""
    piece = LogPiece(node_id=node_id, job_id=job_id, replica=replica, offset=offset, text=text)
    return job_logs_append(pieces=[piece])[0]


def _keep_newest(*, job_id: int, replica: int, cap: int) -> None:
    """Keep the last ``cap`` bytes of the log: rows before them are deleted, a row that straddles the cut loses
    its head (up to the next whole character)."""
    rows = JobLogChunk.objects.filter(job_id=job_id, replica=replica)
    last = rows.order_by("-offset").values_list("offset", "text").first()
    if last is None:
        return
    cutoff = last[0] + _size(last[1]) - cap
    if cutoff <= 0:
        return
    rows.filter(offset__lt=cutoff - MAX_CHUNK_BYTES).delete()  # they end before the cut: rows hold ≤ 64 KiB
    for pk, row_offset, row_text in rows.filter(offset__lt=cutoff).values_list("pk", "offset", "text"):
        data = row_text.encode("utf-8")
        if row_offset + len(data) <= cutoff:
            JobLogChunk.objects.filter(pk=pk).delete()
            continue
        tail = data[cutoff - row_offset :]
        skip = _continuation_bytes(tail)
        JobLogChunk.objects.filter(pk=pk).update(offset=cutoff + skip, text=tail[skip:].decode("utf-8"))


def job_logs_purge(*, now: datetime | None = None, batch_size: int = 5000) -> int:
    """Delete the logs of jobs that finished more than ``GPUPOOL_JOB_LOG_RETENTION_DAYS`` ago, in batches (a
    long table is not locked in one statement). Returns the rows deleted."""
    days = log_retention_days()
    if days is None:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    finished = Job.objects.filter(state__in=FINAL_JOB_STATES, finished_at__lt=cutoff).values("pk")
    deleted = 0
    while True:
        ids = list(
            JobLogChunk.objects.filter(job__in=finished).order_by("pk").values_list("pk", flat=True)[:batch_size]
        )
        if not ids:
            return deleted
        count, _ = JobLogChunk.objects.filter(pk__in=ids).delete()
        deleted += count


# --- reads -------------------------------------------------------------------------------------------------------


def job_get_readable(*, user: Any, pk: Any) -> Job:
    """The job whose log ``user`` asks for: the same rule as the job itself (``selectors.jobs_visible_to``, the
    policy's job.view: a tenant's users see their subtree's jobs, the system admin and the auditor all), and the
    same 404 for missing and not yours.
    Without the job detail's events and allocations: a follower asks every few seconds."""
    try:
        return selectors.jobs_visible_to(user).get(pk=int(pk))
    except (Job.DoesNotExist, TypeError, ValueError):
        raise NotFoundError(scheduler_messages.NO_JOB_ID_VISIBLE_YOU(pk=pk)) from None


def replica_count(job: Job) -> int:
    """How many replicas may have a log: the gang, or an inference service's most."""
    return max(job.replicas, job.max_replicas or 0, 1)


@dataclass(frozen=True)
class LogSlice:
    """Text of a replica's log from ``offset`` (the API's answer): read on from ``next_offset``. ``complete`` is
    true when the job has finished and nothing is stored past ``next_offset``; ``truncated_before`` is the first
    offset still kept (0 when nothing was cut)."""

    job: int
    replica: int
    offset: int
    next_offset: int
    text: str
    complete: bool
    truncated_before: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _continuation_bytes(data: bytes) -> int:
    count = 0
    while count < min(3, len(data)) and 0x80 <= data[count] < 0xC0:
        count += 1
    return count


def _cut(data: bytes, limit: int) -> bytes:
    """The longest prefix of ``data`` (valid UTF-8) of at most ``limit`` bytes that ends on a character."""
    if len(data) <= limit:
        return data
    while limit > 0 and 0x80 <= data[limit] < 0xC0:
        limit -= 1
    return data[:limit]


def job_log_slice(*, job: Job, replica: int, offset: int, limit_bytes: int = DEFAULT_SLICE_BYTES) -> LogSlice:
    """Up to ``limit_bytes`` of replica ``replica``'s log from ``offset``, ending on a whole character.

    An offset before what is kept reads from the first kept byte; one inside a character from the next
    character; one past the end returns no text and the same offset to ask again. A gap (output the agent had
    to skip) ends the text: the next read goes on after it.
    """
    if replica < 0 or offset < 0 or limit_bytes < 1:
        raise DomainError("replica, offset and limit_bytes must be positive", code="invalid")
    chunks = JobLogChunk.objects.filter(job=job, replica=replica)
    first_offset = chunks.order_by("offset").values_list("offset", flat=True).first()
    last = chunks.order_by("-offset").values_list("offset", "text").first()
    log_end = last[0] + _size(last[1]) if last is not None else 0
    position = offset
    parts: list[bytes] = []
    size = 0
    # Rows are 64 KiB once merged; a log with gaps has smaller ones, and a read that runs out of rows before the
    # limit simply says where to go on.
    most_rows = limit_bytes // (16 * 1024) + 8
    rows = (
        chunks.filter(offset__gte=max(0, offset - MAX_CHUNK_BYTES))
        .order_by("offset")
        .values_list("offset", "text")[:most_rows]
    )
    for row_offset, row_text in rows:
        data = row_text.encode("utf-8")
        if row_offset + len(data) <= position:
            continue
        if row_offset > position:
            if parts:
                break  # a gap: the next read starts after it
            position = row_offset
        piece = data[position - row_offset :]
        skip = _continuation_bytes(piece)
        piece, position = piece[skip:], position + skip
        piece = _cut(piece, limit_bytes - size)
        if not piece:
            break
        parts.append(piece)
        size += len(piece)
        position += len(piece)
        if size >= limit_bytes:
            break
    return LogSlice(
        job=job.pk,
        replica=replica,
        offset=offset,
        next_offset=position,
        text=b"".join(parts).decode("utf-8"),
        complete=job.state in FINAL_JOB_STATES and position >= log_end,
        truncated_before=first_offset or 0,
    )


def job_log_ends(*, job_ids: Iterable[int]) -> dict[tuple[int, int], int]:
    """``(job id, replica) → end of its log`` for the replicas of ``job_ids`` that have one: where a new run's
    output continues (``workload.start.log_offset``). One query, whatever the number of jobs."""
    ids = list(job_ids)
    if not ids:
        return {}
    later = JobLogChunk.objects.filter(
        job_id=OuterRef("job_id"), replica=OuterRef("replica"), offset__gt=OuterRef("offset")
    )
    rows = (
        JobLogChunk.objects.filter(job_id__in=ids)
        .filter(~Exists(later))
        .order_by()
        .values_list("job_id", "replica", "offset", "text")
    )
    return {(job_id, replica): offset + _size(text) for job_id, replica, offset, text in rows}
