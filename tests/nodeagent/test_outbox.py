"""The agent's durable report outbox: the journal, report ids, and a real agent process killed and restarted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

from websockets.asyncio.server import serve

from nodeagent import protocol
from nodeagent.cli import save_credential
from nodeagent.outbox import ReportOutbox
from tests.nodeagent.sandboxing import WORKLOAD_PYTHON, sandbox_args

REPO = Path(__file__).resolve().parents[2]


def _status(job_id: int = 1, state: str = "running") -> protocol.WorkloadStatus:
    return protocol.WorkloadStatus(job_id=job_id, replica=0, state=state)  # type: ignore[arg-type]


def test_reports_get_increasing_ids_and_survive_a_reload_until_acked(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    outbox = ReportOutbox(path)
    frames = [outbox.add(_status(job_id)) for job_id in (1, 2, 3)]
    ids = [frame.report_id for frame in frames]
    assert ids == sorted(set(ids))
    assert [frame.id for frame in frames] == [f"report-{report_id}" for report_id in ids]
    assert outbox.ack(ids[1]) is True
    assert outbox.ack(ids[1]) is False  # a second ack of the same id changes nothing

    again = ReportOutbox(path)

    assert [(s.report_id, s.job_id) for s in again] == [(ids[0], 1), (ids[2], 3)]
    assert again.add(_status(4)).report_id > ids[2]


def test_a_torn_last_line_is_skipped_and_the_journal_repaired(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    outbox = ReportOutbox(path)
    kept = outbox.add(_status(1)).report_id
    with path.open("a") as handle:
        handle.write('{"report": {"v": 1, "type": "workload.sta')  # the agent was killed mid-write

    again = ReportOutbox(path)
    later = again.add(_status(2)).report_id

    assert [s.report_id for s in ReportOutbox(path)] == [kept, later]


def test_a_report_is_flushed_to_disk_and_an_ack_is_written_without_a_flush(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "outbox.jsonl"
    outbox = ReportOutbox(path)
    outbox.add(_status(1))  # the journal exists (its creation is flushed with its directory)
    flushed: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (flushed.append(fd), real_fsync(fd)))

    report_id = outbox.add(_status(2)).report_id
    after_add = len(flushed)
    outbox.ack(report_id)

    assert after_add == 1 and len(flushed) == 1  # the ack costs no disk flush
    assert [s.job_id for s in ReportOutbox(path)] == [1]  # but it is in the journal when ack() returns


def test_compaction_keeps_only_pending_reports_and_the_last_id(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    outbox = ReportOutbox(path, compact_after_acks=3)
    ids = [outbox.add(_status(job_id)).report_id for job_id in range(5)]
    for report_id in ids[:3]:
        outbox.ack(report_id)

    lines = path.read_text().splitlines()
    assert len(lines) == 3  # last_id + the two pending reports
    assert json.loads(lines[0]) == {"last_id": ids[-1]}
    assert [s.report_id for s in ReportOutbox(path)] == ids[3:]


def test_a_wiped_work_dir_still_numbers_above_the_old_ids(tmp_path: Path) -> None:
    old = ReportOutbox(tmp_path / "old.jsonl").add(_status()).report_id
    new = ReportOutbox(tmp_path / "new.jsonl").add(_status()).report_id
    assert new > old


def test_the_outbox_is_bounded_and_drops_the_oldest(tmp_path: Path, caplog) -> None:
    outbox = ReportOutbox(tmp_path / "outbox.jsonl", max_pending=2)
    ids = [outbox.add(_status(job_id)).report_id for job_id in range(3)]
    assert [s.report_id for s in outbox] == ids[1:]
    assert "dropping the oldest" in caplog.text
    assert [s.report_id for s in ReportOutbox(tmp_path / "outbox.jsonl")] == ids[1:]


def test_due_reports_are_the_unsent_and_the_stale(tmp_path: Path) -> None:
    outbox = ReportOutbox(tmp_path / "outbox.jsonl")
    a = outbox.add(_status(1)).report_id
    b = outbox.add(_status(2)).report_id
    outbox.mark_sent(a, 100.0)
    assert [s.report_id for s in outbox.due(101.0, resend_after_s=5)] == [b]
    outbox.mark_sent(b, 101.0)
    assert outbox.next_resend_at(resend_after_s=5) == 105.0
    assert [s.report_id for s in outbox.due(105.0, resend_after_s=5)] == [a]
    outbox.reset_sent()
    assert len(outbox.due(105.0, resend_after_s=5)) == 2


# --- a real agent process: the report queued while disconnected survives SIGKILL ------------------------------


def _agent_argv(port: int, credential_file: Path, work_dir: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "nodeagent", "run", "--server", f"http://127.0.0.1:{port}"),
        *("--credential-file", str(credential_file), "--backend", "simulated", "--cards", "1"),
        *("--work-dir", str(work_dir), *sandbox_args()),
    ]


async def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_report_queued_while_disconnected_is_delivered_by_the_restarted_agent(tmp_path: Path) -> None:
    credential_file = tmp_path / "agent.json"
    save_credential(credential_file, {"node_name": "sim-ob", "credential": "node-secret", "ws_url": "/ws/agent/"})
    work_dir = tmp_path / "work"
    outbox_file = work_dir / "outbox.jsonl"
    running = asyncio.Event()

    # Portal 1 starts a short workload, sees it running, then goes away before it ends (acks nothing).
    async def first_portal(websocket) -> None:
        async for text in websocket:
            frame = json.loads(text)
            if frame["type"] == "hello":
                start = protocol.WorkloadStart(
                    command_id=1,
                    job_id=21,
                    replica=0,
                    command=[WORKLOAD_PYTHON, "-c", "import time; time.sleep(1.0)"],
                    devices=[protocol.DeviceAssignment(uuid=frame["devices"][0]["uuid"], millis=1000)],
                )
                await websocket.send(protocol.encode(start))
            if frame["type"] == "workload.status" and frame["state"] == "running":
                running.set()
                return

    agent = None
    try:
        async with serve(first_portal, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            agent = await asyncio.create_subprocess_exec(
                *_agent_argv(port, credential_file, work_dir),
                cwd=REPO,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await asyncio.wait_for(running.wait(), timeout=30)
        # The portal is gone; the workload ends meanwhile and its report waits in the outbox on disk.
        await _wait_for(
            lambda: outbox_file.exists() and '"state":"succeeded"' in outbox_file.read_text(),
            timeout_s=20,
            what="the succeeded report in the outbox",
        )
        agent.send_signal(signal.SIGKILL)  # no goodbye, nothing flushed by the agent on the way out
        await asyncio.wait_for(agent.wait(), timeout=10)
        queued = [json.loads(line) for line in outbox_file.read_text().splitlines()]
        succeeded_id = next(e["report"]["report_id"] for e in queued if e.get("report", {}).get("state") == "succeeded")

        # Portal 2 acks every report; the restarted agent delivers the one queued before the kill.
        frames: list[dict] = []
        delivered = asyncio.Event()

        async def second_portal(websocket) -> None:
            async for text in websocket:
                frame = json.loads(text)
                frames.append(frame)
                if frame["type"] == "workload.status":
                    await websocket.send(protocol.encode(protocol.ReportAck(report_id=frame["report_id"])))
                    if frame["report_id"] == succeeded_id:
                        delivered.set()

        async with serve(second_portal, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            agent = await asyncio.create_subprocess_exec(
                *_agent_argv(port, credential_file, work_dir),
                cwd=REPO,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await asyncio.wait_for(delivered.wait(), timeout=30)
            await _wait_for(
                lambda: not list(ReportOutbox(outbox_file)), timeout_s=10, what="the acked outbox to be empty"
            )
    finally:
        if agent is not None and agent.returncode is None:
            agent.send_signal(signal.SIGTERM)
            await asyncio.wait_for(agent.wait(), timeout=15)

    hello = next(f for f in frames if f["type"] == "hello")
    assert hello["workloads_complete"] is True
    assert [(w["job_id"], w["state"], w["exit_code"]) for w in hello["workloads"]] == [(21, "succeeded", 0)]
    statuses = [f for f in frames if f["type"] == "workload.status"]
    assert frames.index(hello) < frames.index(statuses[0])
    succeeded = [f for f in statuses if f["state"] == "succeeded"]
    assert [f["report_id"] for f in succeeded] == [succeeded_id]  # the very report queued before the kill
