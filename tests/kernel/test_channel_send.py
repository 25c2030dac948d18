"""``kernel.channel_send``: group sends from synchronous code without an event loop (the Celery worker) go through
one event loop per process, so the Redis channel layer's connections are reused, and the messages arrive."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from kernel import channel_send

pytestmark = pytest.mark.services


def test_sync_group_sends_arrive_through_redis_on_one_reused_loop(redis_url):
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    group = f"test.send.{uuid.uuid4().hex[:8]}"
    # The receiver is another layer instance, as a web process's consumer would be.
    receiver = RedisChannelLayer(hosts=[redis_url], prefix=settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"])

    async def subscribe() -> str:
        channel = await receiver.new_channel()
        await receiver.group_add(group, channel)
        return channel

    async def receive(channel: str, count: int) -> list[dict]:
        try:
            return [await asyncio.wait_for(receiver.receive(channel), 5) for _ in range(count)]
        finally:
            await receiver.close_pools()

    loop = asyncio.new_event_loop()
    try:
        channel = loop.run_until_complete(subscribe())
        for number in range(3):
            channel_send.group_send(group, {"type": "test.message", "n": number})
        first_loop = channel_send._sender_loop()
        channel_send.group_send(group, {"type": "test.message", "n": 3})
        assert channel_send._sender_loop() is first_loop  # not a new loop (and connections) per send
        received = loop.run_until_complete(receive(channel, 4))
    finally:
        loop.close()
    assert [message["n"] for message in received] == [0, 1, 2, 3]


def test_a_send_that_fails_raises_in_the_caller(redis_url):
    async def failing(_layer) -> None:
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        channel_send.run_with_channel_layer(failing)
