"""A real daphne server on the test database: a short, bounded run of ``benchmarks/load.py``'s core (job-submission
API and telemetry WebSocket at the same time) must give no 5xx and store every accepted job exactly once; an
oversized agent frame on the real server is refused (WebSocket close 1009) and changes nothing.

The full-size run is ``benchmarks/load.py`` (README, "Security testing and load").
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid

import pytest
from django.conf import settings

from benchmarks import load
from benchmarks._agents import hello_frame
from nodeagent import protocol
from scheduler.fleet.models import Device, Node
from tests.conftest import database_url, skip_or_fail
from tests.security.conftest import assert_unchanged, state_fingerprint

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def daphne(tmp_path_factory):
    """daphne on a free loopback port, on the test database and the test Redis db (own channel prefix).

    Per test, so the server (and its late writes: disconnects, heartbeat batches) is gone before the test
    database is flushed."""
    if not (settings.IS_POSTGRES and settings.REDIS_URL):
        skip_or_fail("the load smoke test needs PostgreSQL and Redis (GPUPOOL_DATABASE_URL, GPUPOOL_REDIS_URL)")
    data_dir = tmp_path_factory.mktemp("daphne")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "GPUPOOL_DATABASE_URL": database_url(),
        "GPUPOOL_REDIS_URL": settings.REDIS_URL,
        "GPUPOOL_CHANNELS_PREFIX": f"test-load-{uuid.uuid4().hex[:6]}",
        "GPUPOOL_DATA_DIR": str(data_dir),
        "GPUPOOL_AUDIT_WITNESS_PATH": str(data_dir / "witness.jsonl"),
        "GPUPOOL_LOG_LEVEL": "ERROR",
        "GPUPOOL_ALLOWED_HOSTS": "127.0.0.1",
    }
    server, base = load.start_daphne(env)
    yield base
    load.stop_daphne(server)


def test_short_mixed_load_gives_no_5xx_and_every_job_exactly_once(daphne):
    plan = load.prepare(clients=4, subscribers=4, agents=2)
    stats = asyncio.run(load.run_load(daphne, plan, seconds=4.0, max_requests=400, warmup_s=1.0))
    print("\n".join(load.summary(stats)))
    assert stats.server_errors == 0, stats.statuses
    assert stats.transport_errors == 0, stats.http_errors
    assert stats.failed == 0, stats.statuses
    assert stats.statuses[201] >= 10 and stats.statuses[200] >= 1, "the load did not reach the API"
    assert not stats.ws_errors, stats.ws_errors
    assert stats.ws_messages >= 4 and stats.ws_latencies, "no telemetry reached the subscribers during the load"
    counts = load.job_counts(plan)
    assert counts == dict.fromkeys(stats.accepted, 1), "a job is missing, duplicated or stored without a 201"


def test_an_oversized_agent_frame_is_refused_by_the_real_server(daphne):
    import websockets

    plan = load.prepare(clients=0, subscribers=0, agents=1)
    [(node_id, name, credential)] = plan.agents
    ws_url = daphne.replace("http://", "ws://") + "/ws/agent/"

    async def scenario() -> tuple[int | None, dict]:
        headers = {"Authorization": f"Bearer {credential}"}
        async with websockets.connect(ws_url, additional_headers=headers) as ws:
            assert json.loads(await ws.recv())["type"] == "config"
            hello = json.loads(hello_frame(name, agent_version="load"))
            hello["devices"] = [{**hello["devices"][0], "model": "x" * (protocol.MAX_FRAME_BYTES + 1)}]
            await ws.send(json.dumps(hello))
            # daphne (autobahn) fails the connection: no answer, the socket is dropped (or closed with 1009).
            with pytest.raises(websockets.ConnectionClosedError) as closed:
                await asyncio.wait_for(ws.recv(), timeout=10)
            code = closed.value.rcvd.code if closed.value.rcvd else None
        # The node's next, normal connection still works.
        async with websockets.connect(ws_url, additional_headers=headers) as ws:
            assert json.loads(await ws.recv())["type"] == "config"
            await ws.send(json.dumps({"v": 1, "type": "nonsense", "id": "probe"}))
            answer = json.loads(await asyncio.wait_for(ws.recv(), timeout=10))
        return code, answer

    before = state_fingerprint()
    code, answer = asyncio.run(scenario())
    assert code in (None, 1009)  # refused by daphne's 1 MiB message limit, never processed
    assert answer["type"] == "error" and answer["code"] == "unknown_type"
    after = state_fingerprint()
    # Connecting updates the node's connection state; the oversized hello created no device and no inventory.
    assert not Device.objects.filter(node_id=node_id).exists()
    assert Node.objects.get(pk=node_id).status == "not_ready"
    for label in ("fleet.Device", "scheduler.Job", "tenants.Tenant", "tenants.ApiToken"):
        assert before[label] == after[label], label
    assert_unchanged(
        {k: v for k, v in before.items() if k.startswith("tenants.")},
        {k: v for k, v in after.items() if k.startswith("tenants.")},
        "oversized frame",
    )
