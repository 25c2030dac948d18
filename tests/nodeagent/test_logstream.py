"""Live logs on the agent: a workload's output becomes ``workload.log`` pieces with the right offsets, within the
size caps, resent until acknowledged, never split inside a character, never read through a link (no Django)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from nodeagent import protocol
from nodeagent.journal import WorkloadRecord
from nodeagent.launcher import LOG_FILE
from nodeagent.logstream import LogShipper, complete_utf8_length
from tests.nodeagent.test_agent_loop import FakeClock, FakeConnector, _agent

KIB = 1024


def _record(tmp_path: Path, output: bytes, *, active: bool = True, log_base: int = 0, start_pos: int = 0):
    job_dir = tmp_path / "jobs" / "7-0"
    job_dir.mkdir(parents=True, exist_ok=True)
    path = job_dir / LOG_FILE
    path.write_bytes(output)
    info = path.stat()
    record = WorkloadRecord(
        command_id=1, job_id=7, replica=0, job_dir=str(job_dir), working_dir=str(job_dir), checkpoint_dir=None
    )
    record.state = "running" if active else "succeeded"
    record.log_inode = [info.st_dev, info.st_ino]
    record.log_base = record.log_acked = log_base
    record.log_start_pos = start_pos
    return record


def _shipper(record: WorkloadRecord, clock: FakeClock, **options) -> LogShipper:
    return LogShipper(lambda: [record], clock=clock, **options)


def _ack(shipper: LogShipper, record: WorkloadRecord, piece: protocol.WorkloadLog) -> None:
    ack = protocol.WorkloadLogAck(
        job_id=piece.job_id, replica=piece.replica, offset=piece.offset, next_offset=piece.next_offset
    )
    shipper.acknowledge(ack, {(record.job_id, record.replica): record})


def _joined(pieces: list[protocol.WorkloadLog]) -> bytes:
    return b"".join(piece.text.encode() for piece in pieces)


def test_output_is_sent_in_pieces_of_at_most_64_kib_with_contiguous_offsets(tmp_path: Path) -> None:
    output = b"".join(b"line %06d\n" % n for n in range(20_000))  # 240,000 bytes
    record = _record(tmp_path, output)

    pieces = _shipper(record, FakeClock()).due(0.0)

    assert all(len(piece.text.encode()) <= protocol.MAX_LOG_CHUNK_BYTES for piece in pieces)
    assert [piece.offset for piece in pieces] == [n * protocol.MAX_LOG_CHUNK_BYTES for n in range(len(pieces))]
    assert _joined(pieces) == output
    for piece in pieces:  # every frame the agent builds is a valid frame on the wire
        assert protocol.decode(protocol.encode(piece)) == piece


def test_a_rerun_continues_the_log_at_the_offset_the_portal_gave(tmp_path: Path) -> None:
    # The first run wrote 100 bytes to output.log on this node; the portal's log of the job holds 5,000 bytes.
    record = _record(tmp_path, b"x" * 100 + b"second run\n", log_base=5000, start_pos=100)

    [piece] = _shipper(record, FakeClock()).due(0.0)

    assert (piece.offset, piece.text, piece.next_offset) == (5000, "second run\n", 5011)


def test_a_running_workload_has_at_most_the_in_flight_window_unacknowledged(tmp_path: Path) -> None:
    output = bytes(range(32, 127)) * 4000  # 380,000 bytes of ASCII
    record = _record(tmp_path, output)
    clock = FakeClock()
    shipper = _shipper(record, clock, in_flight_bytes=128 * KIB, interval_s=1.0)

    first = shipper.due(clock.now)
    assert sum(len(piece.text) for piece in first) == 128 * KIB
    assert shipper.due(clock.now + 1.0) == []  # nothing acknowledged yet: nothing more goes out

    for piece in first:
        _ack(shipper, record, piece)
    second = shipper.due(clock.now + 2.0)
    assert second[0].offset == 128 * KIB
    assert sum(len(piece.text) for piece in second) == 128 * KIB


def test_unacknowledged_pieces_are_sent_again_from_the_acknowledged_offset(tmp_path: Path) -> None:
    record = _record(tmp_path, b"a" * 100 * KIB)
    shipper = _shipper(record, FakeClock(), resend_s=5.0, interval_s=1.0)
    first = shipper.due(0.0)
    _ack(shipper, record, first[0])  # the second piece's ack never comes

    assert shipper.due(2.0) == []
    again = shipper.due(6.0)

    assert [piece.offset for piece in again] == [first[1].offset]
    shipper.reset()  # a new connection: whatever was in flight goes again
    assert [piece.offset for piece in shipper.due(6.5)] == [first[1].offset]


def test_a_character_is_never_split_between_two_pieces(tmp_path: Path) -> None:
    output = b"x" + "é".encode() * 40_000  # two bytes each, after one: 64 KiB falls in the middle of one
    record = _record(tmp_path, output, active=False)

    pieces = _shipper(record, FakeClock()).due(0.0)

    assert "".join(piece.text for piece in pieces) == output.decode()
    assert all("?" not in piece.text for piece in pieces)
    assert pieces[1].offset == pieces[0].next_offset == protocol.MAX_LOG_CHUNK_BYTES - 1


def test_an_unfinished_character_waits_for_its_last_bytes(tmp_path: Path) -> None:
    euro = "€".encode()  # three bytes
    record = _record(tmp_path, b"price: " + euro[:2])
    clock = FakeClock()
    shipper = _shipper(record, clock, interval_s=1.0)

    [piece] = shipper.due(0.0)
    assert piece.text == "price: "
    with open(Path(record.job_dir) / LOG_FILE, "ab") as handle:
        handle.write(euro[2:] + b"\n")
    _ack(shipper, record, piece)
    [rest] = shipper.due(1.0)

    assert (rest.offset, rest.text) == (7, "€\n")
    assert complete_utf8_length(b"ab" + euro[:1]) == 2


def test_bytes_that_are_not_text_become_one_question_mark_each(tmp_path: Path) -> None:
    record = _record(tmp_path, b"ok\x00\xff\xfe done\n", active=False)

    [piece] = _shipper(record, FakeClock()).due(0.0)

    assert piece.text == "ok??? done\n"
    assert piece.next_offset == len(b"ok\x00\xff\xfe done\n")


def test_past_the_backlog_the_oldest_output_is_skipped(tmp_path: Path) -> None:
    output = b"".join(b"%07d\n" % n for n in range(100_000))  # 800,000 bytes
    record = _record(tmp_path, output, active=False)

    pieces = _shipper(record, FakeClock(), backlog_bytes=256 * KIB).due(0.0)

    assert pieces[0].offset == len(output) - 256 * KIB
    assert _joined(pieces) == output[-256 * KIB :]


def test_a_finished_workload_is_read_to_its_end_at_once_and_then_left_alone(tmp_path: Path) -> None:
    record = _record(tmp_path, b"z" * 300 * KIB, active=False)
    shipper = _shipper(record, FakeClock(), in_flight_bytes=64 * KIB)

    pieces = shipper.due(0.0)
    assert _joined(pieces) == b"z" * 300 * KIB  # the window does not hold back a finished workload's end
    for piece in pieces:
        _ack(shipper, record, piece)

    assert shipper.due(100.0) == []
    assert (7, 0) in shipper.done


def test_output_replaced_by_a_link_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "agent.json"
    secret.write_text('{"credential": "gpn_secret"}')
    record = _record(tmp_path, b"harmless\n")
    path = Path(record.job_dir) / LOG_FILE
    path.unlink()
    os.symlink(secret, path)  # what a sandboxed workload that owns its job dir could do

    assert _shipper(record, FakeClock()).due(0.0) == []
    path.unlink()
    os.link(secret, path)  # a hard link: a plain file, but not the one the agent created
    assert _shipper(record, FakeClock()).due(0.0) == []


def test_a_refused_log_is_not_sent_again(tmp_path: Path) -> None:
    record = _record(tmp_path, b"hello\n")
    shipper = _shipper(record, FakeClock(), interval_s=1.0)
    assert len(shipper.due(0.0)) == 1
    refusal = protocol.WorkloadLogAck(job_id=7, replica=0, offset=0, next_offset=6, ok=False, code="not_allocated")

    shipper.acknowledge(refusal, {(7, 0): record})

    assert shipper.due(10.0) == []


@pytest.mark.parametrize(
    "fields",
    [
        {"offset": -1, "text": "x"},
        {"offset": 0, "text": ""},
        {"offset": 0, "text": "x" * (protocol.MAX_LOG_CHUNK_BYTES + 1)},
        {"offset": 0, "text": "\ud800"},
        {"offset": 0, "text": "x", "replica": -1},
    ],
    ids=["negative-offset", "empty", "over-the-cap", "lone-surrogate", "negative-replica"],
)
def test_a_bad_log_frame_is_refused_on_decode(fields: dict) -> None:
    frame = {"v": 1, "type": "workload.log", "id": "x", "job_id": 7, "replica": 0, **fields}

    with pytest.raises(protocol.ProtocolError) as refused:
        protocol.decode(json.dumps(frame))
    assert refused.value.code == protocol.ErrorCode.INVALID_FIELD


# --- the agent: output goes out while the workload runs, and before the report that ends it -----------------


async def test_the_agent_streams_output_while_running_and_the_rest_before_the_final_report(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock, log_interval_s=0.5)
    await agent.tick()
    connection = connector.connections[0]
    script = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('last')\n"
    start = protocol.WorkloadStart(command_id=1, job_id=9, replica=0, command=[sys.executable, "-c", script])
    connection.inbox.append(protocol.encode(start))

    texts: list[str] = []
    acked = 0
    for _ in range(200):
        clock.now += 0.5
        await agent.tick()
        pieces = [f for f in connection.sent if f["type"] == "workload.log"]
        texts = [f["text"] for f in pieces]
        for piece in pieces[acked:]:  # the portal's part: each piece acknowledged
            ack = protocol.WorkloadLogAck(
                job_id=9, replica=0, offset=piece["offset"], next_offset=piece["offset"] + len(piece["text"].encode())
            )
            connection.inbox.append(protocol.encode(ack))
        acked = len(pieces)
        final = [f for f in connection.sent if f["type"] == "workload.status" and f["state"] == "succeeded"]
        if final:
            break
        await asyncio.sleep(0.05)
    sent = connection.sent
    first_piece = next(i for i, f in enumerate(sent) if f["type"] == "workload.log")
    last_piece = max(i for i, f in enumerate(sent) if f["type"] == "workload.log")
    final_report = next(i for i, f in enumerate(sent) if f.get("state") == "succeeded")

    assert "".join(texts) == "first\nlast\n"
    assert texts[0] == "first\n"  # sent while the workload still ran
    assert first_piece < last_piece < final_report  # the last lines before the report that ends the job
    agent.runner.close(stop_workloads=True)


def test_a_new_run_of_a_replica_whose_earlier_log_is_all_sent_is_streamed_too(tmp_path: Path) -> None:
    """Found while making the shipper cheap (2026-12-04): a replica whose first run's log was all acknowledged was
    marked done for good, so a second run on the same node (preempted, then placed here again) streamed nothing."""
    first = _record(tmp_path, b"first\n", active=False)
    records = [first]
    shipper = LogShipper(lambda: records, clock=FakeClock())
    for piece in shipper.due(0.0):
        _ack(shipper, first, piece)
    assert shipper.due(1.0) == []

    with (Path(first.job_dir) / LOG_FILE).open("ab") as output:  # the rerun appends to output.log
        output.write(b"second run\n")
    second = WorkloadRecord(
        command_id=2, job_id=7, replica=0, job_dir=first.job_dir, working_dir=first.job_dir, checkpoint_dir=None
    )
    second.state, second.log_inode = "running", first.log_inode
    second.log_base = second.log_acked = 6  # the portal holds the first run's 6 bytes
    second.log_start_pos = 6
    records[:] = [second]

    [piece] = shipper.due(2.0)

    assert (piece.offset, piece.text, piece.next_offset) == (6, "second run\n", 17)


def test_a_refused_start_has_no_output_and_is_not_offered_again(tmp_path: Path) -> None:
    refused = _record(tmp_path, b"", active=False)
    refused.log_inode = None  # the runner refused it before opening output.log
    told: list[tuple[int, int]] = []
    shipper = LogShipper(lambda: [refused], clock=FakeClock(), on_done=told.append)

    assert shipper.due(0.0) == []
    assert told == [(7, 0)]
