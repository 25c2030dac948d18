"""``python -m scheduler.sim``: replay a trace under one or more policies and print (or save) the figures.

An operator tries a policy change before deploying it, e.g.::

    python -m scheduler.sim --trace philly --policy gpupool --days 7 --set grace_period_s=300 --out r.json
    python -m scheduler.sim --trace-file jobs.csv --cluster-file cluster.csv --tenants-file tenants.csv \
        --jobs-csv per-job.csv --tenants-csv per-tenant.csv
    python -m scheduler.sim --trace philly --days 7 --write-trace philly-week/   # convert to gpupool's format

The trace format (jobs, cluster, tenants; CSV or JSON Lines) is ``traceformat.py`` / docs/trace-format.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from . import policies, records, traceformat
from .loaders import TraceNotFound, load_alibaba, load_philly
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
    ("within_guarantee_alone", "in-guar. alone", "{:.1%}"),
    ("starved_while_borrowed", "starved", "{:.1%}"),
    ("starved_while_borrowed_beyond_tol", "starved>tol", "{:.1%}"),
    ("owed_wait_max_s", "owed>bound max", "{:,.0f}"),
    ("jain_fairness", "Jain", "{:.3f}"),
    ("never_started", "stuck", "{:,}"),
    ("wall_s", "wall s", "{:.0f}"),
)
TENANT_COLUMNS = (
    ("jobs", "jobs", "{:,}"),
    ("guarantee_gpus", "guar. GPUs", "{:,.0f}"),
    ("within_guarantee", "in-guar.", "{:.1%}"),
    ("within_guarantee_alone", "in-guar. alone", "{:.1%}"),
    ("longest_starved_s", "longest starved", "{:,.0f}"),
    ("owed_wait_beyond_s", "owed>bound", "{:,.0f}"),
    ("queued_avg_s", "queued avg", "{:,.0f}"),
    ("queued_p95_s", "queued p95", "{:,.0f}"),
    ("jct_avg_s", "JCT avg", "{:,.0f}"),
    ("preemptions", "preempt", "{:,}"),
    ("preemptions_max", "max/job", "{:,}"),
)


def add_workload_arguments(
    parser: argparse.ArgumentParser, traces: Sequence[str] = ("philly", "alibaba"), default: str = "philly"
) -> None:
    parser.add_argument("--trace", choices=tuple(traces), default=default, help="a bundled trace (default philly)")
    parser.add_argument(
        "--trace-file",
        type=Path,
        help="replay this jobs file in gpupool's trace format (.csv or .jsonl; docs/trace-format.md) instead",
    )
    parser.add_argument(
        "--cluster-file", type=Path, help="with --trace-file: the nodes (default: sized to the peak demand)"
    )
    parser.add_argument(
        "--tenants-file",
        type=Path,
        help="with --trace-file: tenant tree and quotas (default: guarantees from the window's demand)",
    )
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
    trace_file = getattr(args, "trace_file", None)
    if trace_file is not None:
        try:
            return traceformat.load_trace(trace_file, args.cluster_file, args.tenants_file)
        except traceformat.TraceFormatError as exc:
            raise SystemExit(f"error: {exc}") from None
    if getattr(args, "cluster_file", None) or getattr(args, "tenants_file", None):
        raise SystemExit("error: --cluster-file and --tenants-file go with --trace-file")
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
    """``["grace_period_s=300", "backfill=false"]`` → typed ``Policy`` field values (``policies.parse_settings``);
    a bad one exits with the list of valid names."""
    try:
        return policies.parse_settings(pairs)
    except ValueError as exc:
        raise SystemExit(f"error: --set {exc}") from None


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
    timelines: dict[str, records.JobTimeline] | None = None,
) -> list[tuple[dict, SimResult]]:
    """Replay ``workload`` under each named policy; with ``timelines`` (filled in, by policy name) every
    job's runs are recorded too."""
    out = []
    for name in names:
        observers = []
        if timelines is not None:
            timelines[name] = records.JobTimeline()
            observers.append(timelines[name])
        result = simulate(workload, policies.get(name, **(overrides or {})), config, observers=observers)
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
    parser.add_argument(
        "--jobs-csv", type=Path, help="write one row per job and policy: submit, every start/stop, nodes, queued"
    )
    parser.add_argument("--tenants-csv", type=Path, help="write one row per tenant and policy")
    parser.add_argument(
        "--write-trace",
        type=Path,
        metavar="DIR",
        help="write the workload in gpupool's trace format (jobs, cluster, tenants) to DIR and stop",
    )
    parser.add_argument("--trace-format", choices=traceformat.FORMATS, default="csv", help="for --write-trace")
    args = parser.parse_args(argv)
    names = policy_names(args.policy)
    overrides = policy_overrides(args.set)
    try:
        workload = build_workload(args)
    except TraceNotFound as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.write_trace:
        written = traceformat.write_workload(workload, args.write_trace, args.trace_format)
        print(f"--trace-file {written['jobs']} --cluster-file {written['cluster']} --tenants-file {written['tenants']}")
        return 0
    config = build_config(args)
    print(f"{workload.name}: {workload.meta.get('jobs')} jobs on {workload.meta.get('gpus')} GPUs", file=sys.stderr)
    timelines: dict[str, records.JobTimeline] | None = {} if args.jobs_csv else None
    runs = run_policies(
        workload, names, config, overrides, echo=lambda m: print(m, file=sys.stderr), timelines=timelines
    )
    print(format_table([s for s, _ in runs]))
    if args.jobs_csv and timelines is not None:
        rows = [
            {"policy": name, **row}
            for name, (_, result) in zip(names, runs, strict=True)
            for row in records.job_rows(result, timelines[name])
        ]
        records.write_csv(args.jobs_csv, rows, ("policy", *records.JOB_CSV_COLUMNS))
    if args.tenants_csv:
        rows = [
            {"policy": name, **row}
            for name, (_, result) in zip(names, runs, strict=True)
            for row in records.tenant_rows(result)
        ]
        records.write_csv(args.tenants_csv, rows, ("policy", *records.TENANT_CSV_COLUMNS))
    if args.per_tenant:
        for summary, result in runs:
            print(f"\n{summary['policy']} per tenant")
            print(format_table(per_tenant(result), TENANT_COLUMNS, "tenant"))
    if args.out:
        args.out.write_text(json.dumps(results_json(workload, config, runs), indent=1, default=str))
    return 0
