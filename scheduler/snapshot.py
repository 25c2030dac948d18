"""Models → ``scheduler.core`` Snapshot, and the Policy from settings.

Ids in the snapshot: jobs by ``str(pk)``, tenants by slug, nodes by name, devices by uuid, flavors by name
(all unique), so a Plan maps straight back to rows.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Max, QuerySet
from django.utils import timezone

from catalog.models import ResourceFlavor
from kernel.db.bulk import AnyOf
from scheduler.core import decay_usage, plan
from scheduler.core import types as core
from scheduler.fleet.models import Device, DeviceHealth, Node, NodeStatus
from scheduler.models import Allocation, CapacityHold, InferenceReservation, Job, JobEvent, JobKind, JobState
from scheduler.scheduling_policy import policy_from_settings
from tenants.models import Quota, Tenant

logger = logging.getLogger(__name__)


class _Slot:
    """Stands for an argument of a ``CompiledQuery`` while it is compiled (``AnyOf([_Slot(i)])``)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class CompiledQuery:
    """A read whose SQL never changes (every node, every device, the active allocations; the devices of some
    uuids...), built and compiled by Django once per process rather than every cycle.

    Building a queryset and compiling it costs Django about half a millisecond, more than running it on a small
    pool: the snapshot's dozen reads and the persist step's locks, every cycle of a busy worker, were half of
    its CPU. ``build`` returns the queryset (``values_list``, or model instances with ``instances=True``); its
    arguments, if any, are lists that it filters on with ``AnyOf`` — one array parameter on PostgreSQL, so the
    SQL is the same whatever the values; elsewhere (an IN list per value) the queryset is built every time.
    ``rows(*values)`` runs the stored SQL on the default database with those lists and applies the converters
    the queryset would (JSON fields, SQLite's datetimes). The caller's checks stay the caller's: a
    ``select_for_update`` query must run in a transaction, as any.
    """

    def __init__(self, build: Callable[..., QuerySet], *, arguments: int = 0, instances: bool = False) -> None:
        self._build = build
        self._arguments = arguments
        self._instances = instances
        self._compiled: dict[str, tuple] = {}

    def _compile(self) -> tuple:
        refusal = "each argument of a CompiledQuery must be one array parameter (AnyOf on PostgreSQL)"
        try:
            queryset = self._build(*([_Slot(index)] for index in range(self._arguments)))
            compiler = queryset.query.get_compiler(using=DEFAULT_DB_ALIAS)
            sql, params = compiler.as_sql()
        except (TypeError, ValueError) as exc:  # a field's lookup took a placeholder for its own value
            if not self._arguments:
                raise
            raise ValueError(refusal) from exc
        # Each parameter: (argument index, None) for an argument's list, (None, value) for a constant.
        slots = tuple(
            (param[0].index, None)
            if isinstance(param, list) and len(param) == 1 and isinstance(param[0], _Slot)
            else (None, param)
            for param in params
        )
        if sum(1 for index, _value in slots if index is not None) != self._arguments:
            raise ValueError(refusal)
        columns = [selected[0] for selected in compiler.select[: compiler.col_count]]
        converters = tuple(
            (position, tuple(functions), expression)
            for position, (functions, expression) in compiler.get_converters(columns).items()
        )
        attnames = tuple(column.target.attname for column in columns) if self._instances else ()
        return sql, slots, converters, queryset.model, attnames

    def rows(self, *values: list) -> list:
        connection = connections[DEFAULT_DB_ALIAS]
        if len(values) != self._arguments:
            raise TypeError(f"{self._arguments} argument(s) expected, {len(values)} given")
        if values and connection.vendor != "postgresql":
            return list(self._build(*values))
        compiled = self._compiled.get(connection.vendor)
        if compiled is None:
            compiled = self._compiled[connection.vendor] = self._compile()
        sql, slots, converters, model, attnames = compiled
        params = [values[index] if index is not None else value for index, value in slots]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if converters:
            rows = [self._convert(row, converters, connection) for row in rows]
        if self._instances:
            return [model.from_db(DEFAULT_DB_ALIAS, attnames, row) for row in rows]
        return list(rows)

    @staticmethod
    def _convert(row: tuple, converters: tuple, connection: Any) -> tuple:
        values = list(row)
        for position, functions, expression in converters:
            value = values[position]
            for function in functions:
                value = function(value, expression, connection)
            values[position] = value
        return tuple(values)


