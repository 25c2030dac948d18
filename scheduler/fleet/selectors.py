"""Reads of the fleet: who may watch which telemetry, which devices a tenant holds, what /metrics shows."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Min, Q, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from audit import selectors as audit_selectors
from kernel.access_rules import Action
from scheduler.fleet.models import (
    BootstrapToken,
    Device,
    DeviceHealth,
    Node,
    NodeCredential,
    NodeStatus,
    TelemetryMinute,
)
from scheduler.fleet.telemetry import latest_store, minute_of
from scheduler.models import FINAL_JOB_STATES, MILLIS_PER_DEVICE, Allocation, Job, JobArray, JobState
from tenants.access import reaches_all, restrict
from tenants.models import Quota, Tenant

#: /metrics' queue wait: the jobs admitted in this many seconds before the scrape, ...
QUEUE_WAIT_WINDOW_S = 15 * 60
#: ... among those submitted in this many days (bounds the scan to the submitted_at index).
QUEUE_WAIT_LOOKBACK_DAYS = 7
QUEUE_WAIT_QUANTILES = (0.5, 0.95)


def _active_allocations() -> QuerySet:
    return Allocation.objects.filter(ended_at__isnull=True)


def is_telemetry_admin(user: Any) -> bool:
    """Whether ``user`` watches every node (the policy's ``telemetry.view`` in scope ``all``: the system admin;
    the other platform roles watch none, separation of duties keeps them out of operations)."""
    return reaches_all(user, Action.TELEMETRY_VIEW)


def telemetry_tenant_ids_for(user: Any) -> list[int]:
    """Tenants whose allocated devices ``user`` may watch: the subtrees of the user's memberships.

    Empty for whoever watches every node (``is_telemetry_admin``) and for those with no such rule.
    """
    if reaches_all(user, Action.TELEMETRY_VIEW):
        return []
    return list(restrict(Tenant.objects.all(), user, Action.TELEMETRY_VIEW).values_list("pk", flat=True))


def device_tenants_of_node(*, node_id: int) -> dict[str, set[int]]:
    """Device UUID → tenants holding an active allocation on it, for one node (used by the agent consumer to
    send each tenant only its own devices)."""
    allocations = _active_allocations()
    result: dict[str, set[int]] = defaultdict(set)
    for uuid, tenant_id in allocations.filter(node_id=node_id).values_list("device__uuid", "tenant_id"):
        result[uuid].add(tenant_id)
    return dict(result)


def device_tenants_of_nodes(*, node_ids: list[int]) -> dict[int, dict[str, set[int]]]:
    """``device_tenants_of_node`` for many nodes in one query (node id → device UUID → tenant ids)."""
    result: dict[int, dict[str, set[int]]] = {node_id: {} for node_id in node_ids}
    rows = _active_allocations().filter(node_id__in=node_ids).values_list("node_id", "device__uuid", "tenant_id")
    for node_id, uuid, tenant_id in rows:
        result[node_id].setdefault(uuid, set()).add(tenant_id)
    return result


def tenant_devices(*, tenant_ids: list[int]) -> dict[int, set[str]]:
    """Node id → UUIDs of devices with an active allocation of one of ``tenant_ids``."""
    allocations = _active_allocations()
    if not tenant_ids:
        return {}
    result: dict[int, set[str]] = defaultdict(set)
    for node_id, uuid in allocations.filter(tenant_id__in=tenant_ids).values_list("node_id", "device__uuid"):
        result[node_id].add(uuid)
    return dict(result)


def tenant_devices_held_since(*, tenant_ids: list[int]) -> dict[str, dt.datetime]:
    """Device UUID → when the earliest active allocation of one of ``tenant_ids`` on it began: the cards of
    ``tenant_devices``, each with the moment the tenants' holding of it began."""
    if not tenant_ids:
        return {}
    rows = (
        _active_allocations()
        .filter(tenant_id__in=tenant_ids)
        .order_by()
        .values("device__uuid")
        .annotate(since=Min("started_at"))
    )
    return {row["device__uuid"]: row["since"] for row in rows}


