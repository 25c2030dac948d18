"""The agent loop: backoff, buffering, frames, commands; step by step on a fake clock, then on real WebSockets."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import pytest
from websockets.asyncio.server import serve

from nodeagent import protocol
from nodeagent.agent import (
    Agent,
    AgentSettings,
    Backoff,
    ConnectionLost,
    TelemetryBuffer,
    websocket_connector,
    ws_url_for,
)
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.workloads import WorkloadRunner


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


class FakeConnection:
    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.inbox: list[str] = []
        self._closed = False
        self.close_code: int | None = None
        #: Pings answered (the portal hears the agent); False: the link drops everything silently.
        self.answers_pings = True
        self.pings = 0

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, text: str) -> None:
        if self._closed:
            raise ConnectionLost("closed")
        protocol.decode(text)  # everything the agent sends is a valid frame
        self.sent.append(json.loads(text))

    async def ping(self, on_pong) -> None:
        if self._closed:
            raise ConnectionLost("closed")
        self.pings += 1
        if self.answers_pings:
            on_pong()

    def received(self) -> list[str]:
        frames, self.inbox = self.inbox, []
        return frames

    async def wait(self, timeout_s: float) -> None:
        return None

    async def close(self) -> None:
        self._closed = True

    def drop(self, code: int = 1006) -> None:
        self._closed = True
        self.close_code = code

    def types(self) -> list[str]:
        return [frame["type"] for frame in self.sent]


class FakeConnector:
    """Fails ``failures`` times, then hands out fresh FakeConnections."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls = 0
        self.connections: list[FakeConnection] = []

    async def __call__(self) -> FakeConnection:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionRefusedError("connection refused")
        self.connections.append(FakeConnection())
        return self.connections[-1]


def _agent(tmp_path: Path, connector, clock: FakeClock, **settings) -> Agent:
    return Agent(
        settings=AgentSettings(node_name="sim-00", backoff_base_s=1.0, backoff_cap_s=8.0, **settings),
        backend=SimulatedBackend(node_name="sim-00", cards=2),
        runner=WorkloadRunner(work_dir=tmp_path / "work", clock=clock),
        connector=connector,
        clock=clock,
        rng=random.Random(3),
    )


def test_backoff_grows_exponentially_within_jitter_bounds_up_to_the_cap() -> None:
    backoff = Backoff(base_s=1.0, cap_s=30.0, rng=random.Random(1))

    delays = [backoff.next_delay() for _ in range(8)]

    for attempt, delay in enumerate(delays):
        ceiling = min(30.0, 2.0**attempt)
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= 30.0
    assert delays[-1] >= 15.0
    backoff.reset()
    assert backoff.next_delay() <= 1.0


def test_backoff_jitter_differs_between_agents() -> None:
    first = [Backoff(rng=random.Random(1)).next_delay() for _ in range(1)]
    second = [Backoff(rng=random.Random(2)).next_delay() for _ in range(1)]

    assert first != second


def test_telemetry_buffer_keeps_the_newest_frames_and_counts_drops() -> None:
    buffer = TelemetryBuffer(max_frames=3)

    for seq in range(5):
        buffer.add(protocol.Telemetry(id=f"t{seq}"))

    assert [frame.id for frame in buffer.frames] == ["t2", "t3", "t4"]
    assert buffer.dropped == 2


def test_ws_url_is_derived_from_the_server_url() -> None:
    assert ws_url_for("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/ws/agent/"
    assert ws_url_for("https://pool.example/gpupool/") == "wss://pool.example/gpupool/ws/agent/"
    assert ws_url_for("http://h", "wss://other/ws/agent/") == "wss://other/ws/agent/"
    with pytest.raises(ValueError):
        ws_url_for("ftp://h")


async def test_connect_sends_hello_then_heartbeat_and_telemetry(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)

    delay = await agent.tick()

    connection = connector.connections[0]
    assert connection.types() == ["hello", "telemetry", "heartbeat"]
    hello = protocol.from_dict(connection.sent[0])
    assert isinstance(hello, protocol.Hello)
    assert hello.node_name == "sim-00"
    assert len(hello.devices) == 2
    assert hello.labels["gpupool.io/backend"] == "simulated"
    assert connection.sent[1]["buffered"] is False
    assert len(connection.sent[1]["samples"]) == 2
    assert 0 < delay <= 1.0


async def test_telemetry_every_interval_and_heartbeat_every_heartbeat_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock, heartbeat_interval_s=3.0)

    for _ in range(7):
        await agent.tick()
        clock.now += 1.0

    types = connector.connections[0].types()
    assert types.count("telemetry") == 7
    assert types.count("heartbeat") == 3  # at 0, 3 and 6 s
    assert [f["seq"] for f in connector.connections[0].sent if f["type"] == "heartbeat"] == [1, 2, 3]


