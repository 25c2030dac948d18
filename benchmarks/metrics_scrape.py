"""Benchmark: what one Prometheus scrape of ``/metrics`` costs a web process, by fleet size.

``/metrics`` reads every node, card and active allocation from PostgreSQL and every card's latest values from
Redis (``scheduler.fleet.selectors.metrics_snapshot``), then writes dcgm-exporter's per-card series and the
pool, tenant, queue and audit series (``scheduler.fleet.metrics.render_metrics``). This builds a fleet of
``--nodes`` x 8 cards with latest values for every card (in a scratch database and a Redis database of its own),
and prints per size the median of ``--runs`` scrapes: wall time and this process's CPU for the read and for the
text, the answer's size and its number of series; then the same without the per-card series
(``GPUPOOL_METRICS_PER_CARD=0``).

    createdb -h 127.0.0.1 -U postgres gpupool_metrics_bench
    GPUPOOL_REDIS_URL=redis://127.0.0.1:6379/13 .venv/bin/python benchmarks/metrics_scrape.py \\
        --database-url postgres://postgres@127.0.0.1:5432/gpupool_metrics_bench --sizes 1000,10000

Figures, not assertions. The scratch database's nodes are deleted first; the Redis database is flushed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._django import setup_django

CARDS = 8


def build(count: int) -> None:
    """``count`` nodes of 8 cards each, and latest values for every card (as the agents' sockets write them)."""
    from scheduler.fleet.models import Device, Node
    from scheduler.fleet.telemetry import latest_store

    Node.objects.all().delete()
    nodes = Node.objects.bulk_create([Node(name=f"gpu-{index:05d}", status="ready") for index in range(count)])
    Device.objects.bulk_create(
        [
            Device(
                node=node, index=card, uuid=f"GPU-{node.name}-{card}", vendor="nvidia", model="H100", memory_mib=81920
            )
            for node in nodes
            for card in range(CARDS)
        ],
        batch_size=5000,
    )
    rng = random.Random(1)
    store = latest_store()
    for node in nodes:
        store.put(
            node.pk,
            {
                f"GPU-{node.name}-{card}": {
                    "utilization_pct": round(rng.uniform(0, 100), 1),
                    "memory_used_mib": rng.randint(0, 81920),
                    "memory_total_mib": 81920,
                    "power_w": round(rng.uniform(60, 700), 1),
                    "temperature_c": round(rng.uniform(30, 85), 1),
                    "sm_clock_mhz": 1980,
                    "ecc_errors": 0,
                    "xid_errors": 0,
                    "at": "2026-12-07T00:00:00+00:00",
                }
                for card in range(CARDS)
            },
        )


def scrape(runs: int) -> dict[str, float]:
    from scheduler.fleet.metrics import render_metrics
    from scheduler.fleet.selectors import metrics_snapshot

    read_wall, read_cpu, text_wall, text_cpu = [], [], [], []
    text = ""
    for _run in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        snapshot = metrics_snapshot()
        read_wall.append(time.perf_counter() - wall)
        read_cpu.append(time.process_time() - cpu)
        wall, cpu = time.perf_counter(), time.process_time()
        text = render_metrics(snapshot)
        text_wall.append(time.perf_counter() - wall)
        text_cpu.append(time.process_time() - cpu)
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return {
        "read_wall": statistics.median(read_wall),
        "read_cpu": statistics.median(read_cpu),
        "text_wall": statistics.median(text_wall),
        "text_cpu": statistics.median(text_cpu),
        "bytes": len(text.encode()),
        "series": series,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True, help="a scratch PostgreSQL database (postgres://…)")
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated node counts")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if not os.environ.get("GPUPOOL_REDIS_URL"):
        parser.error("set GPUPOOL_REDIS_URL to a Redis database this benchmark may flush (the latest values)")
    setup_django(args.database_url, tempfile.mkdtemp(prefix="gpupool-metrics-"))
    import redis
    from django.conf import settings

    redis.Redis.from_url(os.environ["GPUPOOL_REDIS_URL"]).flushdb()
    print(f"/metrics scrape: nodes x {CARDS} cards with latest values, median of {args.runs} scrapes, this process")
    for size in (int(value) for value in args.sizes.split(",")):
        build(size)
        figures = scrape(args.runs)
        read = f"read {figures['read_wall'] * 1000:7.0f} ms wall / {figures['read_cpu'] * 1000:6.0f} ms cpu"
        text = f"text {figures['text_wall'] * 1000:6.0f} ms wall / {figures['text_cpu'] * 1000:6.0f} ms cpu"
        size_text = f"{figures['bytes'] / 2**20:6.1f} MiB, {figures['series']:,} series"
        print(f"  {size:>6} nodes: {read} | {text} | {size_text}", flush=True)
        settings.GPUPOOL_METRICS_PER_CARD = False  # what a fleet that scrapes dcgm-exporter on the nodes turns off
        figures = scrape(args.runs)
        settings.GPUPOOL_METRICS_PER_CARD = True
        cpu = (figures["read_cpu"] + figures["text_cpu"]) * 1000
        size_text = f"{figures['bytes'] / 2**10:,.0f} KiB, {figures['series']:,} series"
        print(f"  {'':>6}  without per-card series (GPUPOOL_METRICS_PER_CARD=0): {cpu:.0f} ms cpu | {size_text}")


if __name__ == "__main__":
    main()
