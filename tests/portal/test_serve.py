"""``gpupool serve``: several uvicorn web processes on PostgreSQL and Redis, each of them answering HTTP and
agent WebSockets, and a clean stop on SIGTERM; embedded mode (and daphne) refuse more than one process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from portal.server import WS_MAX_MESSAGE_BYTES
from tests.portal.web_processes import get, web_processes


def _children(pid: int) -> set[int]:
    try:
        raw = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(child) for child in raw.split()}


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _server_socket_inode(server_port: int, client_port: int) -> str | None:
    """The inode of the accepted (server-side) socket of the loopback connection from ``client_port``."""
    wanted_local = f"0100007F:{server_port:04X}"
    wanted_remote = f"0100007F:{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == wanted_local and fields[2] == wanted_remote:
            return fields[9]
    return None


def _owner(pids: set[int], inode: str) -> int | None:
    """Which of ``pids`` holds the socket ``inode`` open."""
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return pid
            except OSError:
                continue
    return None


@pytest.fixture
def served(transactional_db, tmp_path):
    """``gpupool serve --workers 2`` on the test database and the test Redis (own channel prefix)."""
    with web_processes(tmp_path, count=1, workers=2) as [(process, port, log_path)]:
        yield process, port, log_path


async def _agent_socket(port: int, credential: str) -> tuple[dict, int | None]:
    """The first frame a registered agent gets, and the close code after it sends a message over 1 MiB."""
    import websockets

    async with websockets.connect(
        f"ws://127.0.0.1:{port}/ws/agent/",
        additional_headers={"Authorization": f"Bearer {credential}"},
        max_size=None,
    ) as ws:
        config = json.loads(await asyncio.wait_for(ws.recv(), timeout=20))
        await ws.send("x" * (WS_MAX_MESSAGE_BYTES + 1))
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), timeout=20)
        return config, ws.close_code


@pytest.mark.services
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_serve_with_two_workers_answers_from_two_processes_and_stops_cleanly(served):
    from scheduler.fleet.services.enrolment import agent_register, bootstrap_token_create

    process, port, log_path = served
    workers = _children(process.pid)
    assert len(workers) >= 2, f"expected 2 web worker processes under {process.pid}, found {workers}"

    # Every new connection is accepted by whichever worker gets to it first; keep each one open (a keep-alive
    # connection stays with its worker) until both workers have answered one.
    answered_by: dict[int, int] = {}
    connections = []
    try:
        deadline = time.monotonic() + 60
        while len(set(answered_by.values())) < 2 and time.monotonic() < deadline and len(connections) < 300:
            connection = socket.create_connection(("127.0.0.1", port), timeout=20)
            connections.append(connection)
            assert get(connection, "/accounts/login/") == 200
            inode = _server_socket_inode(port, connection.getsockname()[1])
            owner = _owner(workers, inode) if inode else None
            if owner is not None:
                answered_by[connection.getsockname()[1]] = owner
            time.sleep(0.01)
    finally:
        for connection in connections:
            connection.close()
    assert len(set(answered_by.values())) == 2, (
        f"only {set(answered_by.values())} of the workers {workers} answered {len(connections)} connections"
    )

    # WebSockets too: a registered agent's socket gets its config frame from a worker process, and a message
    # over 1 MiB is refused by the server (close 1009: message too big), as daphne refused it.
    _row, bootstrap = bootstrap_token_create(actor=None, ttl_s=600)
    _node, credential = agent_register(token=bootstrap, node_name=f"serve-{uuid.uuid4().hex[:6]}")
    frame, close_code = asyncio.run(_agent_socket(port, credential))
    assert frame["type"] == "config", frame
    assert close_code == 1009, close_code

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0, log_path.read_text(errors="replace")
    # The workers (and multiprocessing's resource tracker) end with their supervisor, within moments.
    deadline = time.monotonic() + 10
    while (alive := {pid for pid in workers if _running(pid)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"processes {alive} of the web tier outlived its supervisor"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert "gpupool web stopped" in log_path.read_text(errors="replace")


def test_serve_refuses_several_processes_in_embedded_mode():
    with override_settings(EMBEDDED_MODE=True), pytest.raises(CommandError, match="GPUPOOL_REDIS_URL"):
        call_command("serve", "--workers", "2")


def test_serve_refuses_several_daphne_processes():
    with pytest.raises(CommandError, match="daphne serves from one process"):
        call_command("serve", "--server", "daphne", "--workers", "2")


def test_demo_refuses_several_web_processes_in_embedded_mode():
    with override_settings(EMBEDDED_MODE=True), pytest.raises(CommandError, match="embedded mode"):
        call_command("demo", "--workers", "2", "--agents", "0", "--no-migrate")
