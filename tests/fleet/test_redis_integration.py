"""The fleet over the real Redis: the channel layer between agent and browser sockets, revocation from a
service (sync code) reaching a live socket, and latest values in a Redis hash per node."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings

from nodeagent import protocol
from scheduler.fleet.consumers import TELEMETRY_LAYER
from scheduler.fleet.services.enrolment import CLOSE_UNAUTHORIZED, node_credentials_revoke
from scheduler.fleet.telemetry import RedisLatestStore, latest_store
from tests.factories import SystemAdminFactory
from tests.fleet.conftest import browser_socket, connect_agent, register_node, settle, telemetry

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
db = database_sync_to_async


async def test_agent_telemetry_reaches_a_browser_through_redis_and_is_kept_in_a_hash(redis_url):
    assert isinstance(get_channel_layer(), RedisChannelLayer)
    assert isinstance(get_channel_layer(TELEMETRY_LAYER), RedisPubSubChannelLayer)
    store = latest_store()
    assert isinstance(store, RedisLatestStore)
    admin = await db(SystemAdminFactory)()
    node, credential = await db(register_node)("redis-node")
    agent = await connect_agent(credential, "redis-node", devices=8)
    browser = await browser_socket(admin)
    await browser.connect()
    assert json.loads(await browser.receive_from())["type"] == "welcome"
    await browser.send_json_to({"subscribe": {"node": node.pk}})
    assert json.loads(await browser.receive_from())["type"] == "subscribed"
    await agent.send_to(text_data=protocol.encode(telemetry([f"GPU-redis-node-{i}" for i in range(8)], utilization=77)))
    frame = json.loads(await browser.receive_from(timeout=5))
    assert len(frame["nodes"][0]["devices"]) == 8
    await settle(agent)  # the latest values are written behind the socket's back
    raw = redis.Redis.from_url(settings.REDIS_URL).hgetall(store.key(node.pk))
    assert len(raw) == 8
    assert json.loads(raw[b"GPU-redis-node-3"])["utilization_pct"] == 77
    await browser.disconnect()
    await agent.disconnect()
    redis.Redis.from_url(settings.REDIS_URL).delete(store.key(node.pk))


async def test_revoking_in_a_service_closes_the_socket_through_redis(redis_url):
    node, credential = await db(register_node)("redis-node")
    agent = await connect_agent(credential, "redis-node")
    await db(node_credentials_revoke)(actor=None, node=node)
    assert await agent.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_UNAUTHORIZED}
    # End the closed consumer here, bounded, as the other tests do: left to the event loop's teardown, its
    # cancellation once hung a CI run.
    await agent.disconnect()


async def test_latest_values_written_at_once_go_out_together_and_all_land(redis_url):
    store = RedisLatestStore(redis_url, prefix="test-batching")
    pipelines = 0
    write = store._write_latest

    async def counting(items):
        nonlocal pipelines
        pipelines += 1
        await write(items)

    store._write_latest = counting
    node_ids = range(900_000, 900_200)
    await asyncio.gather(
        *(store.aput(node_id, {f"GPU-{node_id}-0": {"utilization_pct": node_id % 100}}) for node_id in node_ids)
    )
    # Every put returned after its values were in Redis, and 200 puts did not need 200 round trips.
    latest = store.get_nodes(node_ids)
    assert all(latest[node_id][f"GPU-{node_id}-0"]["utilization_pct"] == node_id % 100 for node_id in node_ids)
    assert pipelines < 10
    redis.Redis.from_url(redis_url).delete(*(store.key(node_id) for node_id in node_ids))


async def test_a_cancelled_put_does_not_cancel_the_write_others_wait_for(redis_url):
    store = RedisLatestStore(redis_url, prefix="test-batching")
    first = asyncio.ensure_future(store.aput(900_500, {"GPU-a": {"utilization_pct": 1}}))
    second = asyncio.ensure_future(store.aput(900_501, {"GPU-b": {"utilization_pct": 2}}))
    await asyncio.sleep(0)
    first.cancel()
    await second
    latest = store.get_nodes([900_500, 900_501])
    assert latest[900_500]["GPU-a"]["utilization_pct"] == 1
    assert latest[900_501]["GPU-b"]["utilization_pct"] == 2
    redis.Redis.from_url(redis_url).delete(store.key(900_500), store.key(900_501))


async def test_a_frame_published_by_another_web_process_reaches_the_browser(redis_url):
    """Agents and browsers sit on different web replicas; the telemetry layer carries frames between them."""
    admin = await db(SystemAdminFactory)()
    node, _credential = await db(register_node)("remote-node")
    browser = await browser_socket(admin)
    await browser.connect()
    assert json.loads(await browser.receive_from())["type"] == "welcome"
    await browser.send_json_to({"subscribe": {"node": node.pk}})
    assert json.loads(await browser.receive_from())["type"] == "subscribed"
    config = settings.CHANNEL_LAYERS[TELEMETRY_LAYER]["CONFIG"]
    other_process = RedisPubSubChannelLayer(hosts=config["hosts"], prefix=config["prefix"])
    batch = {"node": node.pk, "name": "remote-node", "sent_at": "2026-12-03T08:00:00+00:00", "devices": {"GPU-r": {}}}
    await other_process.group_send(f"node.{node.pk}", {"type": "telemetry.batch", "node": node.pk, "batch": batch})
    frame = json.loads(await browser.receive_from(timeout=5))
    assert frame["type"] == "telemetry" and frame["nodes"][0]["devices"] == {"GPU-r": {}}
    await other_process.flush()
    await browser.disconnect()
