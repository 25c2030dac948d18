"""Read-only summaries the console shows, composed from the apps' models and selectors.

Nothing here writes. Each function returns plain data for a template, already limited to what the caller may
see, so views stay a few lines long.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Count, Q, Sum

from scheduler.fleet import telemetry
from scheduler.fleet.models import Device, DeviceHealth, Node, NodeStatus
from scheduler.models import (
    ACTIVE_JOB_STATES,
    MILLIS_PER_DEVICE,
    PENDING_JOB_STATES,
    Allocation,
    Job,
    JobArray,
    JobState,
)
from tenants.models import Quota

logger = logging.getLogger(__name__)


@dataclass
class FlavorCapacity:
    name: str
    devices: int = 0
    schedulable_devices: int = 0
    capacity_millis: int = 0
    # Allocated on schedulable cards (what the bar compares with capacity), and on the flavor's other cards
    # (cordoned, draining, not ready or unhealthy nodes: jobs still running where nothing new is placed).
    allocated_millis: int = 0
    allocated_unschedulable_millis: int = 0
    memory_mib: int = 0
    # Average utilisation of the flavor's cards from the latest telemetry (None: no recent values).
    utilisation_pct: float | None = None

    @property
    def free_millis(self) -> int:
        return max(0, self.capacity_millis - self.allocated_millis)


@dataclass
class PoolSummary:
    flavors: list[FlavorCapacity] = field(default_factory=list)
    nodes_by_status: dict[str, int] = field(default_factory=dict)
    nodes_total: int = 0
    devices_total: int = 0
    jobs_queued: int = 0
    jobs_running: int = 0

    @property
    def nodes_ready(self) -> int:
        return self.nodes_by_status.get(NodeStatus.READY, 0)

    @property
    def nodes_not_ready(self) -> int:
        return self.nodes_total - self.nodes_ready


def device_allocated_millis() -> dict[int, int]:
    """Millis held by active allocations, per device id."""
    rows = Allocation.objects.active().values("device_id").annotate(total=Sum("millis"))
    return {row["device_id"]: row["total"] for row in rows}


def flavor_capacity() -> list[FlavorCapacity]:
    """Cards, schedulable capacity and allocation per flavor (no live telemetry): the one source of the
    overview's capacity bars, the overcommit warning and the quota form's default flavor."""
    flavors, _devices = _flavor_capacity()
    return sorted(flavors.values(), key=lambda f: f.name)


def _flavor_capacity() -> tuple[dict[str, FlavorCapacity], list[Device]]:
    allocated = device_allocated_millis()
    flavors: dict[str, FlavorCapacity] = {}
    devices = list(
        Device.objects.select_related("flavor", "node").only(
            "id", "uuid", "node_id", "memory_mib", "health", "flavor__name", "node__status"
        )
    )
    for device in devices:
        name = device.flavor.name if device.flavor else "—"
        row = flavors.setdefault(name, FlavorCapacity(name=name))
        row.devices += 1
        row.memory_mib += device.memory_mib
        if device.node.status == NodeStatus.READY and device.health != DeviceHealth.UNHEALTHY:
            row.schedulable_devices += 1
            row.capacity_millis += MILLIS_PER_DEVICE
            row.allocated_millis += allocated.get(device.pk, 0)
        else:
            row.allocated_unschedulable_millis += allocated.get(device.pk, 0)
    return flavors, devices


@dataclass
class Overcommit:
    flavor: str
    guaranteed_millis: int
    schedulable_millis: int


def guarantee_overcommit(change_millis: dict[str, int] | None = None) -> list[Overcommit]:
    """Flavors whose guarantees (summed over the top-level tenants; those below fit inside their parents)
    exceed the pool's schedulable cards: promises the pool cannot keep at once. ``change_millis`` adds a
    pending change per flavor (what approving a request would make of it)."""
    capacity = {row.name: row.capacity_millis for row in flavor_capacity()}
    totals = {
        row["flavor__name"]: row["total"] or 0
        for row in Quota.objects.filter(tenant__parent__isnull=True)
        .values("flavor__name")
        .annotate(total=Sum("guaranteed_millis"))
    }
    for name, delta in (change_millis or {}).items():
        totals[name] = totals.get(name, 0) + delta
    rows = [{"flavor__name": name, "total": total} for name, total in sorted(totals.items())]
    return [
        Overcommit(
            flavor=row["flavor__name"],
            guaranteed_millis=row["total"],
            schedulable_millis=capacity.get(row["flavor__name"], 0),
        )
        for row in rows
        if row["total"] and row["total"] > capacity.get(row["flavor__name"], 0)
    ]


def pool_summary() -> PoolSummary:
    """Capacity vs. allocation per flavor, nodes by status, and the queue: the overview dashboard's numbers."""
    summary = PoolSummary()
    flavors, devices = _flavor_capacity()
    _add_live_utilisation(flavors, devices)
    summary.flavors = sorted(flavors.values(), key=lambda f: f.name)
    summary.devices_total = sum(f.devices for f in summary.flavors)
    counts = Node.objects.values("status").annotate(n=Count("id"))
    summary.nodes_by_status = {row["status"]: row["n"] for row in counts}
    summary.nodes_total = sum(summary.nodes_by_status.values())
    summary.jobs_queued, summary.jobs_running = job_counts()
    return summary


