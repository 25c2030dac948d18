"""Fixtures of the fault tests: a real deployment in processes on the test database (see cluster.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.resilience.cluster import Cluster, database_url, free_port, wait_until


@pytest.fixture
def make_cluster(transactional_db, postgres, redis_url) -> Iterator[Callable[..., Cluster]]:
    """``make_cluster(settings={...}, redis=...)`` → a Cluster on the test database, stopped afterwards (every
    process it started, workloads included). Its files live in a temporary directory removed afterwards unless
    ``GPUPOOL_FAULTS_KEEP`` is set; a failed wait prints the log tails (``Cluster.describe``)."""
    clusters: list[Cluster] = []
    root = Path(tempfile.mkdtemp(prefix="gpupool-faults-"))

    def make(*, settings: dict[str, str] | None = None, redis: str | None = None) -> Cluster:
        cluster = Cluster(
            database_url=database_url(connection.settings_dict),
            redis_url=redis or redis_url,
            root=root / str(len(clusters)),
            settings=settings or {},
        )
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.stop()
        if os.environ.get("GPUPOOL_FAULTS_KEEP"):  # keep the processes' logs to read after a failure
            print(f"cluster files kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


class RedisServer:
    """A private ``redis-server`` on a free port that a test may restart (never the shared one)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.folder)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        import redis

        client = redis.Redis.from_url(self.url)

        def pong() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(pong, timeout_s=20, what=f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def private_redis(tmp_path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