async def test_failed_connects_back_off_and_buffer_telemetry_which_is_resent_marked_buffered(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector(failures=2)
    agent = _agent(tmp_path, connector, clock)

    await agent.tick()  # attempt 1 fails: next try after 0.5-1 s
    assert connector.calls == 1
    ticks = 0
    while not connector.connections:
        clock.now += 0.25
        await agent.tick()
        ticks += 1
        assert ticks < 40

    # Attempt 2 came 0.5-1 s after the first, attempt 3 (success) 1-2 s after that.
    assert connector.calls == 3
    assert 1.5 <= clock.now - 500.0 <= 3.25
    connection = connector.connections[0]
    frames = connection.sent
    assert frames[0]["type"] == "hello"
    buffered = [f for f in frames if f["type"] == "telemetry" and f["buffered"]]
    assert len(buffered) >= 2
    assert all(f["sampled_at"] <= f["sent_at"] for f in buffered)
    assert frames.index(buffered[0]) < frames.index(next(f for f in frames if f["type"] == "heartbeat"))


async def test_dropped_connection_buffers_and_reconnects(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock, buffer_frames=2)
    await agent.tick()
    first = connector.connections[0]
    first.drop()

    for _ in range(5):  # disconnected: reconnect attempts happen once the backoff allows
        clock.now += 0.2
        await agent.tick()
        if len(connector.connections) > 1:
            break

    assert len(connector.connections) == 2
    assert connector.connections[1].types()[0] == "hello"
    assert len(agent.buffer) == 0


async def test_buffer_is_bounded_while_the_portal_is_down(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector(failures=1000)
    agent = _agent(tmp_path, connector, clock, buffer_frames=5)

    for _ in range(20):
        await agent.tick()
        clock.now += 1.0

    assert len(agent.buffer) == 5
    assert agent.buffer.dropped == 15


async def test_workload_start_is_acked_and_reported_and_a_duplicate_is_not_started_again(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    connection = connector.connections[0]
    uuid = protocol.from_dict(connection.sent[0]).devices[0].uuid
    start = protocol.WorkloadStart(
        command_id=41,
        job_id=7,
        replica=0,
        command=[sys.executable, "-c", "import time; time.sleep(30)"],
        devices=[protocol.DeviceAssignment(uuid=uuid, millis=500, memory_mib=20000)],
    )
    connection.inbox.append(protocol.encode(start))
    connection.inbox.append(protocol.encode(start))

    clock.now += 1.0
    await agent.tick()

    frames = [f for f in connection.sent if f["type"] in ("ack", "workload.status")]
    # Each report names the run it is about (its start command).
    assert [(f["type"], f.get("command_id"), f.get("state")) for f in frames] == [
        ("workload.status", 41, "running"),
        ("ack", 41, None),
        ("workload.status", 41, "running"),
        ("ack", 41, None),
    ]
    assert all(f["ok"] for f in frames if f["type"] == "ack")
    assert len(agent.runner.running()) == 1
    telemetry = [f for f in connection.sent if f["type"] == "telemetry"][-1]
    assert next(s for s in telemetry["samples"] if s["uuid"] == uuid)["utilization_pct"] > 20

    connection.inbox.append(protocol.encode(protocol.WorkloadStop(command_id=42, job_id=7, replica=0, grace_s=0)))
    for _ in range(200):
        clock.now += 0.05
        await agent.tick()
        if any(f.get("state") == "stopped" for f in connection.sent):
            break
        await asyncio.sleep(0.01)
    assert any(f.get("state") == "stopped" for f in connection.sent)
    assert {"type": "ack", "command_id": 42} in [
        {"type": f["type"], "command_id": f.get("command_id")} for f in connection.sent
    ]


async def test_refused_start_is_nacked_and_reported_failed(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    connection = connector.connections[0]
    bad = protocol.WorkloadStart(command_id=5, job_id=8, replica=0, command=["true"], working_dir="/etc")
    connection.inbox.append(protocol.encode(bad))

    await agent.tick()

    ack = next(f for f in connection.sent if f["type"] == "ack")
    status = next(f for f in connection.sent if f["type"] == "workload.status")
    assert ack["ok"] is False
    assert "outside the agent's work dir" in ack["error"]
    assert (status["job_id"], status["state"]) == (8, "failed")


async def test_error_and_malformed_frames_are_logged_and_the_loop_continues(tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    connection = connector.connections[0]
    connection.inbox.append(protocol.encode(protocol.Error(code="hello_required", detail="send hello first")))
    connection.inbox.append("{not json")

    clock.now += 1.0
    await agent.tick()

    assert "hello_required" in caplog.text
    assert "bad frame" in caplog.text
    assert agent.connected
    assert connection.types()[-1] in ("telemetry", "heartbeat")


async def test_config_frame_changes_the_intervals(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    connection = connector.connections[0]
    connection.inbox.append(protocol.encode(protocol.Config(telemetry_interval_s=2.0, heartbeat_interval_s=4.0)))

    for _ in range(8):
        clock.now += 1.0
        await agent.tick()

    later = connection.types()[3:]
    assert later.count("telemetry") == 4
    assert agent.settings.heartbeat_interval_s == 4.0


async def test_status_finished_while_disconnected_is_delivered_after_reconnect(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    connector.connections[0].drop()
    await agent.tick()  # notices the drop
    agent.runner.start(
        protocol.WorkloadStart(command_id=1, job_id=3, replica=0, command=[sys.executable, "-c", "pass"])
    )
    for _ in range(400):
        agent.runner.poll()
        if not agent.runner.records[(3, 0)].active:
            break
        await asyncio.sleep(0.01)

    clock.now += 60
    await agent.tick()

    sent = connector.connections[1].sent
    states = [f["state"] for f in sent if f["type"] == "workload.status"]
    assert states == ["running", "succeeded"]


# --- against a real WebSocket server (not Django) ------------------------------------------------------------


async def test_agent_run_loop_against_a_local_websocket_server(tmp_path: Path) -> None:
    sessions: list[list[dict]] = []
    headers: list[str | None] = []
    second_session_has_buffered = asyncio.Event()

    async def handler(websocket) -> None:
        headers.append(websocket.request.headers.get("Authorization"))
        frames: list[dict] = []
        sessions.append(frames)
        await websocket.send(protocol.encode(protocol.Config(telemetry_interval_s=0.05, heartbeat_interval_s=0.1)))
        async for text in websocket:
            frames.append(json.loads(text))
            if len(sessions) == 1 and sum(f["type"] == "telemetry" for f in frames) >= 3:
                await websocket.close(code=1011)  # the portal restarts
                return
            buffered = any(f["type"] == "telemetry" and f["buffered"] for f in frames)
            if len(sessions) == 2 and buffered and any(f["type"] == "heartbeat" for f in frames):
                second_session_has_buffered.set()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        agent = Agent(
            settings=AgentSettings(
                node_name="sim-07", telemetry_interval_s=0.05, backoff_base_s=0.3, backoff_cap_s=0.6
            ),
            backend=SimulatedBackend(node_name="sim-07", cards=2),
            runner=WorkloadRunner(work_dir=tmp_path / "work"),
            connector=websocket_connector(ws_url_for(f"http://127.0.0.1:{port}"), "node-secret"),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await asyncio.wait_for(second_session_has_buffered.wait(), timeout=15)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=5)

    assert headers[:2] == ["Bearer node-secret", "Bearer node-secret"]
    first, second = sessions[0], sessions[1]
    assert first[0]["type"] == "hello" and second[0]["type"] == "hello"
    assert {"heartbeat", "telemetry"} <= {f["type"] for f in first}
    assert all(not f["buffered"] for f in first if f["type"] == "telemetry")
    buffered = [f for f in second if f["type"] == "telemetry" and f["buffered"]]
    assert buffered
    assert all(f["sampled_at"] < f["sent_at"] for f in buffered)


async def test_a_failing_sample_costs_one_frame_not_the_agent(tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    real_sample = agent.backend.sample

    def broken() -> list:
        raise RuntimeError("driver went away")

    agent.backend.sample = broken
    clock.now += 1.0
    await agent.tick()
    agent.backend.sample = real_sample
    clock.now += 1.0
    await agent.tick()

    assert "sampling the devices failed" in caplog.text
    assert connector.connections[0].types().count("telemetry") == 2
    assert agent.connected


# --- the durable report outbox --------------------------------------------------------------------------------


def _statuses(connection: FakeConnection) -> list[dict]:
    return [frame for frame in connection.sent if frame["type"] == "workload.status"]


async def _run_to_end(agent: Agent, job_id: int) -> None:
    for _ in range(400):
        agent.runner.poll()
        if not agent.runner.records[(job_id, 0)].active:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the workload did not end")


async def test_a_report_is_resent_until_the_portal_acks_it(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock, report_resend_s=5.0)
    await agent.tick()
    connection = connector.connections[0]
    agent.runner.start(
        protocol.WorkloadStart(command_id=1, job_id=3, replica=0, command=[sys.executable, "-c", "import time"])
    )
    await _run_to_end(agent, 3)

    await agent.tick()
    first = [(f["report_id"], f["state"]) for f in _statuses(connection)]
    assert [state for _id, state in first] == ["running", "succeeded"]
    assert first[0][0] < first[1][0]
    clock.now += 2.0
    await agent.tick()
    assert len(_statuses(connection)) == 2  # not yet due again
    clock.now += 3.0
    await agent.tick()
    assert [(f["report_id"], f["state"]) for f in _statuses(connection)[2:]] == first  # unacked: sent again

    connection.inbox.append(protocol.encode(protocol.ReportAck(report_id=first[0][0])))
    connection.inbox.append(protocol.encode(protocol.ReportAck(report_id=first[1][0], ok=False, code="x")))
    clock.now += 1.0
    await agent.tick()
    clock.now += 10.0
    await agent.tick()
    assert len(_statuses(connection)) == 4  # acked (even refused for good): never sent again
    assert len(agent.runner.outbox) == 0


async def test_after_a_reconnect_the_hello_lists_finished_unacked_workloads_and_their_reports_follow(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    agent.runner.start(
        protocol.WorkloadStart(command_id=1, job_id=3, replica=0, command=[sys.executable, "-c", "import sys"])
    )
    agent.runner.start(
        protocol.WorkloadStart(
            command_id=2, job_id=4, replica=0, command=[sys.executable, "-c", "import time; time.sleep(30)"]
        )
    )
    await _run_to_end(agent, 3)
    await agent.tick()
    first = connector.connections[0]
    sent = {(f["job_id"], f["state"]): f["report_id"] for f in _statuses(first)}
    for key in ((3, "running"), (4, "running")):  # the portal acked these; the final one was lost in transit
        first.inbox.append(protocol.encode(protocol.ReportAck(report_id=sent[key])))
    await agent.tick()
    first.drop()

    clock.now += 0.5
    await agent.tick()  # notices the drop
    clock.now += 2.0
    await agent.tick()  # reconnects

    second = connector.connections[1]
    hello = protocol.from_dict(second.sent[0])
    assert hello.workloads_complete is True
    assert sorted((w.job_id, w.state) for w in hello.workloads) == [(3, "succeeded"), (4, "running")]
    assert [(f["job_id"], f["state"], f["report_id"]) for f in _statuses(second)] == [
        (3, "succeeded", sent[(3, "succeeded")])
    ]


async def test_a_start_with_a_bad_env_key_is_nacked_and_reported_failed_through_the_outbox(tmp_path: Path) -> None:
    clock = FakeClock()
    connector = FakeConnector()
    agent = _agent(tmp_path, connector, clock)
    await agent.tick()
    connection = connector.connections[0]
    bad = protocol.WorkloadStart(command_id=6, job_id=9, replica=0, command=["true"], env={"A=B": "1"})
    connection.inbox.append(protocol.encode(bad))

    await agent.tick()

    ack = next(f for f in connection.sent if f["type"] == "ack")
    [status] = _statuses(connection)
    assert ack["ok"] is False and "'A=B' is not valid" in ack["error"]
    assert (status["job_id"], status["state"]) == (9, "failed") and "'A=B'" in status["message"]
    assert status["report_id"] in {s.report_id for s in agent.runner.outbox}