def _add_live_utilisation(flavors: dict[str, FlavorCapacity], devices) -> None:
    """Fill ``utilisation_pct`` from the fleet's store of latest values (Redis, or memory when embedded)."""
    import redis

    devices = list(devices)
    try:
        latest = telemetry.latest_store().get_nodes({d.node_id for d in devices})
    except (OSError, redis.RedisError):
        # Live numbers are a nicety here: the page still shows capacity and allocation without them.
        logger.warning("latest telemetry unavailable for the overview", exc_info=True)
        return
    readings: dict[str, list[float]] = {}
    for device in devices:
        values = latest.get(device.node_id, {}).get(device.uuid)
        utilisation = values.get("utilization_pct") if values else None
        if isinstance(utilisation, int | float):
            readings.setdefault(device.flavor.name if device.flavor else "—", []).append(float(utilisation))
    for name, values in readings.items():
        if name in flavors:
            flavors[name].utilisation_pct = sum(values) / len(values)


def node_utilisation(nodes) -> dict[int, float]:
    """Average live utilisation of each node's cards (node id → percent), from the fleet's latest values."""
    import redis

    ids = [n.pk for n in nodes]
    try:
        latest = telemetry.latest_store().get_nodes(ids)
    except (OSError, redis.RedisError):
        logger.warning("latest telemetry unavailable for the node table", exc_info=True)
        return {}
    result = {}
    for node_id, devices in latest.items():
        values = [v.get("utilization_pct") for v in devices.values()]
        values = [float(v) for v in values if isinstance(v, int | float)]
        if values:
            result[node_id] = sum(values) / len(values)
    return result


def job_counts(tenant_ids: set[int] | None = None) -> tuple[int, int]:
    """(waiting, running) jobs, optionally limited to some tenants."""
    jobs = Job.objects.all()
    if tenant_ids is not None:
        jobs = jobs.filter(tenant_id__in=tenant_ids)
    counts = jobs.aggregate(
        queued=Count("id", filter=Q(state__in=[JobState.SUBMITTED, *PENDING_JOB_STATES])),
        running=Count("id", filter=Q(state__in=ACTIVE_JOB_STATES)),
    )
    arrays = JobArray.objects.filter(waiting__gt=0)  # tasks not rows yet: queued all the same
    if tenant_ids is not None:
        arrays = arrays.filter(tenant_id__in=tenant_ids)
    not_yet_rows = arrays.aggregate(n=Sum("waiting"))["n"] or 0
    return counts["queued"] + not_yet_rows, counts["running"]


def devices_for_charts(devices: Iterable[Device]) -> list[dict]:
    """What the live charts need to know about each card (no secrets: uuid, label, flavor, memory)."""
    return [
        {
            "uuid": d.uuid,
            "label": f"{d.node.name}/{d.index}",
            "flavor": d.flavor.name if d.flavor else "—",
            "memory_mib": d.memory_mib,
        }
        for d in devices
    ]


