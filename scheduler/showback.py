"""Usage accounting (showback): device-hours per tenant, flavor, user and job, rolled up the tenant tree.

A device-hour is one whole card for one hour: ``millis * seconds / 1000 / 3600``. Each allocation counts
from ``started_at`` to ``ended_at`` (active ones up to ``now``), clipped to the report's range and split at
period boundaries (day, ISO week starting Monday, calendar month; all UTC). With a FlavorPrice a row also has
a cost. Reads only; the API (``/api/v1/usage/``), the console's reports and ``gpupool usage_report`` all use
this module. It lives on the scheduler's side because it reads the scheduler's allocations; the tenants app
stays below and knows nothing of them.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from django.db.models import Q
from django.utils import timezone

from audit.csvsafe import formula_safe, formula_safe_row
from catalog.models import FlavorPrice
from scheduler.models import MILLIS_PER_DEVICE, Allocation
from tenants.models import Tenant

PERIODS = ("day", "week", "month")
SECONDS_PER_HOUR = 3600


def period_floor(moment: dt.datetime, period: str) -> dt.datetime:
    moment = moment.astimezone(dt.UTC)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - dt.timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    raise ValueError(f"period must be one of {', '.join(PERIODS)}")


def period_next(start: dt.datetime, period: str) -> dt.datetime:
    if period == "day":
        return start + dt.timedelta(days=1)
    if period == "week":
        return start + dt.timedelta(days=7)
    return (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1)


@dataclass(frozen=True)
class UsageRow:
    period_start: dt.date
    tenant: str
    flavor: str
    user: str
    job_id: int
    device_hours: Decimal
    cost: Decimal | None


@dataclass(frozen=True)
class TenantUsage:
    period_start: dt.date
    tenant: str
    parent: str | None
    flavor: str
    own_device_hours: Decimal
    subtree_device_hours: Decimal
    subtree_cost: Decimal | None


@dataclass
class UsageReport:
    start: dt.datetime
    end: dt.datetime
    period: str
    rows: list[UsageRow] = field(default_factory=list)
    tenants: list[TenantUsage] = field(default_factory=list)
    currency: str = ""


def _hours(millis: int, seconds: float) -> Decimal:
    return Decimal(millis * seconds) / Decimal(MILLIS_PER_DEVICE * SECONDS_PER_HOUR)


def usage_report(
    *,
    start: dt.datetime,
    end: dt.datetime,
    period: str = "day",
    tenant_ids: list[int] | None = None,
    now: dt.datetime | None = None,
) -> UsageReport:
    """The showback report for ``[start, end)``, limited to ``tenant_ids`` (None = all tenants)."""
    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}")
    if end <= start:
        raise ValueError("'to' must be after 'from'")
    now = now or timezone.now()
    allocations = (
        Allocation.objects.filter(started_at__lt=end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=start))
        .select_related("tenant", "flavor", "job__submitter")
    )
    if tenant_ids is not None:
        allocations = allocations.filter(tenant_id__in=tenant_ids)
    prices = {p.flavor_id: p for p in FlavorPrice.objects.all()}
    currency = next(iter({p.currency for p in prices.values()}), "")

    detail: dict[tuple, Decimal] = defaultdict(Decimal)
    for allocation in allocations:
        begin = max(allocation.started_at, start)
        finish = min(allocation.ended_at or now, end, now)
        cursor = period_floor(begin, period)
        while cursor < finish:
            bucket_end = period_next(cursor, period)
            seconds = (min(finish, bucket_end) - max(begin, cursor)).total_seconds()
            if seconds > 0:
                submitter = allocation.job.submitter
                key = (
                    cursor.date(),
                    allocation.tenant.slug,
                    allocation.flavor.name,
                    submitter.username if submitter else "",
                    allocation.job_id,
                    allocation.flavor_id,
                )
                detail[key] += _hours(allocation.millis, seconds)
            cursor = bucket_end

    report = UsageReport(start=start, end=end, period=period, currency=currency)
    for (day, tenant, flavor, user, job_id, flavor_id), hours in sorted(detail.items()):
        price = prices.get(flavor_id)
        report.rows.append(
            UsageRow(
                day,
                tenant,
                flavor,
                user,
                job_id,
                hours.quantize(Decimal("0.0001")),
                (hours * price.price_per_device_hour).quantize(Decimal("0.01")) if price else None,
            )
        )

    # Roll up: each tenant's own hours, plus every descendant's, per period and flavor.
    tenants = {t.slug: t for t in Tenant.objects.select_related("parent")}
    own: dict[tuple, Decimal] = defaultdict(Decimal)
    subtree: dict[tuple, Decimal] = defaultdict(Decimal)
    costs: dict[tuple, Decimal] = defaultdict(Decimal)
    priced: set[tuple] = set()
    for row in report.rows:
        own[(row.period_start, row.tenant, row.flavor)] += row.device_hours
        node = tenants.get(row.tenant)
        while node is not None:
            key = (row.period_start, node.slug, row.flavor)
            subtree[key] += row.device_hours
            if row.cost is not None:
                costs[key] += row.cost
                priced.add(key)
            node = node.parent
    visible = None
    if tenant_ids is not None:
        visible = {t.slug for t in tenants.values() if t.pk in set(tenant_ids)}
    for key in sorted(subtree):
        day, slug, flavor = key
        if visible is not None and slug not in visible:
            continue  # a parent the caller cannot see stays out of the report
        parent = tenants[slug].parent
        report.tenants.append(
            TenantUsage(
                day,
                slug,
                parent.slug if parent else None,
                flavor,
                own.get(key, Decimal("0")),
                subtree[key],
                costs[key] if key in priced else None,
            )
        )
    return report


DETAIL_COLUMNS = ["period_start", "tenant", "flavor", "user", "job_id", "device_hours", "cost"]
TENANT_COLUMNS = [
    "period_start",
    "tenant",
    "parent",
    "flavor",
    "own_device_hours",
    "subtree_device_hours",
    "subtree_cost",
]


def _cells(item: object, columns: list[str]) -> list:
    values = []
    for column in columns:
        value = getattr(item, column)
        values.append("" if value is None else value)
    return values


def report_csv(report: UsageReport, *, kind: str = "tenants") -> str:
    """CSV of the roll-up per tenant (``kind="tenants"``) or the detail per user and job (``"detail"``)."""
    columns, items = (TENANT_COLUMNS, report.tenants) if kind == "tenants" else (DETAIL_COLUMNS, report.rows)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    for item in items:
        writer.writerow(formula_safe_row(_cells(item, columns)))
    return out.getvalue()


def report_xlsx(report: UsageReport) -> bytes:
    """A workbook with two sheets: "tenants" (roll-up) and "detail"."""
    from openpyxl import Workbook

    workbook = Workbook()
    sheet = workbook.active
    sheet.title = "tenants"
    for name, columns, items in (("tenants", TENANT_COLUMNS, report.tenants), ("detail", DETAIL_COLUMNS, report.rows)):
        if name != "tenants":
            sheet = workbook.create_sheet(name)
        sheet.append(columns)
        for item in items:
            sheet.append([float(v) if isinstance(v, Decimal) else formula_safe(v) for v in _cells(item, columns)])
    info = workbook.create_sheet("about")
    info.append(["from", report.start.isoformat()])
    info.append(["to", report.end.isoformat()])
    info.append(["period", report.period])
    info.append(["unit", "device-hours (1000 millis for one hour)"])
    info.append(["currency", report.currency])
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()
