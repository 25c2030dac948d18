"""Fixtures and helpers of the fleet tests: registered nodes, agent and browser sockets on the real ASGI app."""

from __future__ import annotations

import json
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from nodeagent import protocol
from scheduler.fleet.runtime import fleet_process
from scheduler.fleet.services.enrolment import agent_register, bootstrap_token_create
from tests.patching import patch_imported


@pytest.fixture(autouse=True)
def fleet_isolation(settings, monkeypatch) -> list[int]:
    """A private Redis key prefix for latest values, and scheduling-cycle requests recorded instead of queued.

    Returns the list the requests are recorded in.
    """
    settings.GPUPOOL_TELEMETRY_KEY_PREFIX = f"test-fleet-{uuid.uuid4().hex[:10]}"
    requests: list[int] = []
    patch_imported(
        monkeypatch, "scheduler.fleet.services.notify.cycle_request_after_commit", lambda: requests.append(1)
    )
    return requests


def register_node(name: str | None = None):
    """A node registered through the services: (node, credential string)."""
    _token, secret = bootstrap_token_create(actor=None, ttl_s=600)
    return agent_register(
        token=secret, node_name=name or f"node-{uuid.uuid4().hex[:8]}", hostname="host", agent_version="1.0"
    )


def hello(node_name: str, *, devices: int = 2, prefix: str | None = None, model: str = "NVIDIA H100 80GB HBM3"):
    prefix = prefix or f"GPU-{node_name}"
    return protocol.Hello(
        node_name=node_name,
        agent_version="1.0",
        hostname=f"{node_name}.local",
        cpu_cores=32,
        memory_mib=256000,
        devices=[
            protocol.DeviceInfo(
                index=index, uuid=f"{prefix}-{index}", vendor="nvidia", model=model, memory_mib=81559, numa_node=0
            )
            for index in range(devices)
        ],
    )


def telemetry(uuids: list[str], *, utilization: float = 50.0, sent_at: str | None = None, **extra):
    samples = [
        protocol.DeviceSample(
            uuid=uuid_,
            utilization_pct=utilization,
            memory_used_mib=1000,
            memory_total_mib=81559,
            power_w=300.0,
            temperature_c=60.0,
            sm_clock_mhz=1980,
        )
        for uuid_ in uuids
    ]
    kwargs = {"sent_at": sent_at} if sent_at else {}
    return protocol.Telemetry(samples=samples, **kwargs, **extra)


def agent_socket(credential: str | None) -> WebsocketCommunicator:
    from portal.asgi import application

    headers = [(b"authorization", f"Bearer {credential}".encode())] if credential is not None else []
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


async def connect_agent(credential: str, node_name: str | None = None, **hello_kwargs) -> WebsocketCommunicator:
    """An agent socket that is connected, got its config frame and (when ``node_name``) said hello."""
    socket = agent_socket(credential)
    connected, _ = await socket.connect()
    assert connected
    config = json.loads(await socket.receive_from())
    assert config["type"] == "config"
    if node_name is not None:
        await socket.send_to(text_data=protocol.encode(hello(node_name, **hello_kwargs)))
        await settle(socket)
    return socket


async def settle(socket: WebsocketCommunicator) -> None:
    """Wait until the consumer has handled everything sent so far (it handles frames in order)."""
    # An invalid frame is answered with an error frame after the frames before it were processed.
    await socket.send_to(text_data='{"v": 1, "type": "settle", "id": "settle"}')
    while True:
        frame = json.loads(await socket.receive_from(timeout=10))
        if frame.get("type") == "error" and frame.get("ref_id") == "settle":
            await fleet_process().settled()  # and the minutes it handed to the process are written
            return


async def browser_socket(user) -> WebsocketCommunicator:
    from portal.asgi import application

    def session_cookie() -> str:
        client = Client()
        client.force_login(user)
        return client.cookies["sessionid"].value

    cookie = await sync_to_async(session_cookie)()
    headers = [(b"host", b"testserver"), (b"origin", b"http://testserver"), (b"cookie", f"sessionid={cookie}".encode())]
    return WebsocketCommunicator(application, "/ws/telemetry/", headers=headers)
