"""Real ``gpupool serve`` processes on the test database and the test Redis, for the tests of the web tier:
one with several workers (``test_serve.py``), or several single ones on their own ports, as web processes on
several hosts behind the proxy (``test_scale_out.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import database_url, skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(connection: socket.socket, path: str) -> int:
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


Served = tuple[subprocess.Popen, int, Path]  # the process, its port, its log


@contextlib.contextmanager
def web_processes(tmp_path: Path, *, count: int, workers: int = 1) -> Iterator[list[Served]]:
    """``count`` ``gpupool serve`` processes (each with ``workers`` workers) on their own ports, sharing the test
    database, Redis and one channel prefix, as one deployment's web processes do; ``(process, port, log)`` each,
    once every one answers. Killed (process group) on the way out, whatever the test did."""
    if not (settings.IS_POSTGRES and settings.REDIS_URL):
        skip_or_fail("gpupool serve needs PostgreSQL and Redis (GPUPOOL_DATABASE_URL, GPUPOOL_REDIS_URL)")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "GPUPOOL_DATABASE_URL": database_url(),
        "GPUPOOL_REDIS_URL": settings.REDIS_URL,
        "GPUPOOL_CHANNELS_PREFIX": f"test-serve-{uuid.uuid4().hex[:6]}",
        "GPUPOOL_DATA_DIR": str(tmp_path),
        "GPUPOOL_AUDIT_WITNESS_PATH": str(tmp_path / "witness.jsonl"),
        "GPUPOOL_LOG_LEVEL": "WARNING",
        "GPUPOOL_ALLOWED_HOSTS": "127.0.0.1",
    }
    started: list[Served] = []
    logs = []
    try:
        for index in range(count):
            port = free_port()
            log_path = tmp_path / ("serve.log" if count == 1 else f"serve-{index}.log")
            log = open(log_path, "wb")
            logs.append(log)
            command = ["serve", "--workers", str(workers), "--host", "127.0.0.1", "--port", str(port)]
            process = subprocess.Popen(
                [sys.executable, "-m", "portal.cli", *command],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            started.append((process, port, log_path))
        for process, port, log_path in started:
            _wait_listening(process, port, log_path)
        yield started
    finally:
        for process, _port, _log in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        for log in logs:
            log.close()


def _wait_listening(process: subprocess.Popen, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"gpupool serve exited with {process.returncode}:\n{log_path.read_text(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as probe:
                if get(probe, "/accounts/login/") == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"gpupool serve did not answer within {START_TIMEOUT_S} s:\n{log_path.read_text(errors='replace')}")
