"""``gpupool serve``: several uvicorn web processes on PostgreSQL and Redis, each of them answering HTTP and
agent WebSockets, and a clean stop on SIGTERM; embedded mode (and daphne) refuse more than one process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from portal.server import WS_MAX_MESSAGE_BYTES
from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90


def _database_url() -> str:
    db = settings.DATABASES["default"]
    auth = quote(db.get("USER") or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    return f"postgres://{auth}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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


def _get(connection: socket.socket, path: str) -> int:
    """One keep-alive HTTP/1.1 GET on ``connection``; returns the status (the body is read and dropped)."""
    connection.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        assert chunk, "the server closed the connection before answering"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length:
        chunk = connection.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    return int(head.split()[1])


@pytest.fixture
def served(transactional_db, tmp_path):
    """``gpupool serve --workers 2`` on the test database and the test Redis (own channel prefix)."""
    if not (settings.IS_POSTGRES and settings.REDIS_URL):
        skip_or_fail("gpupool serve --workers 2 needs PostgreSQL and Redis (GPUPOOL_DATABASE_URL, GPUPOOL_REDIS_URL)")
    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "GPUPOOL_DATABASE_URL": _database_url(),
        "GPUPOOL_REDIS_URL": settings.REDIS_URL,
        "GPUPOOL_CHANNELS_PREFIX": f"test-serve-{uuid.uuid4().hex[:6]}",
        "GPUPOOL_DATA_DIR": str(tmp_path),
        "GPUPOOL_AUDIT_WITNESS_PATH": str(tmp_path / "witness.jsonl"),
        "GPUPOOL_LOG_LEVEL": "WARNING",
        "GPUPOOL_ALLOWED_HOSTS": "127.0.0.1",
    }
    log = open(tmp_path / "serve.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "portal.cli", "serve", "--workers", "2", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_listening(process, port, tmp_path / "serve.log")
        yield process, port, tmp_path / "serve.log"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()


def _wait_listening(process: subprocess.Popen, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"gpupool serve exited with {process.returncode}:\n{log_path.read_text(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as probe:
                if _get(probe, "/accounts/login/") == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"gpupool serve did not answer within {START_TIMEOUT_S} s:\n{log_path.read_text(errors='replace')}")


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
            assert _get(connection, "/accounts/login/") == 200
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