@dataclass(frozen=True)
class TelemetryView:
    """What telemetry one person may read: every card (system admins), or the cards the person's tenants hold
    now, each from the moment that holding began (what the card did for someone else before is not theirs)."""

    all_cards: bool
    held_since: dict[str, dt.datetime] = field(default_factory=dict)


def telemetry_view_for(user: Any) -> TelemetryView | None:
    """The live stream's rule (``TelemetryConsumer.connect``) for reads of stored telemetry; None: nothing."""
    if is_telemetry_admin(user):
        return TelemetryView(all_cards=True)
    tenant_ids = telemetry_tenant_ids_for(user)
    if not tenant_ids:
        return None
    return TelemetryView(all_cards=False, held_since=tenant_devices_held_since(tenant_ids=tenant_ids))


#: The longest stretch of minute rollups one history read returns (a day: 1,440 points per card).
HISTORY_MAX_MINUTES = 24 * 60
#: A minute's rollup is drawn at the middle of its minute, where its average belongs.
_MINUTE_MIDDLE_S = 30


def _history_rows(
    *, view: TelemetryView, now: dt.datetime, minutes: int, node_id: int | None, uuids: list[str] | None
) -> QuerySet:
    """The minute rollups of the last ``minutes`` the viewer may read, optionally of one node or some cards."""
    rows = TelemetryMinute.objects.filter(minute__gte=minute_of(now) - dt.timedelta(minutes=minutes))
    if node_id is not None:
        rows = rows.filter(device__node_id=node_id)
    if uuids:
        rows = rows.filter(device__uuid__in=uuids)
    if not view.all_cards:
        if not view.held_since:
            return rows.none()
        held = Q()
        for uuid, since in view.held_since.items():
            held |= Q(device__uuid=uuid, minute__gte=minute_of(since))
        rows = rows.filter(held)
    return rows


def _epoch_s(minute: dt.datetime) -> float:
    return minute.timestamp() + _MINUTE_MIDDLE_S


def telemetry_history(
    *,
    view: TelemetryView,
    now: dt.datetime,
    minutes: int = 60,
    node_id: int | None = None,
    uuids: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Per card the viewer may read: its minute rollups of the last ``minutes`` as columns a chart draws
    (``t`` in epoch seconds, the middle of each minute; utilisation and memory averages, power average,
    temperature maximum). Cards without rollups in the window are left out. One query."""
    rows = (
        _history_rows(view=view, now=now, minutes=minutes, node_id=node_id, uuids=uuids)
        .order_by("device__node__name", "device__index", "minute")
        .values_list(
            "device__uuid",
            "device__node_id",
            "device__node__name",
            "device__index",
            "device__flavor__name",
            "device__memory_mib",
            "minute",
            "utilization_avg_pct",
            "memory_used_avg_mib",
            "power_avg_w",
            "temperature_max_c",
        )
    )
    cards: dict[str, dict[str, Any]] = {}
    for uuid, node, node_name, index, flavor, memory_mib, minute, utilisation, memory, power, temperature in rows:
        card = cards.get(uuid)
        if card is None:
            card = cards[uuid] = {
                "uuid": uuid,
                "node": node,
                "node_name": node_name,
                "index": index,
                "flavor": flavor or "",
                "memory_mib": memory_mib,
                "t": [],
                "utilization_pct": [],
                "memory_used_mib": [],
                "power_w": [],
                "temperature_c": [],
            }
        card["t"].append(_epoch_s(minute))
        card["utilization_pct"].append(round(utilisation, 2))
        card["memory_used_mib"].append(round(memory, 1))
        card["power_w"].append(None if power is None else round(power, 1))
        card["temperature_c"].append(temperature)
    return list(cards.values())


def telemetry_history_by_flavor(*, view: TelemetryView, now: dt.datetime, minutes: int = 60) -> list[dict[str, Any]]:
    """Average utilisation of the viewer's readable cards per flavor and minute (each card counts once, as on
    the live chart), for the last ``minutes``: one grouped query, however many cards."""
    rows = (
        _history_rows(view=view, now=now, minutes=minutes, node_id=None, uuids=None)
        .order_by()
        .values("minute", "device__flavor__name")
        .annotate(utilisation=Avg("utilization_avg_pct"), cards=Count("device_id"))
        .order_by("device__flavor__name", "minute")
    )
    flavors: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = row["device__flavor__name"] or "—"
        series = flavors.setdefault(name, {"flavor": name, "t": [], "utilization_pct": [], "cards": []})
        series["t"].append(_epoch_s(row["minute"]))
        series["utilization_pct"].append(round(row["utilisation"], 2))
        series["cards"].append(row["cards"])
    return list(flavors.values())


def credential_is_active(*, credential_id: int) -> bool:
    return NodeCredential.objects.filter(pk=credential_id, revoked_at__isnull=True).exists()


def node_exists(*, node_id: int) -> bool:
    return Node.objects.filter(pk=node_id).exists()


def node_names(*, node_ids: list[int]) -> dict[int, str]:
    return dict(Node.objects.filter(pk__in=node_ids).values_list("pk", "name"))


def bootstrap_tokens_recent(*, limit: int = 20) -> list[BootstrapToken]:
    """The newest bootstrap tokens (prefix, expiry, use — never a secret), for the console's enrolment page."""
    return list(BootstrapToken.objects.select_related("created_by", "used_by_node").order_by("-created_at")[:limit])


