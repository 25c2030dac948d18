"""Fixtures of the fault tests: a real deployment in processes on the test database (see cluster.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.resilience.cluster import Cluster, RedisServer, database_url


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
