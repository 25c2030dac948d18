"""Usage accounting: clipping to the period, splitting at boundaries, active allocations up to now."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.core.management import call_command

from scheduler.models import Allocation
from scheduler.showback import usage_report
from tests.scheduler.factories import DeviceFactory, FlavorFactory, JobFactory

pytestmark = pytest.mark.django_db
UTC = dt.UTC


def _alloc(tenant, flavor, start, end, millis=1000):
    device = DeviceFactory(flavor=flavor)
    return Allocation.objects.create(
        job=JobFactory(tenant=tenant),
        replica=0,
        tenant=tenant,
        flavor=flavor,
        device=device,
        node=device.node,
        millis=millis,
        started_at=start,
        ended_at=end,
    )


def test_allocation_is_clipped_and_split_per_day(world):
    flavor = FlavorFactory()
    # 22:00 on the 1st to 02:00 on the 3rd, half a card: 2h + 24h + 2h = 28h x 0.5 = 14 device-hours.
    _alloc(world.vision, flavor, dt.datetime(2026, 11, 1, 22, tzinfo=UTC), dt.datetime(2026, 11, 3, 2, tzinfo=UTC), 500)
    report = usage_report(
        start=dt.datetime(2026, 11, 2, tzinfo=UTC),
        end=dt.datetime(2026, 11, 4, tzinfo=UTC),
        period="day",
        now=dt.datetime(2026, 12, 1, tzinfo=UTC),
    )
    hours = {(row.period_start.day, row.tenant): row.device_hours for row in report.rows}
    assert hours == {(2, "acme-vision"): Decimal("12.0000"), (3, "acme-vision"): Decimal("1.0000")}
    rolled = {(t.period_start.day, t.tenant): t.subtree_device_hours for t in report.tenants}
    assert rolled[(2, "acme")] == Decimal("12.0000")


def test_active_allocation_counts_up_to_now(world):
    flavor = FlavorFactory()
    _alloc(world.nlp, flavor, dt.datetime(2026, 11, 5, 10, tzinfo=UTC), None, 1000)
    report = usage_report(
        start=dt.datetime(2026, 11, 1, tzinfo=UTC),
        end=dt.datetime(2026, 12, 1, tzinfo=UTC),
        period="month",
        now=dt.datetime(2026, 11, 5, 13, tzinfo=UTC),
    )
    assert [row.device_hours for row in report.rows] == [Decimal("3.0000")]


def test_week_periods_start_on_monday(world):
    flavor = FlavorFactory()
    _alloc(world.nlp, flavor, dt.datetime(2026, 11, 29, 23, tzinfo=UTC), dt.datetime(2026, 11, 30, 1, tzinfo=UTC))
    report = usage_report(
        start=dt.datetime(2026, 11, 1, tzinfo=UTC),
        end=dt.datetime(2026, 12, 31, tzinfo=UTC),
        period="week",
        now=dt.datetime(2026, 12, 31, tzinfo=UTC),
    )
    assert [(row.period_start.isoformat(), row.device_hours) for row in report.rows] == [
        ("2026-11-23", Decimal("1.0000")),
        ("2026-11-30", Decimal("1.0000")),
    ]


def test_usage_report_command_writes_csv_and_xlsx(world, tmp_path, capsys):
    flavor = FlavorFactory()
    _alloc(world.vision, flavor, dt.datetime(2026, 11, 2, tzinfo=UTC), dt.datetime(2026, 11, 2, 6, tzinfo=UTC))
    call_command("usage_report", "--from", "2026-11-01", "--to", "2026-12-01", "--period", "month")
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("period_start,tenant,parent,flavor")
    assert "2026-11-01,acme,,sim-80g,0,6.0000" in out
    target = tmp_path / "usage.xlsx"
    call_command("usage_report", "--from", "2026-11-01", "--to", "2026-12-01", "--format", "xlsx", "-o", str(target))
    assert target.stat().st_size > 1000
