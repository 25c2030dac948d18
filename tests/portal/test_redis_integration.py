"""Round trips through the real Redis: a Celery task to a real worker process, and a WebSocket message
through the Redis channel layer."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from portal.celery import app as celery_app
from portal.consumers import EchoConsumer
from portal.tasks import echo

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.services


@pytest.fixture
def redis_worker(redis_url):
    """A real `celery worker` process consuming a queue private to this test."""
    queue = f"test-{uuid.uuid4().hex[:10]}"
    hostname = f"{queue}@%h"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "--pool",
            "solo",
            "-Q",
            queue,
            "--hostname",
            hostname,
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "WARNING",
        ],
        cwd=ROOT,
        env={**os.environ, "GPUPOOL_REDIS_URL": redis_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield queue
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def test_celery_task_round_trips_through_redis_to_a_real_worker(redis_worker):
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    token = uuid.uuid4().hex
    result = echo.apply_async(args=[token], queue=redis_worker)
    reply = result.get(timeout=60)
    assert reply["payload"] == token
    # The answer came from the worker process, not from this one.
    assert reply["worker"].startswith(redis_worker + "@")
    assert celery_app.conf.broker_url == settings.REDIS_URL


@pytest.mark.django_db(transaction=True)
async def test_websocket_round_trips_through_the_redis_channel_layer(redis_url, django_user_model):
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    user = await sync_to_async(django_user_model.objects.create_user)(username="ws", password="pw-long-1234")

    communicator = WebsocketCommunicator(EchoConsumer.as_asgi(), "/ws/echo/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_json_to({"hello": "pool"})
    assert await communicator.receive_json_from(timeout=5) == {"echo": {"hello": "pool"}}

    # A separate layer instance (its own Redis connections, as another web process would have) reaches the
    # socket through Redis.
    other_process_layer = RedisChannelLayer(
        hosts=[redis_url], prefix=settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    )
    await other_process_layer.group_send(EchoConsumer.group_name, {"type": "echo.message", "content": {"n": 2}})
    assert await communicator.receive_json_from(timeout=5) == {"echo": {"n": 2}}
    await other_process_layer.close_pools()
    await communicator.disconnect()


async def test_echo_socket_refuses_anonymous_users():
    from django.contrib.auth.models import AnonymousUser

    communicator = WebsocketCommunicator(EchoConsumer.as_asgi(), "/ws/echo/")
    communicator.scope["user"] = AnonymousUser()
    connected, code = await communicator.connect()
    assert not connected
    assert code == 4401
