"""The incremental snapshot: the pool's state kept between cycles and brought up to date by what changed.

``build_snapshot`` reads every node, device, allocation and pending job each cycle: about 4 s at 10,000 nodes
and 100,000 jobs, half of a cycle. ``LiveSnapshot`` reads them once, then, each cycle, only the rows that
changed since its last read, and gives the engine the same ``core.Snapshot`` a full read would (same order,
same values).

What changed comes from the change log (``SnapshotChange``, written by the triggers of migration 0014 on every
table the snapshot reads). Each read starts by taking the oldest transaction id still running
(``pg_snapshot_xmin``): every transaction below it has ended, so its rows are visible to the reads that follow.
The next read takes the log's rows at or above that id: a transaction that wrote before one read and committed
after it is read the next time (a sequence number would miss it: its number is below what was read already).
Rows read twice are applied twice, which changes nothing.

It falls back to a full read when it has none (first cycle), when its last read's transaction did not commit
(a cycle writes array rows before it reads: a rollback would leave them in the state), when the log was pruned
past its last read (another worker's, or a reader idle for long), on another database than PostgreSQL, and
every ``full_every_s`` to prove the two agree: it then refreshes both and compares them, logs any difference
and keeps the full one.

Orders are sorted here with ``sortedcontainers`` (the same keys ``build_snapshot`` sorts by), so a cycle that
changes a few rows touches a few entries, not 100,000.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime
from time import monotonic
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone
from sortedcontainers import SortedDict

from catalog.models import ResourceFlavor
from kernel.db.bulk import AnyOf
from scheduler import snapshot as full
from scheduler.core import types as core
from scheduler.fleet.models import Device, Node
from scheduler.models import (
    Allocation,
    CapacityHold,
    InferenceReservation,
    Job,
    JobKind,
    SnapshotChangeHorizon,
)
from tenants.models import Quota, Tenant

logger = logging.getLogger(__name__)

#: How often a live snapshot is compared with a full read (seconds); and how far back the change log is kept
#: beyond a reader's last read (other workers' readers stay incremental if they read within this time).
FULL_EVERY_S = 300.0
PRUNE_LAG_S = 300.0
#: The change log's source for a TRUNCATE of any table the snapshot reads.
TRUNCATED = "*"
PRUNE_EVERY_S = 60.0
_WIDTH = len(full.PENDING_COLUMNS)

_WATERMARK_SQL = (
    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
    "coalesce((SELECT max(pruned_below) FROM scheduler_snapshotchangehorizon), 0)"
)
_CHANGES_SQL = "SELECT source, array_agg(DISTINCT row_id) FROM scheduler_snapshotchange WHERE xid >= %s GROUP BY source"


def supported() -> bool:
    """Whether this database keeps the change log (PostgreSQL: migration 0014's triggers)."""
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql"


def log_prune(below: int | None = None) -> None:
    """Delete the change log below transaction id ``below`` (None: below the oldest running transaction, all
    that any reader could have read) and raise the horizon so that a reader that had not read it reads in
    full. Housekeeping: a failure is logged, and the next call tries again."""
    if not supported():
        return
    try:
        with transaction.atomic(), connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            if below is None:
                cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
                (below,) = cursor.fetchone()
            updated = SnapshotChangeHorizon.objects.filter(pruned_below__lt=below).update(pruned_below=below)
            if not updated and not SnapshotChangeHorizon.objects.exists():
                SnapshotChangeHorizon.objects.create(pruned_below=below)
            cursor.execute("DELETE FROM scheduler_snapshotchange WHERE xid < %s", [below])
    except Exception:
        logger.warning("could not prune the snapshot change log", exc_info=True)


_unread_pruned_at = 0.0


def log_prune_unread() -> None:
    """With the incremental snapshot off (``GPUPOOL_SNAPSHOT_INCREMENTAL=0``) the triggers still write the log:
    the cycle calls this to delete it, at most every ``PRUNE_EVERY_S``."""
    global _unread_pruned_at
    if monotonic() - _unread_pruned_at >= PRUNE_EVERY_S:
        _unread_pruned_at = monotonic()
        log_prune()


def _by(read: full.CompiledQuery, ids: Iterable[int]) -> list:
    """The rows of ``read`` (one of :data:`_DELTA`) for ``ids``; none asked for, no query."""
    ids = list(ids)
    return read.rows(ids) if ids else []


@dataclass
class _State:
    """The rows a snapshot is made of, by primary key, and what is derived from them."""

    tenants: dict[int, tuple] = field(default_factory=dict)  # _TENANT_ROWS rows
    flavor_rows: dict[int, str] = field(default_factory=dict)
    nodes: dict[int, tuple] = field(default_factory=dict)  # _NODE_ROWS rows
    devices: dict[int, tuple] = field(default_factory=dict)  # _DEVICE_ROWS rows
    node_devices: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    allocations: dict[int, tuple] = field(default_factory=dict)  # ALLOCATION_COLUMNS rows
    job_allocations: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    reservations: dict[int, tuple] = field(default_factory=dict)
    holds: dict[int, tuple] = field(default_factory=dict)
    quotas: dict[int, tuple] = field(default_factory=dict)  # (tenant_id, flavor_id, ...)
    pending: dict[int, tuple] = field(default_factory=dict)  # PENDING_COLUMNS rows
    explanations: dict[int, tuple] = field(default_factory=dict)
    services: dict[int, tuple] = field(default_factory=dict)
    # Derived, kept between cycles: the engine's objects and their orders.
    node_objects: dict[int, core.Node] = field(default_factory=dict)
    node_order: SortedDict = field(default_factory=SortedDict)  # name → pk
    allocation_objects: dict[int, tuple[bool, core.Allocation]] = field(default_factory=dict)
    allocation_order: SortedDict = field(default_factory=SortedDict)  # (job, replica, device, pk) → pk
    pending_objects: dict[int, core.PendingJob] = field(default_factory=dict)
    pending_order: SortedDict = field(default_factory=SortedDict)  # (submitted_at, pk) → pk
    # Names (maps the snapshot's converters take).
    node_names: dict[int, str] = field(default_factory=dict)
    device_uuids: dict[int, str] = field(default_factory=dict)


class _Names:
    """The ``snapshot.NameMaps`` of a state (tenant slugs computed once per assembly)."""

    def __init__(self, state: _State) -> None:
        self.tenants = {pk: row[1] for pk, row in state.tenants.items()}
        self.flavors = state.flavor_rows
        self.node_names = state.node_names
        self.device_uuids = state.device_uuids


@dataclass
class Refresh:
    """What one ``LiveSnapshot.build`` did, for the cycle's stats."""

    mode: str  # "full", "incremental" or "checked" (incremental, then compared with a full read)
    changed_rows: int = 0
    differences: list[str] = field(default_factory=list)


class LiveSnapshot:
    """The pool's state between cycles (one per worker process); ``build`` returns the snapshot of now."""

    def __init__(self, *, full_every_s: float = FULL_EVERY_S, prune_lag_s: float = PRUNE_LAG_S) -> None:
        self.full_every_s = full_every_s
        self.prune_lag_s = prune_lag_s
        self._state: _State | None = None
        self._watermark = 0
        self._committed = False
        self._generation = 0
        self._full_at = 0.0
        self._watermarks: deque[tuple[float, int]] = deque()
        self._pruned_at = monotonic()
        self.last = Refresh(mode="none")

    # --- the cycle's entry point ------------------------------------------------------------------------

    def build(
        self,
        *,
        now: datetime | None = None,
        previous_usage: dict | None = None,
        stored_explanations: MutableMapping[int, tuple] | None = None,
    ) -> core.Snapshot:
        """The snapshot ``snapshot.build_snapshot`` would read now, from the rows changed since the last call.

        Call it inside the cycle's transaction: the state counts as read once that transaction commits (a
        rollback makes the next call read in full). ``stored_explanations`` is filled as ``build_snapshot``
        fills it.
        """
        if not supported():
            self.last = Refresh(mode="full")
            return full.build_snapshot(now=now, previous_usage=previous_usage, stored_explanations=stored_explanations)
        if self._state is None or not self._committed or monotonic() - self._full_at >= self.full_every_s:
            checked = self._state is not None and self._committed
            refresh = self._check() if checked else self._load()
        else:
            refresh = self._refresh()
            if refresh is None:  # the log was pruned past this state's last read
                refresh = self._load()
        self.last = refresh
        self._committed = False
        self._generation += 1
        generation = self._generation
        transaction.on_commit(lambda: self._commit(generation))
        snap = self._assemble(self._state, now=now, previous_usage=previous_usage)
        if stored_explanations is not None:
            stored_explanations.update(self._state.explanations)
        return snap

    def explanations_written(self, rows: Iterable[tuple]) -> None:
        """The cycle wrote these pending explanations (``(pk, code, message, in tenant, overall)``): they are
        what the jobs show now (a write the change log does not carry: ``persist.explanations.explanations_write``
        with ``known=True``)."""
        if self._state is None:
            return
        explanations = self._state.explanations
        for pk, *values in rows:
            if pk in explanations:
                explanations[pk] = tuple(values)

    def _commit(self, generation: int) -> None:
        if generation == self._generation:
            self._committed = True
            self._prune()

    # --- reads ----------------------------------------------------------------------------------------------

    def _read_watermark(self) -> tuple[int, int]:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute(_WATERMARK_SQL)
            xmin, pruned_below = cursor.fetchone()
        return int(xmin), int(pruned_below)

    def _load(self) -> Refresh:
        watermark, _pruned = self._read_watermark()
        state = _State()
        # In build_snapshot's order: allocations, reservations, then every name they use.
        allocation_rows = Allocation.objects.active().order_by().values_list("pk", *full.ALLOCATION_COLUMNS)
        reservation_rows = InferenceReservation.objects.order_by().values_list("pk", *_RESERVATION_COLUMNS)
        _apply_allocations(state, list(allocation_rows), removed=())
        state.reservations = {row[0]: row[1:] for row in reservation_rows}
        _apply_plain(state.tenants, _keyed(Tenant.objects.order_by().values_list(*_TENANT_COLUMNS)), set(), pairs=True)
        _apply_plain(state.flavor_rows, ResourceFlavor.objects.order_by().values_list("pk", "name"), set(), pairs=True)
        _apply_nodes(state, Node.objects.order_by().values_list(*_NODE_COLUMNS), removed=())
        _apply_devices(state, Device.objects.order_by().values_list(*_DEVICE_COLUMNS), removed=())
        state.holds = {row[0]: row[1:] for row in CapacityHold.objects.order_by().values_list("pk", *_HOLD_COLUMNS)}
        state.quotas = {row[0]: row[1:] for row in Quota.objects.order_by().values_list("pk", *_QUOTA_COLUMNS)}
        pending_rows = _pending_queryset().values_list(*full.PENDING_COLUMNS, *full.EXPLANATION_COLUMNS)
        _apply_pending(state, list(pending_rows), removed=())
        state.services = {row[0]: row for row in _service_queryset().values_list(*full.PENDING_COLUMNS)}
        self._state = state
        self._watermark = watermark
        self._full_at = monotonic()
        self._watermarks.append((monotonic(), watermark))
        return Refresh(mode="full")

    def _refresh(self) -> Refresh | None:
        state = self._state
        assert state is not None
        watermark, pruned_below = self._read_watermark()
        if pruned_below > self._watermark:
            return None
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute(_CHANGES_SQL, [self._watermark])
            changed: dict[str, set[int]] = {source: set(ids) for source, ids in cursor.fetchall()}
        if TRUNCATED in changed:  # a table was emptied at once (no row triggers fire for that): read anew
            return None
        jobs = changed.get("job", set())
        allocation_ids = changed.get("allocation", set())
        if allocation_ids or jobs:
            # Each read by one indexed key only, the rest filtered here: with a second condition the planner may
            # scan all active allocations and test each against the whole list (it did on a freshly filled pool).
            found: dict[int, tuple] = {}
            for field_name, ids in (("pk", allocation_ids), ("job_id", jobs)):
                for pk, ended_at, *columns in _by(_DELTA[f"allocation.{field_name}"], ids):
                    if ended_at is None:
                        found[pk] = (pk, *columns)
            # Allocations carry their job's columns: a changed job's are read again, by its id; whichever of
            # them is no longer active is gone.
            held = {pk for job in jobs for pk in state.job_allocations.get(job, ())}
            _apply_allocations(state, list(found.values()), removed=(allocation_ids | held) - set(found))
        if ids := changed.get("reservation"):
            rows = list(_by(_DELTA["reservation"], ids))
            _apply_plain(state.reservations, rows, ids)
        names_before = self._names(changed)
        if ids := changed.get("tenant"):
            _apply_plain(state.tenants, _keyed(_by(_DELTA["tenant"], ids)), ids, pairs=True)
        if ids := changed.get("flavor"):
            _apply_plain(state.flavor_rows, _by(_DELTA["flavor"], ids), ids, pairs=True)
            state.node_objects.clear()  # a node's devices carry their flavor's name
        if ids := changed.get("node"):
            rows = list(_by(_DELTA["node"], ids))
            _apply_nodes(state, rows, removed=ids - {row[0] for row in rows})
        if ids := changed.get("device"):
            rows = list(_by(_DELTA["device"], ids))
            _apply_devices(state, rows, removed=ids - {row[0] for row in rows})
        names_after = self._names(changed)
        if any(name is not None and names_after[key] not in (None, name) for key, name in names_before.items()):
            # A name the built objects carry changed (a node renamed, a flavor, a tenant's slug): build them anew.
            state.node_objects.clear()
            state.allocation_objects.clear()
            state.pending_objects.clear()
        if ids := changed.get("hold"):
            rows = list(_by(_DELTA["hold"], ids))
            _apply_plain(state.holds, rows, ids)
        if ids := changed.get("quota"):
            rows = list(_by(_DELTA["quota"], ids))
            _apply_plain(state.quotas, rows, ids)
        if jobs:
            # By primary key only (see the allocations above); pending and services are told apart here.
            pending, services = [], []
            for state_value, kind, *row in _by(_DELTA["job"], jobs):
                if state_value in full.PENDING_STATES:
                    pending.append(tuple(row))
                elif kind == JobKind.INFERENCE and state_value in full.SERVICE_STATES:
                    services.append((row[0], tuple(row[:_WIDTH])))
            _apply_pending(state, pending, removed=jobs - {row[0] for row in pending})
            _apply_plain(state.services, services, jobs, pairs=True)
        self._watermark = watermark
        self._watermarks.append((monotonic(), watermark))
        return Refresh(mode="incremental", changed_rows=sum(len(ids) for ids in changed.values()))

    def _names(self, changed: dict[str, set[int]]) -> dict[tuple[str, int], str | None]:
        """The names of the changed tenants, flavors, nodes and devices (to see whether one was renamed)."""
        state = self._state
        assert state is not None
        lookups = (
            ("tenant", lambda pk: state.tenants[pk][1] if pk in state.tenants else None),
            ("flavor", state.flavor_rows.get),
            ("node", state.node_names.get),
            ("device", state.device_uuids.get),
        )
        return {(source, pk): lookup(pk) for source, lookup in lookups for pk in changed.get(source, ())}

    def _check(self) -> Refresh:
        """Refresh this state, read another in full, and compare them (rows and the snapshots made of them). A
        write that commits between the two reads shows as a difference, so both are refreshed again, up to
        three times, before one is reported. The full read is kept."""
        refreshed = self._refresh()
        if refreshed is None:
            return self._load()
        live, live_watermark = self._state, self._watermark
        self._load()
        fresh, fresh_watermark = self._state, self._watermark
        differences: list[str] = []
        for _attempt in range(3):
            differences = _differences(live, fresh)
            if not differences:
                break
            self._state, self._watermark = live, live_watermark
            if self._refresh() is None:
                break
            live_watermark = self._watermark
            self._state, self._watermark = fresh, fresh_watermark
            if self._refresh() is None:
                break
            fresh_watermark = self._watermark
        if not differences:
            at = timezone.now()
            if self._assemble(live, now=at, previous_usage=None) != self._assemble(fresh, now=at, previous_usage=None):
                differences = ["the snapshots made of the same rows (objects kept between cycles)"]
        if differences:
            logger.error(
                "the incremental snapshot differed from a full read; the full read is kept: %s",
                "; ".join(differences[:10]),
            )
        self._state, self._watermark = fresh, fresh_watermark
        return Refresh(mode="checked", changed_rows=refreshed.changed_rows, differences=differences)

    def _prune(self) -> None:
        """Delete the change log below the watermark this reader had ``prune_lag_s`` ago (every reader that read
        since keeps reading increments; one that did not reads in full)."""
        if monotonic() - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = monotonic()
        cutoff = monotonic() - self.prune_lag_s
        horizon = None
        while self._watermarks and self._watermarks[0][0] <= cutoff:
            horizon = self._watermarks.popleft()[1]
        if horizon is None:
            return
        log_prune(horizon)

    # --- the snapshot -------------------------------------------------------------------------------------

    @staticmethod
    def _assemble(state: _State, *, now: datetime | None, previous_usage: dict | None) -> core.Snapshot:
        names = _Names(state)
        allocations = _allocations(state, names)
        now_s = (now or timezone.now()).timestamp()
        usage = full.usage_now(allocations, now_s=now_s, previous_usage=previous_usage)
        return core.Snapshot(
            now=now_s,
            nodes=_nodes(state),
            allocations=allocations,
            tenants=full.tenants_build(state.tenants.values(), names.tenants),
            quotas=full.quotas_build(
                (names.tenants[row[0]], names.flavors[row[1]], *row[2:]) for row in state.quotas.values()
            ),
            usage=usage,
            pending=_pending(state, names)
            + full.scale_ups(allocations, sorted(state.services.values(), key=_submitted), names.tenants),
            reservations=full.reservations_build(
                (row[:7] for row in sorted(state.reservations.values(), key=_job_replica_device)), names
            ),
            holds=full.holds_build(sorted(state.holds.values(), key=_job_device), names),
        )


# --- columns (the full read's, with the primary key first where it has none) -----------------------------

_TENANT_COLUMNS = ("pk", "slug", "parent_id")
_NODE_COLUMNS = full.NODE_COLUMNS
_DEVICE_COLUMNS = full.DEVICE_COLUMNS
_RESERVATION_COLUMNS = ("job_id", "tenant_id", "node_id", "device_id", "flavor_id", "millis", "memory_mib", "replica")
_HOLD_COLUMNS = ("job_id", "device_id", "victim_ids", "since")
_QUOTA_COLUMNS = (
    "tenant_id",
    "flavor_id",
    "guaranteed_millis",
    "limit_millis",
    "lending_limit_millis",
    "max_running_jobs",
)


def _pending_queryset() -> Any:
    return Job.objects.filter(state__in=full.PENDING_STATES).order_by()


def _service_queryset() -> Any:
    return Job.objects.filter(kind=JobKind.INFERENCE, state__in=full.SERVICE_STATES).order_by()


def _delta(model: Any, key: str, *columns: str) -> full.CompiledQuery:
    """A change read: the rows of ``model`` whose ``key`` is one of a list, by that one indexed key only (with a
    second condition the planner may scan all active allocations and test each against the whole list; it did
    on a freshly filled pool), compiled once (building and compiling the queryset every cycle was most of an
    idle cycle's snapshot CPU)."""
    return full.CompiledQuery(
        lambda ids: model.objects.order_by().filter(AnyOf(key, ids)).values_list(*columns), arguments=1
    )


#: The reads of the rows the change log names, by source.
_DELTA: dict[str, full.CompiledQuery] = {
    "allocation.pk": _delta(Allocation, "pk", "pk", "ended_at", *full.ALLOCATION_COLUMNS),
    "allocation.job_id": _delta(Allocation, "job_id", "pk", "ended_at", *full.ALLOCATION_COLUMNS),
    "reservation": _delta(InferenceReservation, "pk", "pk", *_RESERVATION_COLUMNS),
    "tenant": _delta(Tenant, "pk", *_TENANT_COLUMNS),
    "flavor": _delta(ResourceFlavor, "pk", "pk", "name"),
    "node": _delta(Node, "pk", *_NODE_COLUMNS),
    "device": _delta(Device, "pk", *_DEVICE_COLUMNS),
    "hold": _delta(CapacityHold, "pk", "pk", *_HOLD_COLUMNS),
    "quota": _delta(Quota, "pk", "pk", *_QUOTA_COLUMNS),
    "job": _delta(Job, "pk", "state", "kind", *full.PENDING_COLUMNS, *full.EXPLANATION_COLUMNS),
}


def _keyed(rows: Iterable[tuple]) -> list[tuple[int, tuple]]:
    """``(pk, row)`` pairs, for a table that keeps whole rows (tenants: the shape ``tenants_build`` takes)."""
    return [(row[0], row) for row in rows]


def _submitted(row: tuple) -> tuple:
    return row[full.PENDING_COLUMNS.index("submitted_at")], row[0]


def _job_replica_device(row: tuple) -> tuple:
    return row[0], row[7], row[3]


def _job_device(row: tuple) -> tuple:
    return row[0], row[1]


# --- applying rows ----------------------------------------------------------------------------------------


def _apply_plain(table: dict[int, Any], rows: Iterable[tuple], ids: set[int], *, pairs: bool = False) -> None:
    """Rows read by ``ids``: those found replace, the others are gone. A row is ``(pk, *columns)``, kept as
    its columns; with ``pairs``, ``(pk, value)``, kept as the value."""
    found = set()
    for row in rows:
        found.add(row[0])
        table[row[0]] = row[1] if pairs else row[1:]
    for pk in ids - found:
        table.pop(pk, None)


def _apply_allocations(state: _State, rows: list[tuple], *, removed: Iterable[int]) -> None:
    for pk in removed:
        _allocation_remove(state, pk)
    for pk, *columns in rows:
        _allocation_remove(state, pk)
        row = tuple(columns)
        state.allocations[pk] = row
        state.job_allocations[row[0]].add(pk)
        state.allocation_order[(row[0], row[1], row[2], pk)] = pk


def _allocation_remove(state: _State, pk: int) -> None:
    row = state.allocations.pop(pk, None)
    if row is None:
        return
    state.allocation_objects.pop(pk, None)
    del state.allocation_order[(row[0], row[1], row[2], pk)]
    held = state.job_allocations.get(row[0])
    if held is not None:
        held.discard(pk)
        if not held:
            del state.job_allocations[row[0]]
    # The replica's first row may now be another one: its neighbours are rebuilt as they are assembled.


def _apply_nodes(state: _State, rows: Iterable[tuple], *, removed: Iterable[int]) -> None:
    for pk in removed:
        _node_remove(state, pk)
    for row in rows:
        _node_remove(state, row[0])
        state.nodes[row[0]] = row
        state.node_names[row[0]] = row[1]
        state.node_order[row[1]] = row[0]


def _node_remove(state: _State, pk: int) -> None:
    row = state.nodes.pop(pk, None)
    state.node_objects.pop(pk, None)
    state.node_names.pop(pk, None)
    if row is not None and state.node_order.get(row[1]) == pk:
        del state.node_order[row[1]]


def _apply_devices(state: _State, rows: Iterable[tuple], *, removed: Iterable[int]) -> None:
    for pk in removed:
        _device_remove(state, pk)
    for row in rows:
        _device_remove(state, row[0])
        state.devices[row[0]] = row
        state.device_uuids[row[0]] = row[2]
        state.node_devices[row[1]].add(row[0])
        state.node_objects.pop(row[1], None)


def _device_remove(state: _State, pk: int) -> None:
    row = state.devices.pop(pk, None)
    state.device_uuids.pop(pk, None)
    if row is not None:
        state.node_devices[row[1]].discard(pk)
        state.node_objects.pop(row[1], None)


def _apply_pending(state: _State, rows: list[tuple], *, removed: Iterable[int]) -> None:
    for pk in removed:
        _pending_remove(state, pk)
    for row in rows:
        pk = row[0]
        _pending_remove(state, pk)
        state.pending[pk] = row[:_WIDTH]
        state.explanations[pk] = row[_WIDTH:]
        state.pending_order[(row[full.PENDING_COLUMNS.index("submitted_at")], pk)] = pk


def _pending_remove(state: _State, pk: int) -> None:
    row = state.pending.pop(pk, None)
    if row is None:
        return
    state.explanations.pop(pk, None)
    state.pending_objects.pop(pk, None)
    del state.pending_order[(row[full.PENDING_COLUMNS.index("submitted_at")], pk)]


# --- assembling -------------------------------------------------------------------------------------------


def _nodes(state: _State) -> tuple[core.Node, ...]:
    objects = state.node_objects
    result = []
    for pk in state.node_order.values():
        node = objects.get(pk)
        if node is None:
            devices = sorted((state.devices[d] for d in state.node_devices.get(pk, ())), key=_device_index)
            node = objects[pk] = full.node_build(state.nodes[pk], devices, state.flavor_rows)
        result.append(node)
    return tuple(result)


def _device_index(row: tuple) -> int:
    return row[3]


def _allocations(state: _State, names: _Names) -> tuple[core.Allocation, ...]:
    objects = state.allocation_objects
    rows = state.allocations
    result = []
    previous = None
    for key, pk in state.allocation_order.items():
        replica = key[:2]
        first = replica != previous
        previous = replica
        cached = objects.get(pk)
        if cached is None or cached[0] != first:
            cached = objects[pk] = (first, full.allocation_build(rows[pk], names, first_of_replica=first))
        result.append(cached[1])
    return tuple(result)


def _pending(state: _State, names: _Names) -> tuple[core.PendingJob, ...]:
    objects = state.pending_objects
    missing = [pk for pk in state.pending if pk not in objects]
    if missing:
        built = full.with_last_preemption([full.pending_job(state.pending[pk], names.tenants) for pk in missing])
        for job in built:
            objects[int(job.job_id)] = job
    return tuple(objects[pk] for pk in state.pending_order.values())


def _differences(live: _State | None, fresh: _State | None) -> list[str]:
    """What two states disagree on, as ``table: pk`` lines (rows, not the objects built from them)."""
    assert live is not None and fresh is not None
    differences = []
    for name in (
        "tenants",
        "flavor_rows",
        "nodes",
        "devices",
        "allocations",
        "reservations",
        "holds",
        "quotas",
        "pending",
        "explanations",
        "services",
    ):
        mine, theirs = getattr(live, name), getattr(fresh, name)
        for pk in sorted(set(mine) | set(theirs)):
            if mine.get(pk) != theirs.get(pk):
                differences.append(f"{name}: {pk}")
    return differences
