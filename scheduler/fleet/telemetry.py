"""Telemetry plumbing that needs no database: the per-connection minute aggregator, the per-subscriber throttle
and the store of latest values (a Redis hash per node, or process memory in embedded mode).

Samples arrive at 1 Hz per device; writing each to the database would be 8,000 rows/s for 1,000 nodes.
Instead each agent connection folds its samples into per-minute aggregates in memory and hands finished
minutes to ``services.rollups.telemetry_minutes_write`` once a minute.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings

from scheduler.fleet.batching import GroupWrite

# The fields a browser and /metrics see for a device; the agent's names (nodeagent.protocol) kept as they are.
LATEST_FIELDS = (
    "utilization_pct",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "temperature_c",
    "sm_clock_mhz",
    "ecc_errors",
    "xid_errors",
)
# A browser's watch on a group lasts this long unless renewed (its socket renews it while open).
WATCH_TTL_S = 30.0
# Latest values older than this vanish from Redis, so a dead node's last numbers do not linger in /metrics.
LATEST_TTL_S = 300
# A node writes its finished minute (node id mod this) seconds after the minute ends, so that a fleet's
# minute rollups are spread over half a minute instead of all landing at :00.
ROLLUP_SPREAD_S = 30
# Latest values wait this long to share a Redis pipeline with other nodes' (the sockets do not wait for it).
LATEST_LINGER_S = 0.1


def minute_of(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass
class MinuteAggregate:
    """Running aggregate of one device over one minute."""

    uuid: str
    minute: datetime
    samples: int = 0
    utilization_sum: float = 0.0
    utilization_max: float = 0.0
    memory_sum: float = 0.0
    memory_max: float = 0.0
    power_sum: float = 0.0
    power_samples: int = 0
    temperature_max: float | None = None

    def add(self, sample: dict) -> None:
        utilization = _number(sample.get("utilization_pct")) or 0.0
        memory = _number(sample.get("memory_used_mib")) or 0.0
        self.samples += 1
        self.utilization_sum += utilization
        self.utilization_max = max(self.utilization_max, utilization)
        self.memory_sum += memory
        self.memory_max = max(self.memory_max, memory)
        power = _number(sample.get("power_w"))
        if power is not None:
            self.power_sum += power
            self.power_samples += 1
        temperature = _number(sample.get("temperature_c"))
        if temperature is not None:
            self.temperature_max = (
                temperature if self.temperature_max is None else max(self.temperature_max, temperature)
            )

    def merged(self, other: MinuteAggregate) -> MinuteAggregate:
        """Both aggregates of the same device and minute as one (e.g. from two connections of one agent)."""
        temperatures = [value for value in (self.temperature_max, other.temperature_max) if value is not None]
        return MinuteAggregate(
            uuid=self.uuid,
            minute=self.minute,
            samples=self.samples + other.samples,
            utilization_sum=self.utilization_sum + other.utilization_sum,
            utilization_max=max(self.utilization_max, other.utilization_max),
            memory_sum=self.memory_sum + other.memory_sum,
            memory_max=max(self.memory_max, other.memory_max),
            power_sum=self.power_sum + other.power_sum,
            power_samples=self.power_samples + other.power_samples,
            temperature_max=max(temperatures) if temperatures else None,
        )

    @property
    def utilization_avg(self) -> float:
        return self.utilization_sum / self.samples if self.samples else 0.0

    @property
    def memory_avg(self) -> float:
        return self.memory_sum / self.samples if self.samples else 0.0

    @property
    def power_avg(self) -> float | None:
        return self.power_sum / self.power_samples if self.power_samples else None


@dataclass
class MinuteAggregator:
    """Folds the samples of one agent connection into per-device, per-minute aggregates.

    ``add`` takes the time the sample was taken (a buffered batch from a reconnecting agent belongs to the
    minute it was measured in). ``drain(now)`` returns the minutes that are over; ``drain(None)`` returns all
    (used when the connection closes).
    """

    open_minutes: dict[tuple[str, datetime], MinuteAggregate] = field(default_factory=dict)

    def add(self, *, uuid: str, sample: dict, at: datetime) -> None:
        minute = minute_of(at)
        key = (uuid, minute)
        aggregate = self.open_minutes.get(key)
        if aggregate is None:
            aggregate = self.open_minutes[key] = MinuteAggregate(uuid=uuid, minute=minute)
        aggregate.add(sample)

    def has_finished(self, now: datetime) -> bool:
        current = minute_of(now)
        return any(minute < current for (_uuid, minute) in self.open_minutes)

    def drain(self, now: datetime | None) -> list[MinuteAggregate]:
        current = minute_of(now) if now is not None else None
        done = [key for key in self.open_minutes if current is None or key[1] < current]
        return [self.open_minutes.pop(key) for key in done]


class Throttle:
    """At most one message per ``interval_s`` slot of the clock to one subscriber; the clock is injected so
    tests need no sleeps.

    Slots (``[k·interval, (k+1)·interval)``) rather than "interval since the last message": a viewer of one
    node whose agent sends at 1 Hz would otherwise stay phase-locked behind any one-off delay (a message held
    0.9 s once makes every later one wait 0.9 s too). With slots, each 1 Hz frame goes out as it arrives, and
    a burst is coalesced into the next slot. ``delay()`` says how long until a message may go (0 = now);
    ``sent()`` records that one went.
    """

    def __init__(self, *, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last_slot: int | None = None

    def _slot(self, moment: float) -> int:
        return int(moment // self.interval_s) if self.interval_s > 0 else int(moment * 1e9)

    def delay(self) -> float:
        now = self.clock()
        if self._last_slot is None or self.interval_s <= 0 or self._slot(now) > self._last_slot:
            return 0.0
        return max(0.0, (self._last_slot + 1) * self.interval_s - now)

    def sent(self) -> None:
        self._last_slot = self._slot(self.clock())


def parse_time(value: object, *, default: datetime) -> datetime:
    """An agent's ``sent_at`` (ISO 8601 or epoch seconds) as an aware datetime; ``default`` when unusable."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(float(value), tz=UTC)
        except (OverflowError, OSError, ValueError):
            return default
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return default
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return default


