"""``python -m scheduler.sim``: replay a trace under one or more policies and print (or save) the figures.

An operator tries a policy change before deploying it, e.g.::

    python -m scheduler.sim --trace philly --policy gpupool --days 7 --set grace_period_s=300 --out r.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, fields
from datetime import datetime
from pathlib import Path

from scheduler.core.types import Policy

from . import policies
from .loaders import load_alibaba, load_philly
from .metrics import per_tenant, summarize
from .simulator import SimConfig, SimResult, simulate
from .workload import Workload

COLUMNS = (
    ("gpu_allocation_window", "alloc(win)", "{:.1%}"),
    ("gpu_utilisation", "util", "{:.1%}"),
    ("queue_delay_avg_s", "1st start avg", "{:,.0f}"),
    ("queued_avg_s", "queued avg", "{:,.0f}"),
    ("queued_p95_s", "queued p95", "{:,.0f}"),
    ("jct_avg_s", "JCT avg", "{:,.0f}"),
    ("jct_p95_s", "JCT p95", "{:,.0f}"),
    ("big_gang_queued_p95_s", "gang32+ q p95", "{:,.0f}"),
    ("preemptions", "preempt", "{:,}"),
    ("preemptions_per_job_p99", "p99/job", "{:.0f}"),
    ("preemptions_per_job_max", "max/job", "{:,}"),
    ("preempted_3plus", "3+", "{:,}"),
    ("preemptions_per_hour_max", "max/h", "{:,}"),
    ("within_guarantee", "in-guar.", "{:.1%}"),
    ("starved_while_borrowed", "starved", "{:.1%}"),
    ("starved_while_borrowed_beyond_tol", "starved>tol", "{:.1%}"),
    ("jain_fairness", "Jain", "{:.3f}"),
    ("never_started", "stuck", "{:,}"),
    ("wall_s", "wall s", "{:.0f}"),
)
TENANT_COLUMNS = (
    ("jobs", "jobs", "{:,}"),
    ("guarantee_gpus", "guar. GPUs", "{:,.0f}"),
    ("within_guarantee", "in-guar.", "{:.1%}"),
    ("longest_starved_s", "longest starved", "{:,.0f}"),
    ("queued_avg_s", "queued avg", "{:,.0f}"),
    ("queued_p95_s", "queued p95", "{:,.0f}"),
    ("jct_avg_s", "JCT avg", "{:,.0f}"),
    ("preemptions", "preempt", "{:,}"),
    ("preemptions_max", "max/job", "{:,}"),
)


def add_workload_arguments(
    parser: argparse.ArgumentParser, traces: Sequence[str] = ("philly", "alibaba"), default: str = "philly"
) -> None:
    parser.add_argument("--trace", choices=tuple(traces), default=default)
    parser.add_argument("--traces", help="folder with the traces (default $GPUPOOL_TRACES_DIR or ../shared/traces)")
    parser.add_argument("--days", type=float, help="replay only jobs submitted in the first N days of the window")
    parser.add_argument("--jobs", type=int, help="replay only the first N jobs of the window")
    parser.add_argument("--start", default="2017-10-01", help="Philly: window start date (default 2017-10-01)")
    parser.add_argument(
        "--cluster",
        default="peak",
        help="Philly cluster size: peak (window's peak demand), helios (Helios node counts x 8), "
        "load:0.9 (mean demand is 90%% of it) or a GPU count (default peak)",
    )
    parser.add_argument("--pods", choices=("default", "gpushare100"), default="default", help="Alibaba pod list")
    parser.add_argument(
        "--guarantees-from",
        choices=("window", "trace"),
        default="window",
        help="Philly: size each tenant's guarantee from its GPU time in the replayed window (default; the static "
        "baseline's best fair setting) or over the whole trace",
    )


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cycle-interval", type=float, default=60.0, help="min simulated s between cycles")
    parser.add_argument("--restart-cost", type=float, default=60.0, help="s a restarted job spends reloading")
    parser.add_argument(
        "--checkpoint-interval", type=float, default=1800.0, help="s of work between checkpoints (0: none)"
    )
    parser.add_argument("--checkpoint-on-preempt", action="store_true", help="a preempted job saves during grace")
    parser.add_argument("--mtbf-hours", type=float, help="mean time between failures of one node (off by default)")
    parser.add_argument("--repair-hours", type=float, default=1.0, help="hours a failed node stays down")
    parser.add_argument(
        "--no-hold",
        action="store_true",
        help="forget the engine's holds between cycles (ablation: freed capacity is held for one cycle only)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a scheduler Policy field for every policy, e.g. --set grace_period_s=300",
    )


def build_workload(args: argparse.Namespace) -> Workload:
    if args.trace == "alibaba":
        return load_alibaba(args.traces, pods=args.pods, max_jobs=args.jobs, days=args.days)
    cluster: str | int = int(args.cluster) if str(args.cluster).isdigit() else args.cluster
    days = args.days if args.days is not None else (None if args.jobs else 31)
    start = datetime.fromisoformat(args.start) if args.start else None
    return load_philly(
        args.traces,
        start=start,
        days=days,
        max_jobs=args.jobs,
        cluster=cluster,
        guarantees_from=getattr(args, "guarantees_from", "window"),
    )


def build_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        cycle_interval_s=args.cycle_interval,
        restart_cost_s=args.restart_cost,
        checkpoint_interval_s=args.checkpoint_interval or None,
        checkpoint_on_preempt=args.checkpoint_on_preempt,
        mtbf_s=args.mtbf_hours * 3600 if args.mtbf_hours else None,
        repair_s=args.repair_hours * 3600,
        seed=args.seed,
        hold_for_preemptor=not args.no_hold,
    )


def policy_overrides(pairs: Sequence[str]) -> dict[str, object]:
    """``["grace_period_s=300", "backfill=false"]`` → typed ``Policy`` field values."""
    known = {f.name: f for f in fields(Policy)}
    defaults = Policy()
    out: dict[str, object] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or name not in known:
            raise SystemExit(f"--set {pair!r}: expected FIELD=VALUE with FIELD one of {', '.join(known)}")
        current = getattr(defaults, name)
        if isinstance(current, bool):
            value: object = text.lower() in ("1", "true", "yes", "on")
        elif isinstance(current, int | float) and not isinstance(current, bool):
            value = type(current)(float(text)) if isinstance(current, float) else int(text)
        elif current is None:
            value = None if text.lower() in ("", "none") else int(text)
        else:
            value = type(current)(text)  # the StrEnum fields
        out[name] = value
    return out


def policy_names(text: str) -> list[str]:
    if text == "all":
        return list(policies.DEFAULT_COMPARISON)
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        policies.get(n)  # fails with the list of known names
    return names


def run_policies(
    workload: Workload,
    names: Sequence[str],
    config: SimConfig,
    overrides: dict[str, object] | None = None,
    *,
    echo=None,
) -> list[tuple[dict, SimResult]]:
    out = []
    for name in names:
        result = simulate(workload, policies.get(name, **(overrides or {})), config)
        summary = summarize(result)
        if echo:
            echo(f"  {name}: {summary['cycles']:,} cycles, {summary['wall_s']:.0f} s wall")
        out.append((summary, result))
    return out


def _cell(value: object, fmt: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if fmt == "days":
        return f"{float(value) / 86400:.1f}"
    return fmt.format(value)


def format_table(summaries: Sequence[dict], columns=COLUMNS, first: str = "policy") -> str:
    header = [first, *(title for _, title, _ in columns)]
    rows = [[str(s[first]), *(_cell(s[key], fmt) for key, _, fmt in columns)] for s in summaries]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in [header, *rows]
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def results_json(workload: Workload, config: SimConfig, runs: Sequence[tuple[dict, SimResult]]) -> dict:
    return {
        "workload": {"name": workload.name, **{k: v for k, v in workload.meta.items()}},
        "config": asdict(config),
        "results": [
            {"summary": summary, "allocated_share_hourly": [b / r.capacity_millis for b in r.allocated_bins]}
            for summary, r in runs
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler.sim", description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    add_config_arguments(parser)
    parser.add_argument(
        "--policy", default="gpupool", help=f"one of {', '.join(policies.POLICIES)}, a comma list, or all"
    )
    parser.add_argument("--out", type=Path, help="write the figures (and hourly allocation) as JSON here")
    parser.add_argument("--per-tenant", action="store_true", help="print a table per tenant for each policy")
    args = parser.parse_args(argv)
    names = policy_names(args.policy)
    workload = build_workload(args)
    config = build_config(args)
    print(f"{workload.name}: {workload.meta.get('jobs')} jobs on {workload.meta.get('gpus')} GPUs", file=sys.stderr)
    runs = run_policies(workload, names, config, policy_overrides(args.set), echo=lambda m: print(m, file=sys.stderr))
    print(format_table([s for s, _ in runs]))
    if args.per_tenant:
        for summary, result in runs:
            print(f"\n{summary['policy']} per tenant")
            print(format_table(per_tenant(result), TENANT_COLUMNS, "tenant"))
    if args.out:
        args.out.write_text(json.dumps(results_json(workload, config, runs), indent=1, default=str))
    return 0