def active_credential_count(*, node: Node) -> int:
    return NodeCredential.objects.filter(node=node, revoked_at__isnull=True).count()


def metrics_snapshot() -> dict[str, Any]:
    """Everything /metrics prints, read in a handful of queries plus one Redis pipeline."""
    nodes = list(Node.objects.order_by("name").values("pk", "name", "status"))
    allocations = _active_allocations()
    # Per card: its latest values (one Redis read per node), its tenants and what it holds. Without them
    # (GPUPOOL_METRICS_PER_CARD off) a scrape reads and writes a few lines per node, not per card.
    devices: list[dict[str, Any]] = []
    latest: dict[int, dict[str, dict]] = {}
    device_tenant: dict[str, list[str]] = defaultdict(list)
    device_allocated: dict[str, int] = {}
    if settings.GPUPOOL_METRICS_PER_CARD:
        devices = list(
            Device.objects.select_related("flavor", "node").values(
                "uuid", "index", "model", "node_id", "node__name", "flavor__name", "memory_mib"
            )
        )
        latest = latest_store().get_nodes([node["pk"] for node in nodes])
        for uuid, slug in allocations.order_by().values_list("device__uuid", "tenant__slug").distinct():
            device_tenant[uuid].append(slug)
        device_allocated = {
            row["device__uuid"]: row["millis"]
            for row in allocations.order_by().values("device__uuid").annotate(millis=Sum("millis"))
        }
    # order_by(): the models' default ordering would otherwise join the GROUP BY.
    allocated_by_flavor = {
        row["flavor__name"]: row["millis"]
        for row in allocations.order_by().values("flavor__name").annotate(millis=Sum("millis"))
    }
    jobs_by_state = {row["state"]: row["n"] for row in Job.objects.order_by().values("state").annotate(n=Count("pk"))}
    # An array's tasks that are not rows yet are queued jobs all the same (scheduler.models.JobArray).
    not_yet_rows = JobArray.objects.filter(waiting__gt=0).aggregate(n=Sum("waiting"))["n"] or 0
    if not_yet_rows:
        jobs_by_state[JobState.QUEUED] = jobs_by_state.get(JobState.QUEUED, 0) + not_yet_rows
    now = timezone.now()
    queue_wait_jobs, queue_wait_quantiles = _queue_wait_seconds(now=now)
    return {
        "nodes": nodes,
        "devices": devices,
        "latest": latest,
        "device_tenant": dict(device_tenant),
        "allocated_by_flavor": allocated_by_flavor,
        "jobs_by_state": jobs_by_state,
        "capacity_by_flavor": _capacity_millis_by_flavor(),
        "device_allocated": device_allocated,
        **_tenant_usage(allocations),
        "queue_wait_jobs": queue_wait_jobs,
        "queue_wait_quantiles": queue_wait_quantiles,
        "queue_oldest_pending_seconds": _oldest_queued_seconds(now=now),
        **_audit_sealing(now=now),
        "database_deadlocks": _database_deadlocks(),
    }


