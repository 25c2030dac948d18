"""Typed views of what the gpupool API returns, written against its OpenAPI schema (``/api/schema/``).

Each model is a frozen dataclass built with ``Model.from_api(body)``: fields the schema names are converted
(timestamps to aware ``datetime``, nested objects to their models), fields a newer server adds are kept in
``raw`` and ignored otherwise, and fields an older server lacks take their defaults. So a client and a server of
neighbouring versions still talk.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, TypeVar

__all__ = [
    "Allocation",
    "ArrayCancelled",
    "Device",
    "Flavor",
    "Job",
    "JobArray",
    "JobEvent",
    "LogChunk",
    "Me",
    "MeToken",
    "Membership",
    "Node",
    "Quota",
    "QuotaUsage",
    "Tenant",
]

MILLIS_PER_CARD = 1000
#: Job states after which nothing changes any more.
FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
#: Job states in which a job holds (or is about to hold) cards.
ACTIVE_STATES = frozenset({"admitted", "running", "preempting"})
#: Job states of a job that waits for its turn.
PENDING_STATES = frozenset({"submitted", "pending_approval", "queued", "node_lost"})

M = TypeVar("M", bound="Model")


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 timestamp of the API (``...Z`` or ``+00:00``) as an aware datetime; None stays None."""
    if value in (None, ""):
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _convert(options[0], value) if len(options) == 1 else value
    if hint is datetime:
        return parse_time(value)
    if isinstance(hint, type) and issubclass(hint, Model) and isinstance(value, dict):
        return hint.from_api(value)
    if origin is tuple and isinstance(value, list):
        (item,) = typing.get_args(hint)[:1]
        return tuple(_convert(item, entry) for entry in value)
    return value


@dataclass(frozen=True)
class Model:
    """Base of the models: ``from_api`` and the body as received in ``raw``."""

    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, kw_only=True)
    _hints: ClassVar[dict[type, dict[str, Any]]] = {}

    @classmethod
    def from_api(cls: type[M], body: dict[str, Any]) -> M:
        hints = Model._hints.get(cls)
        if hints is None:
            hints = Model._hints[cls] = typing.get_type_hints(cls)
        values = {
            item.name: _convert(hints[item.name], body[item.name])
            for item in dataclasses.fields(cls)
            if item.name != "raw" and item.name in body
        }
        return cls(**values, raw=dict(body))


# --- jobs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobEvent(Model):
    from_state: str = ""
    to_state: str = ""
    reason: str = ""
    message: str = ""
    actor: str | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class Allocation(Model):
    """Cards (or a fraction of one) a replica holds: ``millis`` of ``device`` on ``node``."""

    replica: int = 0
    device: str = ""
    node: str = ""
    flavor: str = ""
    millis: int = 0
    memory_mib: int = 0
    borrowed_millis: int = 0
    started_at: datetime | None = None
    ended_at: datetime | None = None


@dataclass(frozen=True)
class Job(Model):
    """A job as ``GET /jobs/`` lists it; ``GET /jobs/{id}/`` adds the spec fields, allocations and events."""

    id: int
    name: str = ""
    tenant: str = ""
    submitter: str | None = None
    kind: str = "training"
    #: The priority class's name: critical, high, normal, low, best_effort.
    priority_class: str = "normal"
    #: Its number (higher runs first).
    priority_value: int = 500
    preemptible: bool = True
    replicas: int = 1
    flavors: tuple[str, ...] = ()
    #: True: the flavors are alternatives (the pool picks); False: tried in the order given.
    any_flavor: bool = False
    millis_per_replica: int = 0
    gpus_per_replica: float = 0.0
    memory_mib_per_replica: int = 0
    cpu_millicores_per_replica: int = 0  # host CPU per replica (stated, or the flavor's default per card)
    host_memory_mib_per_replica: int = 0
    topology: str = "none"
    state: str = ""
    state_message: str = ""
    exit_code: int | None = None
    pending_reason_code: str = ""
    pending_reason: str = ""
    position_in_tenant: int | None = None
    position_overall: int | None = None
    preemption_count: int = 0
    submitted_at: datetime | None = None
    admitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    array_id: str | None = None
    array_index: int | None = None
    #: When the scheduler expects a waiting job to start (servers that estimate it; None otherwise).
    estimated_start_at: datetime | None = None
    # Detail only (``GET /jobs/{id}/``, a submit's answer):
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    max_runtime_s: int | None = None
    allocations: tuple[Allocation, ...] = ()
    events: tuple[JobEvent, ...] = ()

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def is_pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def nodes(self) -> tuple[str, ...]:
        """Nodes the job holds cards on now: from its allocations (detail) or a list row's ``nodes``."""
        if "nodes" in self.raw and isinstance(self.raw["nodes"], list):
            return tuple(str(name) for name in self.raw["nodes"])
        return tuple(dict.fromkeys(a.node for a in self.allocations if a.ended_at is None))

    def elapsed_s(self, now: datetime) -> float | None:
        """Seconds it has run (until it finished, or until ``now``); None when it never started."""
        if self.started_at is None:
            return None
        end = self.finished_at or now
        return max(0.0, (end - self.started_at).total_seconds())


