"""Replay real cluster traces through the scheduling engine and compare policies (prints figures, writes PNGs).

    .venv/bin/python benchmarks/trace_replay.py                       # Philly week + Alibaba fragmentation
    .venv/bin/python benchmarks/trace_replay.py --trace philly --days 31 --cluster peak
    .venv/bin/python benchmarks/trace_replay.py --trace alibaba --frag-load 1.3

Philly: each policy (FIFO without preemption, strict static partition, gpupool) on the same jobs and cluster:
GPU allocation and utilisation, time to first start, total time queued (every wait, restarts included; mean,
p95), JCT (mean, p95), total time queued of gangs of 32+ GPUs (p95), preemptions (total, per job p99 and max,
jobs preempted 3+ times, most in one hour), the share of jobs kept within their tenant's guarantee, the share
of time some tenant starved within its guarantee while another borrowed (raw, and beyond the tolerance),
the longest wait of a job owed room in its guarantee beyond grace + minimum runtime + one cycle (the reclaim
promise; overall, and per tenant on its own line), Jain's fairness; ``--per-tenant`` adds a table per
tenant; a PNG of allocation over time per policy.
Guarantees (and so the static partition) are sized from the replayed window (``--guarantees-from trace``: from
the whole trace, the earlier setting). Ties in submit time break in numeric job order.
Alibaba: the FGD paper's experiment — tasks arrive until the cluster is over-full; the share of GPUs left
unallocated at several load levels per fractional placement strategy; a PNG of the curves.
Figures are measured, never asserted; the machine's load changes the wall times.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.sim import cli, fragmentation  # noqa: E402
from scheduler.sim.loaders import TraceNotFound, load_alibaba, traces_dir  # noqa: E402

LEVELS = (0.8, 0.9, 1.0, 1.1, 1.2, 1.3)


def published_philly(base: Path) -> dict[str, float] | None:
    file = base / "acme_helios_philly_pai_cluster_summary.AcmeTrace.csv"
    if not file.is_file():
        return None
    with file.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["id"] == "Philly":
                return {k: float(v) for k, v in row.items() if k != "id" and v}
    return None


def philly(args: argparse.Namespace, plot_dir: Path | None) -> None:
    args.trace = "philly"
    workload = cli.build_workload(args)
    config = cli.build_config(args)
    names = cli.policy_names(args.policy)
    days = args.days if args.days is not None else 31
    print(
        f"\n== Philly: {workload.meta['jobs']:,} jobs submitted in {days:g} days from {args.start}, "
        f"{workload.meta['gpus']:,} GPUs (cluster={args.cluster}), {len(workload.guarantees)} tenants, "
        f"cycle interval {config.cycle_interval_s:g} s =="
    )
    runs = cli.run_policies(workload, names, config, cli.policy_overrides(args.set), echo=print)
    print(f"guarantees sized from: {workload.meta.get('guarantees_from')}; command: {' '.join(sys.argv)}")
    print()
    print(cli.format_table([s for s, _ in runs]))
    from scheduler.sim.metrics import per_tenant

    for s, result in runs:
        # The reclaim promise, per tenant: the longest wait of a job owed room in its guarantee beyond it.
        owed = ", ".join(f"{row['tenant']} {row['owed_wait_beyond_s']:,.0f}" for row in per_tenant(result))
        print(
            f"{s['policy']}: longest owed wait beyond grace + min runtime + cycle "
            f"({result.reclaim_bound_s:,.0f} s), s per tenant: {owed}"
        )
    if args.per_tenant:
        for s, result in runs:
            print(f"\n{s['policy']} per tenant")
            print(cli.format_table(per_tenant(result), cli.TENANT_COLUMNS, "tenant"))
    published = published_philly(traces_dir(args.traces))
    if published:
        print(
            "published Philly (AcmeTrace summary, full trace): "
            f"avg queueing delay {published['avg_que_time_gpu']:,.0f} s, "
            f"median {published['med_que_time_gpu']:,.0f} s, avg run time {published['avg_run_time_gpu']:,.0f} s"
        )
    for s, _ in runs:
        print(
            f"  {s['policy']}: {s['cycles']:,} cycles, {s['plan_calls']:,} plan() calls "
            f"({s['plan_ms_per_cycle']:.1f} ms each), "
            f"lost {s['lost_gpu_hours']:,.0f} GPU-h to preemption, restarts {s['restart_gpu_hours']:,.0f} GPU-h"
        )
    if plot_dir is not None:
        from scheduler.sim import plot

        path = plot.utilisation_over_time(
            [r for _, r in runs],
            plot_dir / "philly_utilisation.png",
            title=f"Philly replay: {workload.meta['jobs']:,} jobs, {days:g} days, {workload.meta['gpus']:,} GPUs",
        )
        print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


def alibaba(args: argparse.Namespace, plot_dir: Path | None) -> None:
    workload = load_alibaba(args.traces, pods=args.pods)
    tasks = fragmentation.gpu_tasks(workload.jobs)
    strategies = [s.strip() for s in args.frag_strategies.split(",") if s.strip()]
    print(
        f"\n== Alibaba openb ({args.pods}): {len(workload.nodes):,} nodes, {workload.meta['gpus']:,} GPUs, "
        f"{len(tasks):,} GPU tasks sampled until {args.frag_load:.0%} of the GPUs were asked for =="
    )
    curves = []
    for strategy in strategies:
        started = time.perf_counter()
        curve = fragmentation.fill_cluster(
            workload.nodes, tasks, strategy, max_load=args.frag_load, batch=args.frag_batch, seed=args.seed
        )
        curves.append(curve)
        print(f"  {strategy}: {curve.tasks:,} tasks, {curve.placed:,} placed, {time.perf_counter() - started:.0f} s")
    levels = [lv for lv in LEVELS if lv <= args.frag_load + 1e-9]
    header = "strategy     " + "".join(f"{lv:>8.0%}" for lv in levels)
    print("\nGPUs unallocated when the arrived requests reach ... of the cluster's GPUs")
    print(header)
    print("-" * len(header))
    for c in curves:
        cells = "".join("       -" if math.isnan(v) else f"{v:>8.1%}" for v in (c.at(lv) for lv in levels))
        print(f"{c.strategy:<13}{cells}")
    print("the same, counting what the trace asked for (fractions before rounding up to the core's 100-millis steps)")
    for c in curves:
        cells = "".join("       -" if math.isnan(v) else f"{v:>8.1%}" for v in (c.at(lv, trace=True) for lv in levels))
        print(f"{c.strategy:<13}{cells}")
    if len(curves) > 1:
        best = min(curves, key=lambda c: c.unallocated[-1])
        for c in curves:
            if c is not best and c.unallocated[-1] > 0:
                saving = 1 - best.unallocated[-1] / c.unallocated[-1]
                print(
                    f"  at {args.frag_load:.0%}: {best.strategy} leaves {saving:.0%} fewer GPUs unallocated "
                    f"than {c.strategy}"
                )
    if plot_dir is not None:
        from scheduler.sim import plot

        path = plot.fragmentation_curves(
            curves,
            plot_dir / "alibaba_fragmentation.png",
            title=f"Alibaba openb ({args.pods}): {workload.meta['gpus']:,} GPUs, tasks until {args.frag_load:.0%}",
        )
        print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    if args.jobs:
        replay = load_alibaba(args.traces, pods=args.pods, max_jobs=args.jobs)
        config = cli.build_config(args)
        print(f"\n== Alibaba replay: first {len(replay.jobs):,} tasks over time, tenants = QoS classes ==")
        runs = cli.run_policies(
            replay, cli.policy_names(args.policy), config, cli.policy_overrides(args.set), echo=print
        )
        print(cli.format_table([s for s, _ in runs]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_workload_arguments(parser, ("philly", "alibaba", "both"), "both")
    cli.add_config_arguments(parser)
    parser.set_defaults(cluster="load:0.9", days=7.0)
    parser.add_argument("--policy", default="all", help="comma list of policies (default: fifo,static,gpupool)")
    parser.add_argument("--frag-load", type=float, default=1.3, help="Alibaba: fill up to this share of the GPUs")
    parser.add_argument("--frag-batch", type=int, default=25, help="Alibaba: arrivals per plan() call")
    parser.add_argument("--frag-strategies", default="fragmentation,best_fit,random,worst_fit")
    parser.add_argument("--plot-dir", type=Path, default=REPO / "docs" / "sim")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--per-tenant", action="store_true", help="Philly: a table per tenant for each policy")
    args = parser.parse_args()
    plot_dir = None if args.no_plot else args.plot_dir
    try:
        wanted = args.trace
        if wanted in ("philly", "both"):
            philly(args, plot_dir)
        if wanted in ("alibaba", "both"):
            alibaba(args, plot_dir)
    except TraceNotFound as exc:
        print(f"trace missing: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
