"""Benchmark: what the per-card minute rollups cost PostgreSQL — write time per minute and bytes per row.

Every agent connection writes one ``TelemetryMinute`` row per card per minute (``telemetry_minutes_write``, one
``INSERT … ON CONFLICT`` per batch), kept ``GPUPOOL_TELEMETRY_MINUTE_RETENTION_DAYS`` (30); the hourly job
(``telemetry_hours_rollup``) folds them into ``TelemetryHour`` rows. This writes ``--minutes`` minutes of a fleet
of ``--nodes`` x 8 cards through those same functions into a scratch database and prints:

- the time each minute's rows take to write (median and max, wall clock), and the rows per second;
- the table's size with its indexes per row (``pg_total_relation_size``), and from it what 30 days of minutes
  and a year of hours take for 1,000 and 10,000 nodes;
- the hourly rollup's time for the rows written.

    createdb -h 127.0.0.1 -U postgres gpupool_storage_bench
    .venv/bin/python benchmarks/telemetry_storage.py \\
        --database-url postgres://postgres@127.0.0.1:5432/gpupool_storage_bench --nodes 1000 --minutes 30

Figures, not assertions. The database should be a scratch one: its telemetry tables are emptied first.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._django import setup_django

CARDS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True, help="a scratch PostgreSQL database (postgres://…)")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=30)
    args = parser.parse_args()
    if not args.database_url.startswith("postgres"):
        parser.error("--database-url must name a PostgreSQL database: the sizes are PostgreSQL's")
    setup_django(args.database_url, tempfile.mkdtemp(prefix="gpupool-storage-"))

    from django.db import connection

    from scheduler.fleet.models import Device, Node, TelemetryHour, TelemetryMinute
    from scheduler.fleet.services.rollups import telemetry_hours_rollup, telemetry_minutes_write
    from scheduler.fleet.telemetry import MinuteAggregate

    TelemetryMinute.objects.all().delete()
    TelemetryHour.objects.all().delete()
    run = f"storage-{int(time.time())}"
    nodes = Node.objects.bulk_create([Node(name=f"{run}-{index:05d}") for index in range(args.nodes)])
    devices = Device.objects.bulk_create(
        [
            Device(
                node=node, index=card, uuid=f"GPU-{node.name}-{card}", vendor="nvidia", model="H100", memory_mib=81920
            )
            for node in nodes
            for card in range(CARDS)
        ]
    )
    device_ids = {device.uuid: device.pk for device in devices}
    rng = random.Random(1)
    start = (datetime.now(UTC) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    per_minute = []
    for minute_index in range(args.minutes):
        minute = start + timedelta(minutes=minute_index)
        aggregates = []
        for uuid in device_ids:
            utilization = rng.uniform(0, 100)
            aggregates.append(
                MinuteAggregate(
                    uuid=uuid,
                    minute=minute,
                    samples=60,
                    utilization_sum=utilization * 60,
                    utilization_max=min(100.0, utilization + 5),
                    memory_sum=40000.0 * 60,
                    memory_max=41000.0,
                    power_sum=300.0 * 60,
                    power_samples=60,
                    temperature_max=rng.uniform(40, 80),
                )
            )
        started = time.perf_counter()
        # Each agent connection writes its own node's minute; here one call per node, as the sockets do.
        for offset in range(0, len(aggregates), CARDS):
            telemetry_minutes_write(aggregates=aggregates[offset : offset + CARDS], device_ids=device_ids)
        per_minute.append(time.perf_counter() - started)
    rows = TelemetryMinute.objects.count()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE " + connection.ops.quote_name(TelemetryMinute._meta.db_table))
        cursor.execute("SELECT pg_total_relation_size(%s)", [TelemetryMinute._meta.db_table])
        (minute_bytes,) = cursor.fetchone()
    started = time.perf_counter()
    hours_rows = telemetry_hours_rollup(now=start + timedelta(minutes=args.minutes + 61))
    rollup_s = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s)", [TelemetryHour._meta.db_table])
        (hour_bytes,) = cursor.fetchone()
    hours = TelemetryHour.objects.count() or 1

    cards = args.nodes * CARDS
    per_row = minute_bytes / rows
    per_hour_row = hour_bytes / hours
    median = statistics.median(per_minute)
    print(f"telemetry storage on PostgreSQL: {args.nodes} nodes x {CARDS} cards, {args.minutes} minutes written")
    print(
        f"  minute rows: {rows} | write per minute (one INSERT … ON CONFLICT per node): median {median * 1000:.0f} ms, "
        f"max {max(per_minute) * 1000:.0f} ms | {cards / median:,.0f} rows/s"
    )
    print(f"  size with indexes: {per_row:.0f} bytes per minute row, {per_hour_row:.0f} per hour row ({hours} rows)")
    print(f"  hourly rollup of those minutes: {rollup_s * 1000:.0f} ms ({hours_rows} hour rows)")
    for fleet in (1_000, 10_000):
        fleet_cards = fleet * CARDS
        month = fleet_cards * 60 * 24 * 30
        year = fleet_cards * 24 * 365
        print(
            f"  {fleet:>6} nodes: {fleet_cards * 60 * 24:,} minute rows a day; 30 days of minutes "
            f"{month * per_row / 2**30:,.0f} GiB, a year of hours {year * per_hour_row / 2**30:,.0f} GiB; "
            f"{fleet_cards / 60:,.0f} rows/s written"
        )
    Node.objects.filter(name__startswith=run).delete()


if __name__ == "__main__":
    main()
