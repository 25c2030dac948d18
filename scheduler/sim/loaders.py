"""Trace loaders: Microsoft Philly (multi-tenant, whole GPUs) and Alibaba openb (fractional GPUs, 7 models).

Where the traces are: the ``path`` argument, else ``$GPUPOOL_TRACES_DIR``, else ``../shared/traces`` next to
the repository root (see ``/work/shared/traces/README.md`` for the files and their origin).
"""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from scheduler.core.types import FRACTION_STEP_MILLIS, MILLIS_PER_DEVICE, MIN_FRACTION_MILLIS, PriorityClass

from .workload import SimJob, Workload, node, proportional_split, uniform_nodes

REPO_ROOT = Path(__file__).resolve().parents[2]
PHILLY_CSV = "philly/philly.csv"
PHILLY_VC_NODES = "philly/philly_vc_nodes.HeliosArtifact.csv"
ALIBABA_NODES = "alibaba-gpu-v2023/openb_node_list_gpu_node.csv"
ALIBABA_PODS = {
    "default": "alibaba-gpu-v2023/openb_pod_list_default.csv",
    "gpushare100": "alibaba-gpu-v2023/openb_pod_list_gpushare100.csv",
}
PHILLY_FLAVOR = "gpu"
PHILLY_GPUS_PER_NODE = 8
# The openb node list names GPU models but not their memory; the published card sizes (G2/G3 are Alibaba's
# own names, taken as 32 GiB cards). Only fractional requests look at memory, and the sim asks for 1 MiB.
ALIBABA_MEMORY_MIB = {"P100": 16384, "T4": 15360, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
ALIBABA_DEFAULT_MEMORY_MIB = 32768


class TraceNotFound(FileNotFoundError):
    pass


def traces_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the traces: ``path``, else ``$GPUPOOL_TRACES_DIR``, else ``<repo>/../shared/traces``."""
    if path:
        return Path(path)
    env = os.environ.get("GPUPOOL_TRACES_DIR")
    if env:
        return Path(env)
    return REPO_ROOT.parent / "shared" / "traces"


def _open(base: Path, name: str) -> Path:
    file = base / name
    if not file.is_file():
        raise TraceNotFound(f"{file} not found; pass --traces DIR or set GPUPOOL_TRACES_DIR to the traces folder")
    return file


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def gang_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(replicas, cards per replica) for a whole-GPU job: a replica never spans nodes, so a 16-GPU job is a
    gang of 2 replicas of 8 cards, a 12-GPU job 2 of 6 (the largest per-node size that divides the job)."""
    if gpus <= gpus_per_node:
        return 1, gpus
    per = max(d for d in range(1, gpus_per_node + 1) if gpus % d == 0)
    return gpus // per, per


# -- Philly ----------------------------------------------------------------------------------------------------


def read_philly_rows(file: Path) -> list[dict[str, str]]:
    with file.open(newline="") as fh:
        return list(csv.DictReader(fh))


def philly_jobs(
    rows: Iterable[dict[str, str]],
    *,
    start: datetime | None = None,
    days: float | None = None,
    max_jobs: int | None = None,
    gpus_per_node: int = PHILLY_GPUS_PER_NODE,
) -> tuple[list[SimJob], float]:
    """Jobs submitted in ``[start, start + days)`` (the first ``max_jobs`` of them), times relative to the
    window start; returns (jobs, window start as epoch seconds)."""
    parsed = []
    for i, row in enumerate(rows):
        gpus = int(float(row["num_gpus"]))
        if gpus <= 0:
            continue
        parsed.append((_epoch(row["timestamp"]), i, row, gpus))
    parsed.sort(key=lambda r: (r[0], r[1]))
    if not parsed:
        return [], 0.0
    t0 = start.replace(tzinfo=UTC).timestamp() if start is not None else parsed[0][0]
    t1 = t0 + days * 86400 if days is not None else math.inf
    jobs: list[SimJob] = []
    for ts, i, row, gpus in parsed:
        if ts < t0 or ts >= t1:
            continue
        replicas, per = gang_shape(gpus, gpus_per_node)
        jobs.append(
            SimJob(
                job_id=f"p{i}",
                tenant=row["cluster"],
                submit_s=ts - t0,
                duration_s=max(1.0, float(row["duration"])),
                millis=per * MILLIS_PER_DEVICE,
                replicas=replicas,
                flavors=(PHILLY_FLAVOR,),
            )
        )
        if max_jobs is not None and len(jobs) >= max_jobs:
            break
    return jobs, t0


def peak_demand_gpus(jobs: Iterable[SimJob]) -> int:
    """Most GPUs in use at once if every job started the moment it was submitted."""
    deltas: list[tuple[float, float]] = []
    for j in jobs:
        deltas.append((j.submit_s, j.gpus))
        deltas.append((j.submit_s + j.duration_s, -j.gpus))
    deltas.sort(key=lambda d: (d[0], d[1]))  # ends before starts at the same instant
    peak = current = 0.0
    for _, d in deltas:
        current += d
        peak = max(peak, current)
    return math.ceil(peak)


def mean_demand_gpus(jobs: list[SimJob]) -> float:
    """Mean GPUs busy during the submission window if every job started on arrival (the offered load)."""
    if not jobs:
        return 0.0
    first = min(j.submit_s for j in jobs)
    span = max(max(j.submit_s for j in jobs) - first, 1.0)
    # Only the part of each job inside the window (as if it started on arrival): long jobs run on after it.
    return sum(j.gpus * min(j.duration_s, first + span - j.submit_s) for j in jobs) / span


def read_vc_nodes(file: Path) -> dict[str, int]:
    with file.open(newline="") as fh:
        return {row["vc"]: int(row["node num"]) for row in csv.DictReader(fh)}


def load_philly(
    path: str | os.PathLike[str] | None = None,
    *,
    start: datetime | None = datetime(2017, 10, 1),
    days: float | None = 31,
    max_jobs: int | None = None,
    cluster: str | int = "peak",
    gpus_per_node: int = PHILLY_GPUS_PER_NODE,
    guarantees_from: str = "window",
) -> Workload:
    """Philly as a multi-tenant workload: one tenant per virtual cluster.

    ``cluster``: ``"peak"`` (the window's peak demand, rounded up to whole nodes), ``"helios"`` (the Helios
    artifact's node counts x 8 GPUs), ``"load:0.9"`` (sized so the window's mean demand is 90 % of it) or a
    GPU count. Each tenant's guarantee is proportional to its share of the GPU time of the jobs replayed
    (``guarantees_from="window"``, the default: the static partition's best fair setting, sized from what it is
    replayed on) or of the whole trace (``"trace"``); the guarantees sum to the cluster; every tenant's limit
    is the whole cluster.
    """
    if guarantees_from not in ("window", "trace"):
        raise ValueError(f"guarantees_from must be 'window' or 'trace', not {guarantees_from!r}")
    base = traces_dir(path)
    rows = read_philly_rows(_open(base, PHILLY_CSV))
    jobs, t0 = philly_jobs(rows, start=start, days=days, max_jobs=max_jobs, gpus_per_node=gpus_per_node)
    weights: dict[str, float] | None = None  # None: the replayed jobs' GPU time
    if guarantees_from == "trace":
        weights = defaultdict(float)
        for row in rows:
            weights[row["cluster"]] += float(row["gpu_time"] or 0)
    if cluster == "helios":
        gpus = sum(read_vc_nodes(_open(base, PHILLY_VC_NODES)).values()) * gpus_per_node
    elif cluster == "peak":
        gpus = peak_demand_gpus(jobs)
    elif isinstance(cluster, str) and cluster.startswith("load:"):
        gpus = math.ceil(mean_demand_gpus(jobs) / float(cluster.split(":", 1)[1]))
    else:
        gpus = int(cluster)
    return multi_tenant_workload(
        "philly",
        jobs,
        gpus,
        gpus_per_node=gpus_per_node,
        weights=weights,
        meta={"start_epoch": t0, "cluster": cluster, "guarantees_from": guarantees_from},
    )


def multi_tenant_workload(
    name: str,
    jobs: list[SimJob],
    gpus: int,
    *,
    gpus_per_node: int = PHILLY_GPUS_PER_NODE,
    flavor: str = PHILLY_FLAVOR,
    weights: dict[str, float] | None = None,
    meta: dict[str, object] | None = None,
) -> Workload:
    """Uniform nodes for at least ``gpus`` cards (and the largest job); guarantees proportional to ``weights``
    (default: each tenant's GPU time in ``jobs``), summing to the cluster."""
    biggest = max((j.replicas * max(1, j.millis // MILLIS_PER_DEVICE) for j in jobs), default=gpus_per_node)
    gpus = max(gpus, biggest, gpus_per_node)
    nodes = uniform_nodes(math.ceil(gpus / gpus_per_node), gpus_per_node, flavor=flavor)
    capacity = len(nodes) * gpus_per_node * MILLIS_PER_DEVICE
    gpu_time: dict[str, float] = defaultdict(float)
    for j in jobs:
        gpu_time[j.tenant] += j.gpus * j.duration_s
    if weights is not None:
        gpu_time = defaultdict(float, {t: w for t, w in weights.items() if w > 0})
    split = proportional_split(capacity, dict(sorted(gpu_time.items())))
    for tenant in {j.tenant for j in jobs} - set(split):
        split[tenant] = 0  # a quota row all the same: without one the tenant could not even borrow
    split = dict(sorted(split.items()))
    guarantees = {t: {flavor: m} for t, m in split.items()}
    limits = {t: {flavor: capacity} for t in split}
    info = {"gpus": capacity // MILLIS_PER_DEVICE, "jobs": len(jobs), **(meta or {})}
    return Workload(name=name, nodes=nodes, jobs=tuple(jobs), guarantees=guarantees, limits=limits, meta=info)


# -- Alibaba openb ---------------------------------------------------------------------------------------------


def read_alibaba_nodes(file: Path, *, host: bool = True):
    """The GPU nodes; with ``host``, each states its CPU (``cpu_milli``) and host memory (``memory_mib``)."""
    with file.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return tuple(
        node(
            row["sn"],
            int(row["gpu"]),
            flavor=row["model"],
            memory_mib=ALIBABA_MEMORY_MIB.get(row["model"], ALIBABA_DEFAULT_MEMORY_MIB),
            cpu_millicores=int(row["cpu_milli"]) if host else None,
            host_memory_mib=int(row["memory_mib"]) if host else None,
        )
        for row in rows
        if int(row["gpu"]) > 0
    )


def fraction_millis(gpu_milli: int) -> int:
    """The core takes fractions of at least 100 millis in steps of 10: round the trace's value up (455 → 460,
    50 → 100)."""
    step = FRACTION_STEP_MILLIS
    return min(MILLIS_PER_DEVICE, max(MIN_FRACTION_MILLIS, -(-gpu_milli // step) * step))


def alibaba_jobs(
    rows: Iterable[dict[str, str]], flavors_by_capacity: tuple[str, ...], *, host: bool = True, cpu_only: bool = False
) -> list[SimJob]:
    """GPU tasks as jobs: ``gpu_milli`` < 1000 on one card is a fraction, else whole cards; ``gpu_spec``
    (``"V100M16|V100M32"``) limits the models, empty means any; the tenant is the QoS class; duration is
    deletion - scheduled time (creation time when never scheduled). With ``host`` each asks for the task's
    ``cpu_milli`` and ``memory_mib`` beside its cards. CPU-only tasks are skipped, unless ``cpu_only`` (then
    they come as jobs of ``millis=0``, which only the fragmentation experiment places; see there)."""
    jobs = []
    for i, row in enumerate(rows):
        num_gpu = int(row["num_gpu"])
        gpu_milli = int(row["gpu_milli"])
        cpu = int(row["cpu_milli"] or 0) if host else 0
        host_mem = int(row["memory_mib"] or 0) if host else 0
        if num_gpu <= 0 or gpu_milli <= 0:
            if cpu_only:
                jobs.append(
                    SimJob(
                        job_id=f"a{i}",
                        tenant=(row.get("qos") or "default").lower(),
                        submit_s=float(row["creation_time"]),
                        duration_s=1.0,
                        millis=0,
                        flavors=(),
                        cpu_millicores=cpu,
                        host_memory_mib=host_mem,
                    )
                )
            continue
        if num_gpu == 1 and gpu_milli < MILLIS_PER_DEVICE:
            millis, memory = fraction_millis(gpu_milli), 1
        else:
            millis, memory = num_gpu * MILLIS_PER_DEVICE, 0
        spec = tuple(s for s in (row.get("gpu_spec") or "").split("|") if s)
        flavors = tuple(f for f in flavors_by_capacity if f in spec) if spec else flavors_by_capacity
        created = float(row["creation_time"])
        scheduled = float(row["scheduled_time"] or 0) or created
        deleted = float(row["deletion_time"] or 0)
        jobs.append(
            SimJob(
                job_id=f"a{i}",
                tenant=(row.get("qos") or "default").lower(),
                submit_s=created,
                duration_s=max(1.0, deleted - scheduled),
                millis=millis,
                flavors=flavors or flavors_by_capacity,
                memory_mib=memory,
                priority=PriorityClass.NORMAL,
                trace_millis=gpu_milli if millis < MILLIS_PER_DEVICE else None,
                cpu_millicores=cpu,
                host_memory_mib=host_mem,
                any_flavor=not spec,
            )
        )
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    return jobs


def flavors_by_capacity(nodes) -> tuple[str, ...]:
    """GPU models, the one with the most cards first (the order a request with no gpu_spec tries them)."""
    count: dict[str, int] = defaultdict(int)
    for n in nodes:
        for d in n.devices:
            count[d.flavor] += 1
    return tuple(sorted(count, key=lambda f: (-count[f], f)))


def load_alibaba(
    path: str | os.PathLike[str] | None = None,
    *,
    pods: str = "default",
    max_jobs: int | None = None,
    days: float | None = None,
    host: bool = True,
    cpu_only: bool = False,
) -> Workload:
    """The openb cluster (1,213 nodes, 7 GPU models) and its GPU tasks. Tenants are the QoS classes; on every
    model each gets a guarantee proportional to its share of the trace's GPU time, limit the model's capacity.
    With ``host`` (default) nodes state their CPU and memory and tasks ask for theirs (``host=False``: cards
    only, as before); ``cpu_only`` adds the CPU-only tasks as ``millis=0`` jobs (fragmentation experiment)."""
    base = traces_dir(path)
    nodes = read_alibaba_nodes(_open(base, ALIBABA_NODES), host=host)
    order = flavors_by_capacity(nodes)
    with _open(base, ALIBABA_PODS[pods]).open(newline="") as fh:
        jobs = alibaba_jobs(csv.DictReader(fh), order, host=host, cpu_only=cpu_only)
    if days is not None and jobs:
        t0 = jobs[0].submit_s
        jobs = [j for j in jobs if j.submit_s < t0 + days * 86400]
    if max_jobs is not None:
        jobs = jobs[:max_jobs]
    if jobs:
        t0 = jobs[0].submit_s
        jobs = [_shift(j, t0) for j in jobs]
    capacity: dict[str, int] = defaultdict(int)
    for n in nodes:
        for d in n.devices:
            capacity[d.flavor] += MILLIS_PER_DEVICE
    gpu_time: dict[str, float] = defaultdict(float)
    for j in jobs:
        gpu_time[j.tenant] += j.gpus * j.duration_s
    guarantees: dict[str, dict[str, int]] = defaultdict(dict)
    limits: dict[str, dict[str, int | None]] = defaultdict(dict)
    for flavor, cap in capacity.items():
        for tenant, millis in proportional_split(cap, dict(sorted(gpu_time.items()))).items():
            guarantees[tenant][flavor] = millis
            limits[tenant][flavor] = cap
    meta = {"gpus": sum(capacity.values()) // MILLIS_PER_DEVICE, "jobs": len(jobs), "pods": pods}
    return Workload(
        name=f"alibaba-{pods}", nodes=nodes, jobs=tuple(jobs), guarantees=guarantees, limits=limits, meta=meta
    )


def _shift(job: SimJob, t0: float) -> SimJob:
    from dataclasses import replace

    return replace(job, submit_s=job.submit_s - t0)