@dataclass(frozen=True)
class JobArray(Model):
    """The answer to an array submit: ``count`` tasks; task 0 is job ``first_job_id``, the others become jobs when
    the scheduler may place them (``array_state`` counts every task; ``array_task`` gets one by index)."""

    array_id: str
    count: int = 0
    tenant: str = ""
    name: str = ""
    state: str = ""
    first_job_id: int | None = None


@dataclass(frozen=True)
class ArrayState(Model):
    """An array with every task counted by state; ``not_yet_jobs``: the queued indices that are not jobs yet."""

    array_id: str
    count: int = 0
    tenant: str = ""
    name: str = ""
    first_job_id: int | None = None
    states: dict = field(default_factory=dict)
    not_yet_jobs: str = ""


@dataclass(frozen=True)
class ArrayCancelled(Model):
    array_id: str
    cancelled: int = 0
    cancelled_job_ids: tuple[int, ...] = ()
    already_finished: int = 0
    cancelled_waiting: int = 0


@dataclass(frozen=True)
class LogChunk(Model):
    """A piece of a replica's output from byte ``offset`` (the offset asked for); ask for ``next_offset`` next.

    ``complete``: the job has ended and no more output will come. ``truncated_before``: the first offset the
    server still keeps (0 when nothing was cut); text asked for before it starts there instead."""

    job: int
    replica: int = 0
    offset: int = 0
    next_offset: int = 0
    text: str = ""
    complete: bool = False
    truncated_before: int | None = None


# --- tenants, quotas, identity --------------------------------------------------------------------------


@dataclass(frozen=True)
class Membership(Model):
    tenant: int
    tenant_slug: str = ""
    role: str = ""


@dataclass(frozen=True)
class MeToken(Model):
    """The token a request was made with: its scope, and whether that scope submits and cancels jobs
    (``submit_scope`` is the scope that does)."""

    id: int
    name: str = ""
    key_prefix: str = ""
    scope: str = ""
    expires_at: datetime | None = None
    submits_jobs: bool = True
    submit_scope: str = "write"


@dataclass(frozen=True)
class Me(Model):
    id: int
    username: str = ""
    email: str | None = None
    platform_role: str = ""
    memberships: tuple[Membership, ...] = ()
    #: None for a session, or from a server too old to say.
    token: MeToken | None = None


@dataclass(frozen=True)
class Tenant(Model):
    id: int
    name: str = ""
    slug: str = ""
    kind: str = ""
    parent: int | None = None
    parent_slug: str | None = None
    depth: int = 1
    description: str = ""


@dataclass(frozen=True)
class Quota(Model):
    """A quota row: per tenant and flavor, in millis (1000 = one card); a None limit means no limit."""

    id: int
    tenant: int = 0
    tenant_slug: str = ""
    flavor: int = 0
    flavor_name: str = ""
    guaranteed_millis: int = 0
    limit_millis: int | None = None
    lending_limit_millis: int | None = None
    guaranteed_memory_mib: int = 0
    max_running_jobs: int | None = None


@dataclass(frozen=True)
class QuotaUsage(Model):
    """A tenant's quota and its use now, for one flavor (``GET /tenants/{id}/quota-usage/``), in millis.

    ``borrowed``: the part of ``in_use`` above the guarantee (lenders may take it back by preemption)."""

    flavor: str
    guaranteed: int = 0
    limit: int | None = None
    lending_limit: int | None = None
    in_use: int = 0
    borrowed: int = 0
    lent: int = 0
    available_to_borrow: int = 0
    guaranteed_memory_mib: int = 0
    memory_in_use_mib: int = 0
    running_jobs: int = 0
    max_running_jobs: int | None = None
    #: The tenant the row belongs to (the client fills it in; the endpoint is per tenant).
    tenant: str = ""


# --- resources --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flavor(Model):
    id: int
    name: str = ""
    vendor: str = ""
    model: str = ""
    memory_mib: int = 0
    description: str = ""
    cpu_millicores_per_card: int = 0  # host CPU a job that states none gets per card (0: none)
    host_memory_mib_per_card: int = 0


@dataclass(frozen=True)
class Node(Model):
    id: int
    name: str = ""
    status: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    cpu_cores: int = 0
    memory_mib: int = 0
    last_heartbeat_at: datetime | None = None
    agent_version: str = ""
    sandbox: str | None = ""
    device_count: int = 0
    created_at: datetime | None = None


@dataclass(frozen=True)
class Device(Model):
    """A card. ``uuid`` is None unless one of your jobs holds it (platform roles see every UUID)."""

    id: int
    uuid: str | None = None
    node: str = ""
    index: int = 0
    vendor: str = ""
    model: str = ""
    flavor: str | None = None
    memory_mib: int = 0
    numa_node: int | None = None
    health: str = ""
    mig_mode: bool = False
    #: Live values from the latest telemetry (None when none is recent, or when the card is not yours).
    utilization_pct: float | None = None
    memory_used_mib: int | None = None
