"""Nothing lost between agent and portal: reports applied exactly once and acked, retried when the database
could not take them, hello reconciled both ways, and a workload that cannot start ends its job ``failed``.

Most tests drive the real ``nodeagent.agent.Agent`` (its real workload runner and durable outbox, real
processes) against the real ``/ws/agent/`` consumer and services on the test database, through an adapter
that carries the agent's frames over a channels ``WebsocketCommunicator`` and can cut the link at a chosen
frame. The others speak the protocol on a bare socket.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import OperationalError

from kernel.api import ConflictError
from nodeagent import protocol
from nodeagent.agent import Agent, AgentSettings, ConnectionLost
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.workloads import WorkloadRunner
from scheduler.fleet.models import AgentCommand, AgentReport, Device
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Allocation, Job, JobEvent, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tests.fleet.conftest import agent_socket, connect_agent, hello, register_node
from tests.patching import patch_request_cycle
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

db = database_sync_to_async


@pytest.fixture(autouse=True)
def _scheduling(settings, monkeypatch) -> None:
    # Placement, not quotas, is what these tests are about; cycles are run by the tests themselves.
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: False)


# --- helpers: jobs placed by a real cycle ---------------------------------------------------------------------


def submit_and_place(node_name: str, *, command: list[str] | None = None, env: dict | None = None) -> int:
    """A one-card job of a new tenant, placed on ``node_name`` by a scheduling cycle. ``env`` is written
    through the ORM, around submit-time validation (as a job from before it, or an older portal, would be)."""
    flavor = Device.objects.filter(node__name=node_name).select_related("flavor").first().flavor.name
    tenant = TenantFactory()
    user = UserFactory()
    MembershipFactory(user=user, tenant=tenant, role="member")
    spec = {"name": "t", "tenant": tenant.slug, "resources": {"flavors": [flavor], "gpus": 1}}
    job = job_submit(actor=user, spec={**spec, "command": command or ["true"]})
    if env is not None:
        Job.objects.filter(pk=job.pk).update(env=env)
    placed = run_cycle().placed
    assert job.pk in placed, f"job {job.pk} was not placed: {Job.objects.get(pk=job.pk).pending_message}"
    return job.pk


def job_state(job_id: int) -> str:
    return Job.objects.get(pk=job_id).state


def transitions(job_id: int, to_state: str) -> int:
    return JobEvent.objects.filter(job_id=job_id, to_state=to_state).count()


# --- the real agent over a channels communicator ---------------------------------------------------------------


class CommunicatorConnection:
    """The agent's ``Connection`` over a ``WebsocketCommunicator`` to the real consumer.

    ``cut_after`` (a predicate on an outgoing frame) cuts the link right after that frame, either before the
    portal reads it (``portal_reads=False``) or after the portal has answered it but before the answer reaches
    the agent (the ack lost in transit).
    """

    def __init__(self, communicator, *, cut_after: Callable[[dict], bool] | None, portal_reads: bool) -> None:
        self.communicator = communicator
        self.cut_after = cut_after
        self.portal_reads = portal_reads
        self.sent: list[dict] = []
        self.received_frames: list[dict] = []
        self.dropped: list[dict] = []
        self._closed = False
        self.close_code: int | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, text: str) -> None:
        if self._closed:
            raise ConnectionLost("cut")
        frame = json.loads(text)
        self.sent.append(frame)
        if self.cut_after is not None and self.cut_after(frame):
            if self.portal_reads:
                await self.communicator.send_to(text_data=text)
                await self._drop_until_answered(frame)
            await self.cut()
            return
        await self.communicator.send_to(text_data=text)

    async def ping(self, on_pong: Callable[[], None]) -> None:
        if self._closed:
            raise ConnectionLost("cut")
        on_pong()  # the communicator has no WebSocket pings; the portal read the frames before it

    async def _drop_until_answered(self, frame: dict) -> None:
        """Read (and lose) what the portal sends until its answer to ``frame``: the portal did its part."""
        deadline = time.monotonic() + 15
        while True:
            event = await asyncio.wait_for(self.communicator.output_queue.get(), max(0.1, deadline - time.monotonic()))
            if event["type"] != "websocket.send":
                continue
            answer = json.loads(event["text"])
            self.dropped.append(answer)
            if answer.get("report_id") == frame.get("report_id") or answer.get("ref_id") == frame["id"]:
                return

    async def cut(self) -> None:
        self._closed = True
        self.close_code = 1006
        await self.communicator.disconnect()

    def received(self) -> list[str]:
        texts = []
        queue = self.communicator.output_queue
        while not queue.empty():
            event = queue.get_nowait()
            if event["type"] == "websocket.send":
                texts.append(event["text"])
                self.received_frames.append(json.loads(event["text"]))
            elif event["type"] == "websocket.close":
                self._closed = True
                self.close_code = event.get("code")
        return texts

    async def wait(self, timeout_s: float) -> None:
        await asyncio.sleep(0)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.communicator.disconnect()


class Link:
    """Hands the agent a fresh connection to the portal each time it connects (a test may set one to be cut)."""

    def __init__(self, credential: str) -> None:
        self.credential = credential
        self.connections: list[CommunicatorConnection] = []

    async def __call__(self) -> CommunicatorConnection:
        communicator = agent_socket(self.credential)
        connected, _ = await communicator.connect()
        assert connected
        self.connections.append(CommunicatorConnection(communicator, cut_after=None, portal_reads=True))
        return self.connections[-1]

    async def close(self) -> None:
        for connection in self.connections:
            await connection.close()


def real_agent(tmp_path: Path, node_name: str, link: Link, *, cards: int = 1) -> Agent:
    return Agent(
        settings=AgentSettings(
            node_name=node_name, backoff_base_s=0.05, backoff_cap_s=0.1, stop_workloads_on_exit=True
        ),
        backend=SimulatedBackend(node_name=node_name, cards=cards),
        runner=WorkloadRunner(work_dir=tmp_path / "work"),
        connector=link,
        rng=random.Random(1),
    )


async def drive(agent: Agent, until: Callable[[], Any], *, what: str, timeout_s: float = 30) -> None:
    """Tick the agent (and let the consumer run) until ``until()`` — run on the database thread — is true."""
    deadline = time.monotonic() + timeout_s
    while not await db(until)():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await agent.tick()
        await asyncio.sleep(0.05)


async def stop_agent(agent: Agent, link: Link) -> None:
    agent.runner.close(stop_workloads=True)
    await link.close()


@pytest.mark.parametrize("portal_reads", [True, False], ids=["ack-lost", "report-lost"])
async def test_a_report_lost_in_transit_is_applied_exactly_once_after_the_reconnect(tmp_path, portal_reads):
    _node, credential = await db(register_node)("gpu-lost")
    link = Link(credential)
    agent = real_agent(tmp_path, "gpu-lost", link)
    await drive(agent, lambda: Device.objects.filter(node__name="gpu-lost").exists(), what="the hello")
    job_id = await db(submit_and_place)("gpu-lost", command=[sys.executable, "-c", "import time; time.sleep(0.5)"])
    await drive(agent, lambda: job_state(job_id) == JobState.RUNNING, what="the job running")

    # The link dies right after the agent sends "succeeded": before the portal reads it, or after the portal
    # applied it and answered, with the answer (the ack) lost.
    first = link.connections[0]
    first.portal_reads = portal_reads
    first.cut_after = lambda frame: frame.get("type") == "workload.status" and frame.get("state") == "succeeded"
    await drive(agent, lambda: len(link.connections) >= 2 and job_state(job_id) == JobState.SUCCEEDED, what="done")
    await drive(agent, lambda: not list(agent.runner.outbox), what="the outbox to empty")
    await stop_agent(agent, link)

    [report] = [f for f in first.sent if f["type"] == "workload.status" and f["state"] == "succeeded"]
    second = link.connections[1]
    resent = [f for f in second.sent if f["type"] == "workload.status" and f["state"] == "succeeded"]
    assert [f["report_id"] for f in resent] == [report["report_id"]]  # the same report, sent again
    assert second.sent.index(resent[0]) > 0 and second.sent[0]["type"] == "hello"
    [ack] = [f for f in second.received_frames if f["type"] == "report.ack" and f["report_id"] == report["report_id"]]
    assert ack["ok"] is True
    assert ack["code"] == ("duplicate" if portal_reads else "")
    if portal_reads:
        assert [f["type"] for f in first.dropped][-1] == "report.ack"
    assert await db(transitions)(job_id, JobState.SUCCEEDED) == 1
    assert await db(lambda: AgentReport.objects.filter(report_id=report["report_id"]).count())() == 1
    job = await db(Job.objects.get)(pk=job_id)
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)
    assert not await db(Allocation.objects.active().filter(job_id=job_id).exists)()


async def test_a_workload_with_a_bad_env_key_fails_its_job_and_frees_the_card_for_the_next_cycle(tmp_path):
    _node, credential = await db(register_node)("gpu-env")
    link = Link(credential)
    agent = real_agent(tmp_path, "gpu-env", link, cards=1)
    await drive(agent, lambda: Device.objects.filter(node__name="gpu-env").exists(), what="the hello")
    job_id = await db(submit_and_place)("gpu-env", env={"A=B": "1"})

    await drive(agent, lambda: job_state(job_id) == JobState.FAILED, what="the bad-env job to fail")
    await drive(agent, lambda: not list(agent.runner.outbox), what="the failed report to be acked")

    job = await db(Job.objects.get)(pk=job_id)
    assert "'A=B' is not valid" in job.state_message
    assert await db(transitions)(job_id, JobState.FAILED) == 1
    allocation = await db(Allocation.objects.get)(job_id=job_id)
    assert allocation.ended_at is not None
    start = await db(AgentCommand.objects.get)(job_id=job_id, command_type="workload.start")
    assert start.acked_at is not None and start.ack_ok is False and "A=B" in start.error
    # The only card is free: the next cycle places the next job on it, and that one runs to the end.
    next_id = await db(submit_and_place)("gpu-env", command=[sys.executable, "-c", "pass"])
    following = await db(Allocation.objects.get)(job_id=next_id)
    assert following.device_id == allocation.device_id
    await drive(agent, lambda: job_state(next_id) == JobState.SUCCEEDED, what="the next job to succeed")
    await stop_agent(agent, link)


# --- the protocol on a bare socket -----------------------------------------------------------------------------


async def frames_until(socket, predicate: Callable[[dict], bool], *, timeout_s: float = 10) -> list[dict]:
    """Frames the portal sends, up to and including the first one matching ``predicate``."""
    frames = []
    while True:
        frame = json.loads(await socket.receive_from(timeout=timeout_s))
        frames.append(frame)
        if predicate(frame):
            return frames


def report_answer(report_id: int) -> Callable[[dict], bool]:
    return lambda frame: frame.get("report_id") == report_id or frame.get("ref_id") == f"report-{report_id}"


def status(job_id: int, state: str, report_id: int, **fields) -> str:
    message = protocol.WorkloadStatus(job_id=job_id, replica=0, state=state, report_id=report_id, **fields)
    message.id = f"report-{report_id}"
    return protocol.encode(message)


async def placed_on_socket(name: str, *, devices: int = 1):
    """A node connected through a bare socket, with one job placed on it and its start command acked."""
    _node, credential = await db(register_node)(name)
    socket = await connect_agent(credential, name, devices=devices)
    job_id = await db(submit_and_place)(name)
    start = await frames_until(socket, lambda frame: frame["type"] == "workload.start")
    await socket.send_to(text_data=protocol.encode(protocol.Ack(command_id=start[-1]["command_id"])))
    return socket, credential, job_id


async def test_a_duplicate_report_is_acked_and_changes_nothing():
    socket, _credential, job_id = await placed_on_socket("gpu-dup")

    await socket.send_to(text_data=status(job_id, "running", 101))
    first = (await frames_until(socket, report_answer(101)))[-1]
    await socket.send_to(text_data=status(job_id, "running", 101))  # the same report again: its ack was lost
    again = (await frames_until(socket, report_answer(101)))[-1]
    await socket.send_to(text_data=status(job_id, "running", 102))  # a new report of a state already applied
    same_state = (await frames_until(socket, report_answer(102)))[-1]
    await socket.disconnect()

    assert (first["type"], first["ok"], first["code"]) == ("report.ack", True, "")
    assert (again["type"], again["ok"], again["code"]) == ("report.ack", True, "duplicate")
    assert (same_state["ok"], same_state["code"]) == (True, "")
    assert await db(transitions)(job_id, JobState.RUNNING) == 1
    assert await db(job_state)(job_id) == JobState.RUNNING
    assert await db(AgentReport.objects.filter(report_id__in=[101, 102]).count)() == 2


async def test_a_report_the_database_could_not_take_is_not_acked_and_applies_when_resent(monkeypatch):
    socket, _credential, job_id = await placed_on_socket("gpu-retry")
    real = workload_status_report
    calls = []

    def deadlocked_once(**kwargs):
        calls.append(kwargs["state"])
        if len(calls) == 1:
            raise OperationalError("deadlock detected")
        return real(**kwargs)

    monkeypatch.setattr("scheduler.fleet.services.agent_commands.workload_status_report", deadlocked_once)
    await socket.send_to(text_data=status(job_id, "succeeded", 201, exit_code=0))
    refused = (await frames_until(socket, report_answer(201)))[-1]
    assert (refused["type"], refused["code"]) == ("error", "retry_later")
    assert await db(job_state)(job_id) == JobState.ADMITTED
    assert not await db(AgentReport.objects.filter(report_id=201).exists)()

    await socket.send_to(text_data=status(job_id, "succeeded", 201, exit_code=0))
    acked = (await frames_until(socket, report_answer(201)))[-1]
    await socket.disconnect()
    assert (acked["type"], acked["ok"]) == ("report.ack", True)
    assert await db(job_state)(job_id) == JobState.SUCCEEDED
    assert await db(transitions)(job_id, JobState.SUCCEEDED) == 1


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConflictError("Job 1 is succeeded.", code="invalid_transition"), "invalid_transition"),
        (KeyError("x"), "internal_error"),
    ],
)
async def test_a_report_refused_for_good_is_acked_with_the_error_code(monkeypatch, caplog, error, code):
    socket, _credential, job_id = await placed_on_socket("gpu-refused")

    def refuse(**kwargs):
        raise error

    monkeypatch.setattr("scheduler.fleet.services.agent_commands.workload_status_report", refuse)
    await socket.send_to(text_data=status(job_id, "failed", 301, exit_code=1))
    ack = (await frames_until(socket, report_answer(301)))[-1]
    await socket.disconnect()

    assert (ack["type"], ack["ok"], ack["code"]) == ("report.ack", False, code)
    assert ack["detail"]
    assert "report 301" in caplog.text  # logged, not silently dropped


async def test_reports_of_agents_before_the_outbox_are_applied_without_an_ack():
    socket, _credential, job_id = await placed_on_socket("gpu-old")
    await socket.send_to(text_data=protocol.encode(protocol.WorkloadStatus(job_id=job_id, replica=0, state="running")))
    await socket.send_to(text_data='{"v": 1, "type": "settle", "id": "settle"}')
    frames = await frames_until(socket, lambda frame: frame.get("ref_id") == "settle")
    await socket.disconnect()
    assert not [f for f in frames if f["type"] == "report.ack"]
    assert await db(job_state)(job_id) == JobState.RUNNING


async def test_hello_requeues_a_job_the_agent_no_longer_has_and_keeps_one_whose_start_is_on_its_way():
    socket, credential, lost_id = await placed_on_socket("gpu-drift", devices=2)
    await socket.send_to(text_data=status(lost_id, "running", 401))
    await frames_until(socket, report_answer(401))
    await socket.disconnect()
    # Placed while the agent was away: its start command is not acked yet.
    coming_id = await db(submit_and_place)("gpu-drift")

    # An agent from before the outbox lists running workloads only: nothing is requeued for its silence.
    old = await connect_agent(credential)
    await old.send_to(text_data=protocol.encode(hello("gpu-drift", devices=2)))
    await frames_until(old, lambda frame: frame["type"] == "workload.start")
    await old.disconnect()
    assert await db(job_state)(lost_id) == JobState.RUNNING

    # The agent came back with a wiped work dir: it knows no workload, and says its list is complete.
    socket = await connect_agent(credential)
    bare = hello("gpu-drift", devices=2)
    bare.workloads_complete = True
    await socket.send_to(text_data=protocol.encode(bare))
    start = await frames_until(socket, lambda frame: frame["type"] == "workload.start")
    await socket.disconnect()

    assert start[-1]["job_id"] == coming_id  # still sent: it was on its way, not lost
    lost = await db(Job.objects.get)(pk=lost_id)
    assert lost.state == JobState.QUEUED
    assert "reconnected without this job's workload" in lost.state_message
    events = await db(lambda: list(JobEvent.objects.filter(job_id=lost_id).values_list("to_state", "reason")))()
    assert events[-2:] == [(JobState.NODE_LOST, "workload_missing"), (JobState.QUEUED, "workload_missing")]
    assert not await db(Allocation.objects.active().filter(job_id=lost_id).exists)()
    assert await db(job_state)(coming_id) == JobState.ADMITTED


async def test_hello_stops_workloads_the_node_should_not_run():
    socket, credential, job_id = await placed_on_socket("gpu-stray")
    await socket.send_to(text_data=status(job_id, "succeeded", 501, exit_code=0))
    await frames_until(socket, report_answer(501))
    await socket.disconnect()

    # The agent still runs the finished job (its stop was lost with an old state file) and a job id the portal
    # never had.
    socket = await connect_agent(credential)
    message = hello("gpu-stray", devices=1)
    message.workloads_complete = True
    message.workloads = [
        protocol.RunningWorkload(job_id=job_id, replica=0, pid=10, state="running"),
        protocol.RunningWorkload(job_id=987654, replica=0, pid=11, state="running"),
    ]
    await socket.send_to(text_data=protocol.encode(message))
    stops = []
    while len(stops) < 2:
        frame = (await frames_until(socket, lambda frame: frame["type"] == "workload.stop"))[-1]
        if (frame["job_id"], frame["replica"]) not in {(s["job_id"], s["replica"]) for s in stops}:
            stops.append(frame)
    await socket.disconnect()

    assert sorted((s["job_id"], s["reason"]) for s in stops) == [(job_id, "not_allocated"), (987654, "unknown_job")]
    assert await db(job_state)(job_id) == JobState.SUCCEEDED
    assert await db(transitions)(job_id, JobState.SUCCEEDED) == 1