def _epoch(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _topology_lookup(topology: dict, key: str) -> dict[str, str]:
    """Map device uuid / index (as text) → group name from ``Node.topology[key]``.

    Accepts ``{"domain-a": [uuid or index, ...]}`` or ``[[uuid or index, ...], ...]``; anything else is ignored.
    """
    groups = topology.get(key) if isinstance(topology, dict) else None
    lookup: dict[str, str] = {}
    if isinstance(groups, dict):
        items: Iterable[tuple[Any, Any]] = groups.items()
    elif isinstance(groups, list):
        items = ((f"{key}-{position}", members) for position, members in enumerate(groups))
    else:
        return lookup
    for name, members in items:
        if isinstance(members, dict):
            members = members.get("devices", [])
        if isinstance(members, list):
            for member in members:
                lookup[str(member)] = str(name)
    return lookup


# Every tenant, by slug: its pk (to name rows) and its parent's (the tree), in one read.
_TENANT_ROWS = CompiledQuery(lambda: Tenant.objects.order_by("slug").values_list("pk", "slug", "parent_id"))
_FLAVOR_NAMES = CompiledQuery(lambda: ResourceFlavor.objects.values_list("pk", "name"))
#: A node's and a card's columns (``node_build``), read by this module and by the incremental snapshot.
NODE_COLUMNS = ("pk", "name", "status", "labels", "topology", "cpu_cores", "memory_mib")
DEVICE_COLUMNS = (
    "pk",
    "node_id",
    "uuid",
    "index",
    "flavor_id",
    "memory_mib",
    "health",
    "nvlink_domain",
    "pcie_switch",
    "numa_node",
)
_NODE_ROWS = CompiledQuery(lambda: Node.objects.order_by("name").values_list(*NODE_COLUMNS))
_DEVICE_ROWS = CompiledQuery(lambda: Device.objects.order_by("node_id", "index").values_list(*DEVICE_COLUMNS))


class NameMaps(Protocol):
    """Ids → the names the snapshot uses, as ``_Names`` and the incremental snapshot keep them."""

    tenants: dict[int, str]
    flavors: dict[int, str]
    node_names: dict[int, str]
    device_uuids: dict[int, str]


class _Names:
    """Ids → the names the snapshot uses (node name, device uuid, tenant slug, flavor name), each table read
    once with ``values_list`` (tens of thousands of model instances cost more than the whole plan)."""

    def __init__(self) -> None:
        self.tenant_rows = _TENANT_ROWS.rows()
        self.tenants = {pk: slug for pk, slug, _parent in self.tenant_rows}
        self.flavors = dict(_FLAVOR_NAMES.rows())
        self.nodes = _NODE_ROWS.rows()
        self.node_names = {pk: name for pk, name, *_rest in self.nodes}
        self.devices = _DEVICE_ROWS.rows()
        self.device_uuids = {row[0]: row[2] for row in self.devices}


def _group(explicit: str, lookup: dict[str, str], node: str, uuid: str, index: int) -> str | None:
    """A device's NVLink domain or PCIe switch: its own field, else the node's topology map."""
    if explicit:
        return explicit
    found = lookup.get(uuid) or lookup.get(str(index)) if lookup else None
    # Scope fallback names to the node: "nvlink_domains-0" on two nodes are different domains.
    return f"{node}:{found}" if found else None


def node_build(row: tuple, device_rows: Iterable[tuple], flavors: dict[int, str]) -> core.Node:
    """One node as the engine sees it, from its ``_NODE_ROWS`` row and its ``_DEVICE_ROWS`` rows (in index
    order)."""
    _pk, name, status, labels, topology, cpu_cores, host_memory_mib = row
    topology = topology or {}
    nvlink = _topology_lookup(topology, "nvlink_domains")
    pcie = _topology_lookup(topology, "pcie_switches")
    healthy = DeviceHealth.HEALTHY
    devices = tuple(
        core.Device(
            uuid=uuid,
            node=name,
            index=index,
            flavor=flavors[flavor_id],
            memory_mib=memory_mib,
            healthy=health == healthy,
            nvlink_domain=_group(nvlink_domain, nvlink, name, uuid, index),
            pcie_switch=_group(pcie_switch, pcie, name, uuid, index),
            numa_node=numa_node,
        )
        for _pk, _node, uuid, index, flavor_id, memory_mib, health, nvlink_domain, pcie_switch, numa_node in device_rows
        if flavor_id is not None  # a device no flavor describes cannot be asked for
    )
    return core.Node(
        name=name,
        devices=devices,
        schedulable=status == NodeStatus.READY,
        labels={str(k): str(v) for k, v in (labels or {}).items()},
        # 0 means the agent has not reported it: not limited (the engine's None).
        cpu_millicores=cpu_cores * 1000 if cpu_cores else None,
        host_memory_mib=host_memory_mib or None,
    )


def _nodes(names: _Names) -> tuple[core.Node, ...]:
    by_node: dict[int, list[tuple]] = defaultdict(list)
    for row in names.devices:
        by_node[row[1]].append(row)
    # Sorted here, not by the database's collation: the incremental snapshot (``live_snapshot``) sorts the same.
    return tuple(node_build(row, by_node[row[0]], names.flavors) for row in sorted(names.nodes, key=_by_name))


def _by_name(row: tuple) -> str:
    return row[1]


#: What the engine needs of an active allocation and of its job (``allocation_build``).
ALLOCATION_COLUMNS = (
    "job_id",
    "replica",
    "device_id",
    "node_id",
    "tenant_id",
    "flavor_id",
    "millis",
    "memory_mib",
    "borrowed_millis",
    "started_at",
    "reservation_of_id",
    "job__priority_class",
    "job__preemptible",
    "job__state",
    "job__last_checkpoint_at",
    "job__kind",
    "job__max_runtime_s",
    "job__runtime_estimate_s",
    "job__cpu_millicores_per_replica",
    "job__host_memory_mib_per_replica",
    "job__preemption_count",
)
_ALLOCATION_ROWS = CompiledQuery(
    lambda: Allocation.objects.active().order_by("job_id", "replica", "device_id").values_list(*ALLOCATION_COLUMNS)
)


def _allocation_rows() -> list[tuple]:
    """Active allocations with what the engine needs of their jobs, as plain rows (names resolved later)."""
    return _ALLOCATION_ROWS.rows()


def _allocations(rows: list[tuple], names: _Names) -> tuple[core.Allocation, ...]:
    result = []
    for row in rows:
        # A replica's host CPU and memory go on its first row (rows come in job, replica order).
        first_of_replica = not result or result[-1].job_id != str(row[0]) or result[-1].replica != row[1]
        result.append(allocation_build(row, names, first_of_replica=first_of_replica))
    return tuple(result)


_ALLOCATION_KINDS = {kind.value: kind for kind in core.JobKind}
#: A pending job's states; a running service's (whose missing replicas are pending work, ``scale_ups``).
PENDING_STATES = (JobState.QUEUED, JobState.PENDING_APPROVAL)
SERVICE_STATES = (JobState.ADMITTED, JobState.RUNNING)
_STOPPING = (JobState.PREEMPTING, JobState.CANCELLED)


def allocation_build(row: tuple, names: NameMaps, *, first_of_replica: bool) -> core.Allocation:
    """One allocation (an ``ALLOCATION_COLUMNS`` row); ``first_of_replica`` carries its replica's host CPU and
    memory."""
    (
        job_id,
        replica,
        device_id,
        node_id,
        tenant_id,
        flavor_id,
        millis,
        memory_mib,
        borrowed_millis,
        started_at,
        reservation_of_id,
        priority,
        preemptible,
        state,
        last_checkpoint_at,
        kind,
        max_runtime_s,
        runtime_estimate_s,
        cpu_millicores,
        host_memory_mib,
        preemption_count,
    ) = row
    started = _epoch(started_at) or 0.0
    expected_end = None
    if max_runtime_s:
        expected_end = started + max_runtime_s
    elif runtime_estimate_s:
        expected_end = started + runtime_estimate_s
    return core.Allocation(
        job_id=str(job_id),
        replica=replica,
        device_uuid=names.device_uuids[device_id],
        node=names.node_names[node_id],
        tenant=names.tenants[tenant_id],
        flavor=names.flavors[flavor_id],
        millis=millis,
        memory_mib=memory_mib,
        priority=priority,
        # A job already stopping (preempted, or cancelled and waiting for its process to end) is not
        # stopped again.
        preemptible=preemptible and state not in _STOPPING,
        borrowed_millis=borrowed_millis,
        started_at=started,
        last_checkpoint_at=_epoch(last_checkpoint_at),
        kind=_ALLOCATION_KINDS[kind],
        reservation_of=str(reservation_of_id) if reservation_of_id else None,
        expected_end_at=expected_end,
        cpu_millicores=cpu_millicores if first_of_replica else 0,
        host_memory_mib=host_memory_mib if first_of_replica else 0,
        preemptions=preemption_count,
    )


_RESERVATION_ROWS = CompiledQuery(
    lambda: InferenceReservation.objects.order_by("job_id", "replica", "device_id").values_list(
        "job_id", "tenant_id", "node_id", "device_id", "flavor_id", "millis", "memory_mib"
    )
)


def _reservation_rows() -> list[tuple]:
    """Inference reservations. Read *after* the allocations: a replica that stops on scale-down turns its
    allocation into a reservation in one transaction, so reading in this order can only see both (too
    little free capacity for a cycle), never neither (a device that looks free but is reserved)."""
    return _RESERVATION_ROWS.rows()


def reservations_build(rows: Iterable[tuple], names: NameMaps) -> tuple[core.Reservation, ...]:
    return tuple(
        core.Reservation(
            job_id=str(job_id),
            tenant=names.tenants[tenant_id],
            node=names.node_names[node_id],
            device_uuid=names.device_uuids[device_id],
            flavor=names.flavors[flavor_id],
            millis=millis,
            memory_mib=memory_mib,
        )
        for job_id, tenant_id, node_id, device_id, flavor_id, millis, memory_mib in rows
    )


_HOLD_ROWS = CompiledQuery(
    lambda: CapacityHold.objects.order_by("job_id", "device_id").values_list(
        "job_id", "device_id", "victim_ids", "since"
    )
)


def holds_build(rows: Iterable[tuple], names: NameMaps) -> tuple[core.Hold, ...]:
    return tuple(
        core.Hold(
            job_id=str(job_id),
            device_uuid=names.device_uuids[device_id],
            victims=tuple(sorted(str(v) for v in victim_ids or ())),
            since=since.timestamp(),
        )
        for job_id, device_id, victim_ids, since in rows
    )


def tenants_build(rows: Iterable[tuple], tenants: dict[int, str]) -> tuple[core.Tenant, ...]:
    """The tenant tree from ``_TENANT_ROWS`` rows, by slug (sorted here: the incremental snapshot does the same)."""
    return tuple(
        core.Tenant(name=slug, parent=tenants[parent] if parent is not None else None)
        for _pk, slug, parent in sorted(rows, key=_by_name)
    )


_QUOTA_ROWS = CompiledQuery(
    lambda: Quota.objects.values_list(
        "tenant__slug",
        "flavor__name",
        "guaranteed_millis",
        "limit_millis",
        "lending_limit_millis",
        "max_running_jobs",
    )
)


def quotas_build(rows: Iterable[tuple]) -> tuple[core.Quota, ...]:
    """Quotas from ``(tenant slug, flavor name, ...)`` rows, in the model's order (tenant slug, flavor name),
    sorted here as the incremental snapshot sorts them."""
    return tuple(
        core.Quota(
            tenant=tenant,
            flavor=flavor,
            guaranteed_millis=guaranteed_millis,
            limit_millis=limit_millis,
            lending_limit_millis=lending_limit_millis,
            max_running_jobs=max_running_jobs or None,
        )
        for tenant, flavor, guaranteed_millis, limit_millis, lending_limit_millis, max_running_jobs in sorted(
            rows, key=_tenant_and_flavor
        )
    )


def _tenant_and_flavor(row: tuple) -> tuple[str, str]:
    return row[0], row[1]


USAGE_CACHE_KEY = "scheduler:fairshare-usage:v1"


def held_millis(allocations: tuple[core.Allocation, ...]) -> dict[str, dict[str, float]]:
    """Millis held right now, per tenant and flavor."""
    usage: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for allocation in allocations:
        usage[allocation.tenant][allocation.flavor] += allocation.millis
    return {tenant: dict(flavors) for tenant, flavors in usage.items()}


def decayed_usage(
    held: dict[str, dict[str, float]], *, now_s: float, half_life_s: float, previous: dict | None
) -> dict[str, dict[str, float]]:
    """Time-decayed average of millis held (``scheduler.core.decay_usage``) from the value of the last cycle.

    ``previous`` is ``{"at": epoch seconds, "usage": {tenant: {flavor: millis}}}`` or None (first cycle: the
    usage is what is held now).
    """

    if not previous or "at" not in previous:
        return held
    elapsed = max(0.0, now_s - float(previous["at"]))
    old = previous.get("usage") or {}
    result: dict[str, dict[str, float]] = {}
    for tenant in sorted(set(old) | set(held)):
        flavors = set(old.get(tenant, {})) | set(held.get(tenant, {}))
        values = {
            flavor: decay_usage(
                float(old.get(tenant, {}).get(flavor, 0.0)),
                float(held.get(tenant, {}).get(flavor, 0.0)),
                elapsed,
                half_life_s,
            )
            for flavor in sorted(flavors)
        }
        # Forget what has decayed to nothing, so the record does not grow with every tenant ever seen.
        values = {flavor: value for flavor, value in values.items() if value >= 0.5}
        if values:
            result[tenant] = values
    return result


def usage_now(
    allocations: tuple[core.Allocation, ...], *, now_s: float, previous_usage: dict | None
) -> dict[str, dict[str, float]]:
    """The fair-share usage a snapshot carries: what ``allocations`` hold, decayed from the last cycle's
    (``decayed_usage``) with the policy's half-life."""
    return decayed_usage(
        held_millis(allocations),
        now_s=now_s,
        half_life_s=policy_from_settings().usage_half_life_s,
        previous=previous_usage,
    )


#: The Job columns a pending job is built from (``pending_job``), then its stored explanation.
PENDING_COLUMNS = (
    "pk",
    "tenant_id",
    "flavors",
    "millis_per_replica",
    "memory_mib_per_replica",
    "priority_class",
    "preemptible",
    "submitted_at",
    "kind",
    "replicas",
    "topology",
    "min_replicas",
    "max_replicas",
    "node_selector",
    "preempted_by",
    "state",
    "runtime_estimate_s",
    "last_checkpoint_at",
    "cpu_millicores_per_replica",
    "host_memory_mib_per_replica",
    "preemption_count",
    "any_flavor",
)
EXPLANATION_COLUMNS = ("pending_reason_code", "pending_message", "position_in_tenant", "position_overall")


def pending_job(row: tuple, tenants: dict[int, str]) -> core.PendingJob:
    (
        pk,
        tenant_id,
        flavors,
        millis,
        memory_mib,
        priority,
        preemptible,
        submitted_at,
        kind,
        replicas,
        topology,
        min_replicas,
        max_replicas,
        node_selector,
        preempted_by,
        state,
        runtime_estimate_s,
        last_checkpoint_at,
        cpu_millicores,
        host_memory_mib,
        preemption_count,
        any_flavor,
    ) = row[: len(PENDING_COLUMNS)]
    return core.PendingJob(
        job_id=str(pk),
        tenant=tenants[tenant_id],
        request=core.ReplicaRequest(
            flavors=tuple(flavors),
            millis=millis,
            memory_mib=memory_mib,
            cpu_millicores=cpu_millicores,
            host_memory_mib=host_memory_mib,
            any_flavor=any_flavor,
        ),
        preemptions=preemption_count,
        priority=priority,
        preemptible=preemptible,
        submitted_at=_epoch(submitted_at) or 0.0,
        kind=_KINDS[kind],
        replicas=replicas,
        topology=_TOPOLOGIES[topology],
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        node_selector={str(k): str(v) for k, v in node_selector.items()} if node_selector else {},
        preempted_by=frozenset(str(pk) for pk in preempted_by) if preempted_by else frozenset(),
        awaiting_approval=state == JobState.PENDING_APPROVAL,
        runtime_estimate_s=float(runtime_estimate_s) if runtime_estimate_s else None,
        last_checkpoint_at=_epoch(last_checkpoint_at),
    )


_KINDS = {kind.value: kind for kind in core.JobKind}
_TOPOLOGIES = {topology.value: topology for topology in core.Topology}


_PENDING_ROWS = CompiledQuery(
    lambda: (
        Job.objects.filter(state__in=PENDING_STATES)
        .order_by("submitted_at", "id")
        .values_list(*PENDING_COLUMNS, *EXPLANATION_COLUMNS)
    )
)
_SERVICE_ROWS = CompiledQuery(
    lambda: (
        Job.objects.filter(kind=JobKind.INFERENCE, state__in=SERVICE_STATES)
        .order_by("submitted_at", "id")
        .values_list(*PENDING_COLUMNS)
    )
)


def _pending(
    allocations: tuple[core.Allocation, ...], names: _Names, stored_explanations: dict[int, tuple] | None
) -> tuple[core.PendingJob, ...]:
    rows = _PENDING_ROWS.rows()
    pending = []
    width = len(PENDING_COLUMNS)
    for row in rows:
        pending.append(pending_job(row, names.tenants))
        if stored_explanations is not None:
            stored_explanations[row[0]] = row[width:]
    return with_last_preemption(pending) + scale_ups(allocations, _SERVICE_ROWS.rows(), names.tenants)


def with_last_preemption(pending: list[core.PendingJob]) -> tuple[core.PendingJob, ...]:
    """``last_preempted_at`` of the jobs preempted before (the engine's borrowing back-off): the time of each
    one's latest transition to PREEMPTING, one query for all of them."""
    preempted = [int(j.job_id) for j in pending if j.preemptions > 0]
    if not preempted:
        return tuple(pending)
    latest = dict(
        JobEvent.objects.filter(AnyOf("job_id", preempted), to_state=JobState.PREEMPTING)
        .values("job_id")
        .annotate(at=Max("created_at"))
        .values_list("job_id", "at")
    )
    return tuple(
        replace(j, last_preempted_at=_epoch(latest.get(int(j.job_id)))) if j.preemptions > 0 else j for j in pending
    )


def scale_ups(
    allocations: tuple[core.Allocation, ...], service_rows: Iterable[tuple], tenants: dict[int, str]
) -> tuple[core.PendingJob, ...]:
    """Running inference services that want more replicas than run: their missing replicas, as pending work
    under the service's own id (so they go onto its reservation first), each replica on its own."""
    replicas: dict[str, set[int]] = defaultdict(set)
    for allocation in allocations:
        replicas[allocation.job_id].add(allocation.replica)
    out = []
    for row in service_rows:
        running = replicas.get(str(row[0]), set())
        missing = row[PENDING_COLUMNS.index("replicas")] - len(running)
        if missing <= 0 or not running:
            continue
        out.append(
            replace(
                pending_job(row, tenants),
                replicas=missing,
                min_replicas=1,
                first_replica=max(running) + 1,
            )
        )
    return tuple(out)


def build_snapshot(
    *,
    now: datetime | None = None,
    previous_usage: dict | None = None,
    stored_explanations: dict[int, tuple] | None = None,
) -> core.Snapshot:
    """The state of the pool as the engine sees it: every node (unschedulable ones keep their allocations),
    active allocations, the tenant tree, quotas, fair-share usage and the pending jobs.

    ``previous_usage`` (what the last cycle stored, see ``decayed_usage``) turns the usage into a
    time-decayed average; without it the usage is the millis held now. ``stored_explanations``, when given, is
    filled with each pending job's stored explanation (pk → reason code, message, position in its tenant,
    overall), so that ``persist_plan`` writes only those that change without reading them again.

    Reads each table once, as plain values (no model instances), about ten queries whatever the pool's size.
    """
    allocation_rows = _allocation_rows()
    reservation_rows = _reservation_rows()
    names = _Names()  # after the rows above: every node, device, tenant and flavor they name exists by now
    allocations = _allocations(allocation_rows, names)
    now_s = (now or timezone.now()).timestamp()
    usage = usage_now(allocations, now_s=now_s, previous_usage=previous_usage)
    return core.Snapshot(
        now=now_s,
        nodes=_nodes(names),
        allocations=allocations,
        tenants=tenants_build(names.tenant_rows, names.tenants),
        quotas=quotas_build(_QUOTA_ROWS.rows()),
        usage=usage,
        pending=_pending(allocations, names, stored_explanations),
        reservations=reservations_build(reservation_rows, names),
        holds=holds_build(_HOLD_ROWS.rows(), names),
    )


def plan_for(snapshot: core.Snapshot, policy: core.Policy | None = None) -> core.Plan:

    return plan(snapshot, policy or policy_from_settings())
