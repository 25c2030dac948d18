"""The web tier scaled out: two ``gpupool serve`` processes on their own ports, as web processes on two hosts
behind the proxy, with agents and browsers spread over them. Whichever process an agent and a browser reach,
the browser sees the agent's telemetry live, and either process answers ``/metrics`` for the whole fleet: the
frames cross through the Redis channel layer, the watched groups and the latest values through Redis too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import pytest
from django.test import Client

from nodeagent import protocol
from tests.factories import SystemAdminFactory
from tests.fleet.conftest import hello, register_node, telemetry
from tests.portal.web_processes import web_processes

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DEADLINE_S = 45


async def _agent(port: int, credential: str, node_name: str, utilization: float, stop: asyncio.Event) -> None:
    """An agent on ``port``: hello with two cards, then a telemetry frame every 0.3 s until ``stop``."""
    import websockets

    async with websockets.connect(
        f"ws://127.0.0.1:{port}/ws/agent/", additional_headers={"Authorization": f"Bearer {credential}"}
    ) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), timeout=20))["type"] == "config"
        await ws.send(protocol.encode(hello(node_name)))

        async def drain() -> None:
            async for _frame in ws:
                pass

        drainer = asyncio.ensure_future(drain())
        try:
            uuids = [f"GPU-{node_name}-{index}" for index in range(2)]
            while not stop.is_set():
                await ws.send(protocol.encode(telemetry(uuids, utilization=utilization)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.3)
        finally:
            drainer.cancel()


async def _browser(port: int, cookie: str, node_id: int) -> dict:
    """A system admin's telemetry socket on ``port`` watching ``node_id``: its first live frame of that node."""
    import websockets

    async with websockets.connect(
        f"ws://127.0.0.1:{port}/ws/telemetry/",
        additional_headers={"Cookie": f"sessionid={cookie}"},
        origin=f"http://127.0.0.1:{port}",
    ) as ws:
        await ws.send(json.dumps({"subscribe": {"node": node_id}}))
        while True:
            frame = json.loads(await ws.recv())
            if frame.get("type") != "telemetry":
                continue
            for entry in frame["nodes"]:
                if entry["node"] == node_id and entry.get("sent_at"):  # live, not the snapshot on subscribe
                    return entry


async def _exchange(ports: tuple[int, int], agents: list[tuple[str, str, int]], cookie: str) -> list[dict]:
    """Agent i on process i, its watcher on the other process; what each watcher saw of its node. The agents
    keep sending until both processes' ``/metrics`` show every card (the latest values are written behind the
    sockets' backs, a moment after the frame went out to the watchers)."""
    stop = asyncio.Event()
    senders = [
        asyncio.ensure_future(_agent(ports[index], credential, name, 11.0 * (index + 1), stop))
        for index, (name, credential, _node_id) in enumerate(agents)
    ]
    try:
        watchers = [_browser(ports[1 - index], cookie, node_id) for index, (_n, _c, node_id) in enumerate(agents)]
        seen = await asyncio.wait_for(asyncio.gather(*watchers), timeout=DEADLINE_S)
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        for port in ports:
            while len(_utilization(await asyncio.to_thread(_metrics, port, cookie))) < 4:
                assert asyncio.get_running_loop().time() < deadline, "the latest values never reached /metrics"
                await asyncio.sleep(0.3)
        return seen
    finally:
        stop.set()
        await asyncio.gather(*senders, return_exceptions=True)


def _utilization(text: str) -> dict[str, float]:
    """``DCGM_FI_DEV_GPU_UTIL`` per card (UUID label) of a ``/metrics`` answer."""
    values = {}
    for line in text.splitlines():
        if line.startswith("DCGM_FI_DEV_GPU_UTIL{"):
            labels, value = line.rsplit(" ", 1)
            uuid = labels.split('UUID="', 1)[1].split('"', 1)[0]
            values[uuid] = float(value)
    return values


def _metrics(port: int, cookie: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as connection:
        request = f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: sessionid={cookie}\r\nConnection: close\r\n\r\n"
        connection.sendall(request.encode())
        data = b""
        while chunk := connection.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split()[1] == b"200", head
    return body.decode()


def test_agents_and_browsers_on_different_web_processes_see_each_other(tmp_path):
    admin = SystemAdminFactory()
    client = Client()
    client.force_login(admin)
    cookie = client.cookies["sessionid"].value
    agents = []
    for _index in range(2):
        node, credential = register_node()
        agents.append((node.name, credential, node.pk))

    with web_processes(tmp_path, count=2) as [(_first, port_a, _log_a), (_second, port_b, _log_b)]:
        seen = asyncio.run(_exchange((port_a, port_b), agents, cookie))

        # The agent on process A is watched from process B, and the other way round.
        for (name, _credential, node_id), entry, utilization in zip(agents, seen, (11.0, 22.0), strict=True):
            assert entry["node"] == node_id
            assert entry["name"] == name
            assert {values["utilization_pct"] for values in entry["devices"].values()} == {utilization}
            assert set(entry["devices"]) == {f"GPU-{name}-0", f"GPU-{name}-1"}

        # Either process answers /metrics for the whole fleet: the latest values live in Redis, not in a process.
        expected = {
            f"GPU-{name}-{card}": utilization
            for (name, _credential, _node_id), utilization in zip(agents, (11.0, 22.0), strict=True)
            for card in range(2)
        }
        for port in (port_a, port_b):
            assert _utilization(_metrics(port, cookie)) == expected
