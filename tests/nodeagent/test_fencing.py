"""Fencing: an agent that has not heard the portal for the fence time stops its workloads itself, before the
portal's grace period moves their jobs, and lifts the fence when the portal answers again."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from websockets.asyncio.server import serve

from nodeagent import protocol
from nodeagent.agent import Agent, websocket_connector
from nodeagent.fencing import FENCE_FILE, Fence, FenceSettings
from nodeagent.launcher import process_start_time
from nodeagent.workloads import WorkloadRunner
from tests.nodeagent.test_agent_loop import FakeClock, FakeConnector, _agent

FENCE_CONFIG = protocol.Config(
    telemetry_interval_s=1.0, heartbeat_interval_s=5.0, fence_after_s=40.0, fence_grace_s=10.0, requeue_after_s=60.0
)


async def connected_agent(tmp_path: Path, clock: FakeClock, connector: FakeConnector, **settings) -> Agent:
    agent = _agent(tmp_path, connector, clock, **settings)
    await agent.tick()
    connector.connections[-1].inbox.append(protocol.encode(FENCE_CONFIG))
    await agent.tick()
    return agent


async def start_sleeper(agent: Agent, clock: FakeClock, *, job_id: int = 7) -> int:
    """A workload that runs until signalled; returns its pid."""
    connection = agent.connection
    start = protocol.WorkloadStart(
        command_id=job_id, job_id=job_id, replica=0, command=[sys.executable, "-c", "import time; time.sleep(60)"]
    )
    connection.inbox.append(protocol.encode(start))
    clock.now += 0.1
    await agent.tick()
    pid = agent.runner.records[(job_id, 0)].pid
    assert pid is not None and process_start_time(pid) is not None
    return pid


async def tick_until(agent: Agent, clock: FakeClock, done, *, step_s: float = 0.5, ticks: int = 400) -> None:
    for _ in range(ticks):
        if done():
            return
        clock.now += step_s
        await agent.tick()
        await asyncio.sleep(0.01)
    assert done()


def fenced_reports(agent: Agent) -> list[protocol.WorkloadStatus]:
    return [status for status in agent.runner.outbox if status.reason == protocol.FENCED]


async def test_an_agent_without_the_portals_answer_for_the_fence_time_stops_its_workloads(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = await connected_agent(tmp_path, clock, connector)
    pid = await start_sleeper(agent, clock)
    connection = connector.connections[-1]
    connection.answers_pings = False  # the link swallows everything from now on
    silent_from = agent.fence.confirmed_at

    # Heartbeats and pings still go out, unanswered: the workload runs until the fence time.
    await tick_until(agent, clock, lambda: clock.now >= silent_from + 39.5)
    assert process_start_time(pid) is not None
    assert not agent.fence.fenced
    assert connection.pings >= 7

    await tick_until(agent, clock, lambda: agent.fence.fenced, ticks=4)
    await tick_until(agent, clock, lambda: process_start_time(pid) is None, step_s=0.05)
    await tick_until(agent, clock, lambda: fenced_reports(agent), step_s=0.05)
    # The workload took SIGTERM (its checkpoint signal) and ended well within the fence grace.
    assert clock.now - silent_from < 40 + 10
    (report,) = fenced_reports(agent)
    assert (report.job_id, report.state, report.reason) == (7, "stopped", "fenced")
    assert "no answer from the portal for 40 s" in report.message


async def test_a_workload_that_ignores_sigterm_is_killed_after_the_fence_grace(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = await connected_agent(tmp_path, clock, connector)
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    connection = agent.connection
    connection.inbox.append(
        protocol.encode(
            protocol.WorkloadStart(command_id=1, job_id=9, replica=0, command=[sys.executable, "-c", stubborn])
        )
    )
    await agent.tick()
    record = agent.runner.records[(9, 0)]
    output = Path(record.job_dir) / "output.log"
    for _ in range(300):  # until the handler is installed
        if output.exists() and "ready" in output.read_text():
            break
        await asyncio.sleep(0.01)
    connection.answers_pings = False

    await tick_until(agent, clock, lambda: agent.fence.fenced, step_s=1.0)
    fenced_at = clock.now
    await tick_until(agent, clock, lambda: clock.now >= fenced_at + 9.5, step_s=0.5)
    assert process_start_time(record.pid) is not None  # SIGTERM ignored, still within the grace
    await tick_until(agent, clock, lambda: fenced_reports(agent), step_s=0.05)
    assert clock.now <= fenced_at + 11
    assert process_start_time(record.pid) is None


async def test_the_portals_answer_lifts_the_fence_and_new_work_runs(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = await connected_agent(tmp_path, clock, connector)
    await start_sleeper(agent, clock, job_id=7)
    connection = connector.connections[-1]
    connection.answers_pings = False
    await tick_until(agent, clock, lambda: agent.fence.fenced, step_s=1.0)

    connection.answers_pings = True
    await tick_until(agent, clock, lambda: not agent.fence.fenced, step_s=1.0, ticks=10)
    pid = await start_sleeper(agent, clock, job_id=8)
    for _ in range(5):
        clock.now += 1.0
        await agent.tick()
    assert process_start_time(pid) is not None
    assert agent.runner.records[(8, 0)].stop_reason is None
    agent.runner.close(stop_workloads=True, grace_s=1.0)


async def test_a_closed_connection_counts_as_silence_and_the_reconnect_waits_are_capped(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = await connected_agent(tmp_path, clock, connector)
    pid = await start_sleeper(agent, clock)
    connector.connections[-1].drop()
    connector.failures = 1000  # the portal stays unreachable

    await tick_until(agent, clock, lambda: agent.fence.fenced, step_s=1.0, ticks=60)
    await tick_until(agent, clock, lambda: process_start_time(pid) is None, step_s=0.05)
    # The backoff (cap 8 s here) was held under a quarter of the fence time: many tries before fencing.
    assert connector.calls >= 5
    assert agent.fence.retry_cap_s() == 10.0


async def test_without_fence_settings_from_the_portal_nothing_is_fenced(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    pid = await start_sleeper(agent, clock)
    connector.connections[-1].answers_pings = False
    for _ in range(120):
        clock.now += 1.0
        await agent.tick()
    assert not agent.fence.fenced
    assert process_start_time(pid) is not None
    agent.runner.close(stop_workloads=True, grace_s=1.0)


async def test_the_command_line_fence_time_wins_over_the_portals(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = await connected_agent(tmp_path, clock, connector, fence=FenceSettings(after_s=0, grace_s=5))
    assert agent.fence.settings == FenceSettings(after_s=0, grace_s=5)
    pid = await start_sleeper(agent, clock)
    connector.connections[-1].answers_pings = False
    for _ in range(90):
        clock.now += 1.0
        await agent.tick()
    assert not agent.fence.fenced and process_start_time(pid) is not None
    agent.runner.close(stop_workloads=True, grace_s=1.0)


def test_a_restarted_agent_counts_the_silence_from_the_confirmation_before_its_restart(tmp_path: Path) -> None:
    clock, wall = FakeClock(), FakeClock()
    wall.now = 1_000_000.0
    path = tmp_path / FENCE_FILE
    fence = Fence(path=path, clock=clock, wall_clock=wall)
    fence.configure(after_s=40, grace_s=10, requeue_after_s=60)
    clock.now += 6  # (a confirmation is written at most every 5 s: an older one only fences sooner)
    wall.now += 6
    fence.confirm(clock.now)
    assert json.loads(path.read_text())["settings"]["after_s"] == 40

    # The agent dies; 30 s later a new one starts (its monotonic clock starts elsewhere), the portal unreachable.
    wall.now += 30
    restarted_clock = FakeClock()
    restarted_clock.now = 7.0
    again = Fence(path=path, clock=restarted_clock, wall_clock=wall)
    assert again.settings == FenceSettings(after_s=40, grace_s=10, requeue_after_s=60)
    assert again.silent_s(restarted_clock.now) == 30
    assert not again.due(restarted_clock.now)
    restarted_clock.now += 10
    assert again.due(restarted_clock.now)


async def test_a_real_websocket_pong_confirms_the_heartbeat(tmp_path: Path) -> None:
    async def portal(websocket) -> None:
        await websocket.send(protocol.encode(FENCE_CONFIG))
        async for _frame in websocket:
            pass  # the server answers pings by itself

    async with serve(portal, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        clock = FakeClock()
        agent = _agent(tmp_path, websocket_connector(f"ws://127.0.0.1:{port}/", "secret"), clock)
        start = agent.fence.confirmed_at
        clock.now += 1.0
        for _ in range(100):
            await agent.tick()
            if agent.fence.confirmed_at > start and agent.fence.settings is not None:
                break
            await asyncio.sleep(0.02)
        assert agent.fence.confirmed_at == start + 1.0  # the time the confirmed heartbeat was sent
        assert agent.fence.settings.after_s == 40
        await agent.connection.close()


def test_the_config_frame_carries_the_fence_and_older_portals_frames_still_decode() -> None:
    assert protocol.decode(protocol.encode(FENCE_CONFIG)) == FENCE_CONFIG
    older = protocol.decode('{"v": 1, "type": "config", "id": "c", "heartbeat_interval_s": 5}')
    assert (older.fence_after_s, older.fence_grace_s, older.requeue_after_s) == (None, None, None)
    for bad in ('"fence_after_s": -1', '"fence_grace_s": 1e400', '"requeue_after_s": "60"'):
        with pytest.raises(protocol.ProtocolError) as error:
            protocol.decode('{"v": 1, "type": "config", "id": "c", ' + bad + "}")
        assert error.value.code == protocol.ErrorCode.INVALID_FIELD


def test_a_new_run_of_a_replica_still_running_here_stops_the_old_one_and_starts_when_it_has_gone(tmp_path: Path):
    """The portal requeued a job while its copy ran on a cut-off node, then placed it on that node again. Before,
    the agent answered the new start 'already known' and never ran it; now the old copy is stopped first."""
    runner = WorkloadRunner(work_dir=tmp_path / "work")
    ready = "import time; print('ready', flush=True); time.sleep(60)"
    runner.start(protocol.WorkloadStart(command_id=5, job_id=3, replica=0, command=[sys.executable, "-c", ready]))
    old = runner.records[(3, 0)]
    output = Path(old.job_dir) / "output.log"
    for _ in range(500):
        if output.exists() and "ready" in output.read_text():
            break
        time.sleep(0.01)

    runner.start(protocol.WorkloadStart(command_id=9, job_id=3, replica=0, command=[sys.executable, "-c", ready]))
    assert old.stop_reason == "superseded" and old.term_sent_at is not None
    for _ in range(500):
        runner.poll()
        if runner.records[(3, 0)].command_id == 9:
            break
        time.sleep(0.01)
    new = runner.records[(3, 0)]
    assert new.command_id == 9 and new.active and new.pid != old.pid
    reports = [(status.command_id, status.state) for status in runner.outbox]
    assert (5, "stopped") in reports and (9, "running") in reports  # each report names its run
    # The old start, sent again (a resend after a reconnect), starts nothing.
    runner.start(protocol.WorkloadStart(command_id=5, job_id=3, replica=0, command=[sys.executable, "-c", ready]))
    assert runner.records[(3, 0)] is new and new.active
    runner.close(stop_workloads=True, grace_s=1.0)


async def test_when_the_portal_answers_heartbeats_its_answers_count_not_the_sockets_pongs(tmp_path: Path) -> None:
    """A web process whose socket still answers pings while its handler of this agent is stuck records no
    heartbeat: the portal declares the node lost all the same, so the agent must fence though pongs come back."""
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    connection = connector.connections[-1]
    connection.inbox.append(
        protocol.encode(
            protocol.Config(
                heartbeat_interval_s=5.0,
                fence_after_s=40.0,
                fence_grace_s=10.0,
                requeue_after_s=60.0,
                heartbeat_acks=True,
            )
        )
    )
    await agent.tick()
    pid = await start_sleeper(agent, clock)
    answered = 0

    def answer_heartbeats() -> None:  # the portal's handler, while it works
        nonlocal answered
        for frame in connection.sent:
            if frame["type"] == "heartbeat" and frame["seq"] > answered:
                answered = frame["seq"]
                connection.inbox.append(protocol.encode(protocol.HeartbeatAck(seq=answered)))

    for _ in range(60):  # 30 s of answered heartbeats: no fence
        clock.now += 0.5
        answer_heartbeats()
        await agent.tick()
    assert not agent.fence.fenced and process_start_time(pid) is not None
    assert connection.pings <= 1  # only before the portal's config said it answers heartbeats
    stuck_at = agent.fence.confirmed_at
    # The handler is stuck from now on; the socket still answers pings (FakeConnection does) but none are counted.
    # Half the fence time later the agent tries a new connection (a new handler); that one is stuck too here.
    await tick_until(agent, clock, lambda: len(connector.connections) == 2, step_s=0.5, ticks=200)
    assert 20 <= clock.now - stuck_at <= 21 and connection.closed
    await tick_until(agent, clock, lambda: agent.fence.fenced, step_s=0.5, ticks=200)
    assert 40 <= clock.now - stuck_at <= 41
    await tick_until(agent, clock, lambda: process_start_time(pid) is None, step_s=0.05)