def job_chart_devices(allocations: Iterable[Allocation]) -> list[dict]:
    """``devices_for_charts`` of a job's active allocations, once per card, with the job's share of each card it
    shares (``job_millis`` under 1000) and what all jobs hold on that card (``card_allocated_millis``), so the
    chart draws the job's part of the card's work and not other tenants' as if it were the job's."""
    mine: dict[int, int] = {}
    devices: dict[int, Device] = {}
    for allocation in allocations:
        mine[allocation.device_id] = mine.get(allocation.device_id, 0) + allocation.millis
        devices[allocation.device_id] = allocation.device
    shared = [device_id for device_id, millis in mine.items() if millis < MILLIS_PER_DEVICE]
    on_card = {}
    if shared:
        rows = (
            Allocation.objects.active().filter(device_id__in=shared).values("device_id").annotate(total=Sum("millis"))
        )
        on_card = {row["device_id"]: row["total"] for row in rows.order_by()}
    charts = []
    for device_id, chart in zip(devices, devices_for_charts(devices.values()), strict=True):
        if device_id in on_card:
            chart.update(job_millis=mine[device_id], card_allocated_millis=on_card[device_id])
        charts.append(chart)
    return charts


#: Colour steps of the fleet heatmap: h0 (under 5 %) up to h10 (95 % and more); hn = no recent telemetry.
HEAT_STEPS = 10


def _half_up(value: float) -> int:
    """Rounded as the page's script rounds live readings (``Math.round``: 4.5 → 5), so a cell does not change
    colour when the first live reading repeats the one the page was drawn with."""
    return math.floor(value + 0.5)


@dataclass
class HeatCell:
    uuid: str
    index: int
    utilisation_pct: float | None
    allocated_millis: int
    label: str = ""
    label_template: str = ""

    @property
    def level(self) -> str:
        if self.utilisation_pct is None:
            return "hn"
        return f"h{max(0, min(HEAT_STEPS, _half_up(self.utilisation_pct / (100 / HEAT_STEPS))))}"

    @property
    def allocation(self) -> str:
        """``free``, ``part`` (a share of the card is allocated) or ``full``: the cell's outline."""
        if self.allocated_millis <= 0:
            return "free"
        return "full" if self.allocated_millis >= MILLIS_PER_DEVICE else "part"


@dataclass
class HeatRow:
    node_id: int
    name: str
    status: str
    cells: list[HeatCell] = field(default_factory=list)


def fleet_heatmap() -> list[HeatRow]:
    """Every node's cards with their latest utilisation and allocated share, for the overview's heatmap (system
    admins): two queries and one read of the latest values, however many nodes."""
    import redis
    from django.utils.translation import gettext

    allocated = device_allocated_millis()
    rows: dict[int, HeatRow] = {}
    devices = Device.objects.select_related("node").only("id", "uuid", "index", "node__name", "node__status")
    for device in devices.order_by("node__name", "index"):
        row = rows.get(device.node_id)
        if row is None:
            row = rows[device.node_id] = HeatRow(
                node_id=device.node_id, name=device.node.name, status=device.node.status
            )
        row.cells.append(HeatCell(device.uuid, device.index, None, allocated.get(device.pk, 0)))
    try:
        latest = telemetry.latest_store().get_nodes(rows)
    except (OSError, redis.RedisError):
        logger.warning("latest telemetry unavailable for the heatmap", exc_info=True)
        latest = {}
    no_data, utilised = gettext("no data"), gettext("%(pct)s utilised")
    for row in rows.values():
        values = latest.get(row.node_id, {})
        for cell in row.cells:
            utilisation = (values.get(cell.uuid) or {}).get("utilization_pct")
            if isinstance(utilisation, int | float) and not isinstance(utilisation, bool):
                cell.utilisation_pct = float(utilisation)
            # "{util}" stays in the template: the page's script puts each live reading there.
            cell.label_template = gettext("%(node)s, card %(index)s: %(util)s, %(share)s allocated") % {
                "node": row.name,
                "index": cell.index,
                "util": "{util}",
                "share": f"{round(100 * min(cell.allocated_millis, MILLIS_PER_DEVICE) / MILLIS_PER_DEVICE)}%",
            }
            reading = None if cell.utilisation_pct is None else f"{_half_up(cell.utilisation_pct)}%"
            shown = no_data if reading is None else utilised % {"pct": reading}
            cell.label = cell.label_template.replace("{util}", shown)
    return list(rows.values())