def _capacity_millis_by_flavor() -> dict[str, int]:
    """Millis the scheduler may place per flavor: the devices of ready nodes that are not unhealthy."""
    rows = (
        Device.objects.filter(node__status=NodeStatus.READY)
        .exclude(health=DeviceHealth.UNHEALTHY)
        .order_by()
        .values("flavor__name")
        .annotate(devices=Count("pk"))
    )
    return {row["flavor__name"] or "": row["devices"] * MILLIS_PER_DEVICE for row in rows}


def _tenant_usage(allocations: QuerySet) -> dict[str, Any]:
    """Per tenant (slug) and flavor: millis held, guaranteed and the limit; per tenant and state: unfinished jobs."""

    allocated = {
        (row["tenant__slug"], row["flavor__name"]): row["millis"]
        for row in allocations.order_by().values("tenant__slug", "flavor__name").annotate(millis=Sum("millis"))
    }
    quotas = list(
        Quota.objects.order_by("tenant__slug", "flavor__name").values_list(
            "tenant__slug", "flavor__name", "guaranteed_millis", "limit_millis"
        )
    )
    jobs = {
        (row["tenant__slug"], row["state"]): row["n"]
        for row in Job.objects.exclude(state__in=FINAL_JOB_STATES)
        .order_by()
        .values("tenant__slug", "state")
        .annotate(n=Count("pk"))
    }
    return {"tenant_allocated": allocated, "tenant_quotas": quotas, "tenant_jobs": jobs}


def _queue_wait_seconds(*, now: dt.datetime) -> tuple[int, dict[float, float]]:
    """Seconds from queued to admitted of the jobs admitted in the last ``QUEUE_WAIT_WINDOW_S``: their count and
    the nearest-rank quantiles, each read with one ordered query (no rows are fetched beyond the one asked for)."""
    admitted = (
        Job.objects.filter(
            submitted_at__gte=now - dt.timedelta(days=QUEUE_WAIT_LOOKBACK_DAYS),
            admitted_at__gte=now - dt.timedelta(seconds=QUEUE_WAIT_WINDOW_S),
        )
        # A job requeued after its admission has a queued_at past its admitted_at until it is admitted again.
        .filter(Q(queued_at__isnull=True) | Q(queued_at__lte=F("admitted_at")))
        .annotate(
            wait=ExpressionWrapper(
                F("admitted_at") - Coalesce("queued_at", "submitted_at"), output_field=DurationField()
            )
        )
        .order_by()
    )
    count = admitted.count()
    quantiles: dict[float, float] = {}
    if count:
        for quantile in QUEUE_WAIT_QUANTILES:
            rank = max(1, math.ceil(quantile * count))
            wait = admitted.order_by("wait", "pk").values_list("wait", flat=True)[rank - 1]
            quantiles[quantile] = round(max(0.0, wait.total_seconds()), 3)
    return count, quantiles


def _oldest_queued_seconds(*, now: dt.datetime) -> float:
    """How long the longest-waiting queued job has waited (0 when none waits)."""
    queued = Job.objects.filter(state=JobState.QUEUED)
    oldest = queued.aggregate(oldest=Min(Coalesce("queued_at", "submitted_at")))["oldest"]
    return round(max(0.0, (now - oldest).total_seconds()), 3) if oldest is not None else 0.0


def _audit_sealing(*, now: dt.datetime) -> dict[str, float]:

    return {
        "audit_unwitnessed_seconds": audit_selectors.unwitnessed_record_age_seconds(now=now),
        "audit_witness_window_seconds": audit_selectors.witness_window_seconds(),
        "audit_integrity": audit_selectors.integrity_status(),
    }


def _database_deadlocks() -> int | None:
    """Deadlocks PostgreSQL has detected in this database since its statistics were reset; None elsewhere."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        # Inside a transaction PostgreSQL answers statistics from the snapshot it took at the first read.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else None