# --- latest values ------------------------------------------------------------------------------------------


class MemoryLatestStore:
    """Process memory: only for embedded mode, where the web process is the only one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[int, dict[str, dict]] = {}
        self._watched: dict[str, float] = {}

    async def aput(self, node_id: int, devices: dict[str, dict]) -> None:
        self.put(node_id, devices)

    def put(self, node_id: int, devices: dict[str, dict]) -> None:
        with self._lock:
            self._nodes.setdefault(node_id, {}).update(devices)

    async def aget_nodes(self, node_ids: Iterable[int]) -> dict[int, dict[str, dict]]:
        return self.get_nodes(node_ids)

    def get_nodes(self, node_ids: Iterable[int]) -> dict[int, dict[str, dict]]:
        with self._lock:
            return {node_id: dict(self._nodes.get(node_id, {})) for node_id in node_ids}

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()

    async def awatch(self, groups: Iterable[str], ttl_s: float = WATCH_TTL_S) -> None:
        with self._lock:
            for group in groups:
                self._watched[group] = time.time() + ttl_s

    async def awatched(self) -> set[str]:
        now = time.time()
        with self._lock:
            return {group for group, until in self._watched.items() if until > now}


class RedisLatestStore:
    """One Redis hash per node: field = device UUID, value = JSON of its latest values and time."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self._sync = None
        self._async: dict[int, object] = {}
        self._writes: dict[int, GroupWrite[tuple[str, dict[str, str]]]] = {}  # per event loop, like the clients

    def key(self, node_id: int) -> str:
        return f"{self.prefix}:telemetry:latest:{node_id}"

    def _sync_client(self):
        if self._sync is None:
            import redis

            self._sync = redis.Redis(
                connection_pool=redis.BlockingConnectionPool.from_url(self.url, max_connections=50, timeout=10)
            )
        return self._sync

    def _async_client(self):
        # redis.asyncio clients are bound to the event loop that created them.
        import redis.asyncio

        loop_id = id(asyncio.get_running_loop())
        client = self._async.get(loop_id)
        if client is None:
            # A blocking pool: hundreds of agent sockets writing at once wait for a connection instead of
            # failing with "Too many connections" (redis-py ≥ 8 caps a plain pool at 100).
            pool = redis.asyncio.BlockingConnectionPool.from_url(self.url, max_connections=64, timeout=10)
            client = self._async[loop_id] = redis.asyncio.Redis(connection_pool=pool)
        return client

    async def aput(self, node_id: int, devices: dict[str, dict]) -> None:
        """Store ``devices``' latest values; returns once they are in Redis.

        What the sockets of one event loop put within ``LATEST_LINGER_S`` or while a pipeline is in flight
        goes out in one pipeline (``GroupWrite``): a thousand agents ticking once a second cost about ten
        round trips a second, not a thousand.
        """
        if not devices:
            return
        loop_id = id(asyncio.get_running_loop())
        writes = self._writes.get(loop_id)
        if writes is None:
            writes = self._writes[loop_id] = GroupWrite(self._write_latest, linger_s=LATEST_LINGER_S)
        await writes.submit([(self.key(node_id), {uuid: json.dumps(values) for uuid, values in devices.items()})])

    async def _write_latest(self, items: list[tuple[str, dict[str, str]]]) -> None:
        by_key: dict[str, dict[str, str]] = {}
        for key, mapping in items:
            by_key.setdefault(key, {}).update(mapping)
        async with self._async_client().pipeline(transaction=False) as pipe:
            for key, mapping in by_key.items():
                pipe.hset(key, mapping=mapping)
                pipe.expire(key, LATEST_TTL_S)
            await pipe.execute()

    def watch_key(self) -> str:
        return f"{self.prefix}:telemetry:watched"

    async def awatch(self, groups: Iterable[str], ttl_s: float = WATCH_TTL_S) -> None:
        until = time.time() + ttl_s
        mapping = {group: until for group in groups}
        if mapping:
            await self._async_client().zadd(self.watch_key(), mapping)

    async def awatched(self) -> set[str]:
        now = time.time()
        async with self._async_client().pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(self.watch_key(), "-inf", now)
            pipe.zrangebyscore(self.watch_key(), now, "+inf")
            _removed, groups = await pipe.execute()
        return {group.decode() for group in groups}

    def put(self, node_id: int, devices: dict[str, dict]) -> None:
        if not devices:
            return
        key = self.key(node_id)
        pipe = self._sync_client().pipeline(transaction=False)
        pipe.hset(key, mapping={uuid: json.dumps(values) for uuid, values in devices.items()})
        pipe.expire(key, LATEST_TTL_S)
        pipe.execute()

    @staticmethod
    def _decode(raw: dict) -> dict[str, dict]:
        return {uuid.decode(): json.loads(value) for uuid, value in raw.items()}

    async def aget_nodes(self, node_ids: Iterable[int]) -> dict[int, dict[str, dict]]:
        ids = list(node_ids)
        async with self._async_client().pipeline(transaction=False) as pipe:
            for node_id in ids:
                pipe.hgetall(self.key(node_id))
            results = await pipe.execute()
        return {node_id: self._decode(raw) for node_id, raw in zip(ids, results, strict=True)}

    def get_nodes(self, node_ids: Iterable[int]) -> dict[int, dict[str, dict]]:
        ids = list(node_ids)
        pipe = self._sync_client().pipeline(transaction=False)
        for node_id in ids:
            pipe.hgetall(self.key(node_id))
        return {node_id: self._decode(raw) for node_id, raw in zip(ids, pipe.execute(), strict=True)}


_stores: dict[tuple[str, str], MemoryLatestStore | RedisLatestStore] = {}
_stores_lock = threading.Lock()


def latest_store() -> MemoryLatestStore | RedisLatestStore:
    """The store for the current settings (``GPUPOOL_REDIS_URL`` set → Redis)."""
    url = settings.REDIS_URL
    prefix = getattr(settings, "GPUPOOL_TELEMETRY_KEY_PREFIX", "gpupool")
    key = (url, prefix)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = RedisLatestStore(url, prefix) if url else MemoryLatestStore()
        return store
