"""gpupool's trace format: the jobs to replay, the cluster they ran on and the tenants with their quotas.

Three files, each CSV (a header row, then one row per record) or JSON Lines (one object per line, the same
keys), chosen by the file's suffix (``.csv``, ``.jsonl`` / ``.ndjson``; ``.gz`` after either is read
compressed). ``docs/trace-format.md`` describes every column; ``JOB_COLUMNS``, ``CLUSTER_COLUMNS`` and
``TENANT_COLUMNS`` below are the same definitions in code.

- jobs: one job per row (``job_id``, ``submit_s``, ``tenant``, shape, ``duration_s`` …);
- cluster (optional): nodes x cards x flavor with the node's CPU and memory; without it the cluster is
  sized to the trace's peak demand (``peak_cluster``);
- tenants (optional): the tenant tree and quotas; without it each tenant's guarantee is its share of the
  window's GPU time (``derive_guarantees``), the static partition's best fair setting.

``load_trace`` reads them into a ``Workload``; ``write_workload`` writes any ``Workload`` (the Philly and
Alibaba loaders' too) back out, so a bundled trace converts to this format. Pure Python, no Django.
A row that cannot be read raises ``TraceFormatError`` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from scheduler.core import validate
from scheduler.core.types import (
    MILLIS_PER_DEVICE,
    Device,
    Node,
    PendingJob,
    PriorityClass,
    ReplicaRequest,
    Topology,
)

from .loaders import flavors_by_capacity, peak_demand_gpus
from .workload import SimJob, Workload, proportional_split

FORMATS = ("csv", "jsonl")
FILE_NAMES = {"jobs": "jobs", "cluster": "cluster", "tenants": "tenants"}
PEAK_NODE_CARDS = 8  # cards per node of a cluster sized from the trace (no cluster file)
PEAK_CARD_MEMORY_MIB = 81920  # card memory of such a cluster when no job states a larger one


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    required: bool
    unit: str
    meaning: str


JOB_COLUMNS = (
    Column("job_id", True, "", "unique id of the job in the trace"),
    Column("submit_s", True, "s", "when it was submitted, seconds after the trace's start (>= 0)"),
    Column("tenant", True, "", "the tenant it ran for"),
    Column("replicas", False, "", "gang size: all replicas start together or none does (default 1)"),
    Column("cards", False, "cards", "whole cards per replica (give cards or millis)"),
    Column("millis", False, "millis", "per replica: 100..990 (steps of 10) a fraction of a card, N*1000 N cards"),
    Column("memory_mib", False, "MiB", "device memory per replica: needed by a fraction; else least card memory"),
    Column("cpu_cores", False, "cores", "host CPU per replica, beside its cards on the same node (default 0)"),
    Column("host_memory_mib", False, "MiB", "host memory per replica, on the same node (default 0)"),
    Column("flavors", False, "", "flavors it accepts, preferred first, separated by | (default: any in the cluster)"),
    Column("any_flavor", False, "", "true: the flavors are alternatives, not a preference (default false)"),
    Column("priority", False, "", "critical, high, normal (default), low, best_effort, or a number (higher wins)"),
    Column("preemptible", False, "", "true (default) or false"),
    Column("duration_s", True, "s", "time it runs on its devices when it is never stopped (> 0)"),
    Column("runtime_estimate_s", False, "s", "what the submitter said it would take; backfill plans with it"),
    Column("topology", False, "", "none (default), same_node, nvlink or numa"),
)
CLUSTER_COLUMNS = (
    Column("node", True, "", "node name; several rows with one name add cards of other flavors to that node"),
    Column("count", False, "", "this many such nodes, named <node>-1 .. <node>-<count> (default 1: named <node>)"),
    Column("cards", True, "cards", "cards of this flavor on the node (>= 1)"),
    Column("flavor", True, "", "the cards' flavor"),
    Column("memory_mib", True, "MiB", "memory of one card"),
    Column("cpu_cores", False, "cores", "allocatable host CPU of the node (empty: not limited)"),
    Column("host_memory_mib", False, "MiB", "allocatable host memory of the node (empty: not limited)"),
    Column("nvlink_domains", False, "", "NVLink domains the row's cards split into evenly (default 1; 0: no NVLink)"),
)
TENANT_COLUMNS = (
    Column("tenant", True, "", "tenant name (jobs name it in their tenant column)"),
    Column("parent", False, "", "parent tenant (empty: a root); a parent's quota counts its whole subtree"),
    Column("flavor", False, "", "the quota's flavor (empty: the row only places the tenant in the tree)"),
    Column("guaranteed_millis", False, "millis", "guaranteed capacity, 1000 = one card (default 0)"),
    Column("limit_millis", False, "millis", "most it may hold, borrowing included (empty: no limit)"),
    Column("lending_limit_millis", False, "millis", "most of its idle guarantee others may borrow (empty: all)"),
    Column("max_running_jobs", False, "", "most jobs it may run at once on the flavor (empty: no limit)"),
)

PRIORITY_NAMES = {p.name.lower(): int(p) for p in PriorityClass}
TOPOLOGIES = {t.value: t for t in Topology}
TRUE = ("true", "yes", "1", "on")
FALSE = ("false", "no", "0", "off")


class TraceFormatError(ValueError):
    """A trace file that cannot be read; the message names the file, line and column, and how to fix it."""


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """The tenants file: the tree (``parents``) and per tenant and flavor the quota's parts (millis)."""

    parents: Mapping[str, str | None] = field(default_factory=dict)
    guarantees: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    limits: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)
    lending_limits: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)
    max_running_jobs: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)

    @property
    def tenants(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.parents) | set(self.guarantees)))

    @classmethod
    def of(cls, workload: Workload) -> TenantSpec:
        return cls(
            parents={t: workload.parents.get(t) for t in workload.tenants},
            guarantees=workload.guarantees,
            limits=workload.limits,
            lending_limits=workload.lending_limits,
            max_running_jobs=workload.max_running_jobs,
        )


# -- reading ---------------------------------------------------------------------------------------------------


def file_format(path: str | os.PathLike[str]) -> str:
    """``csv`` or ``jsonl`` from the file's suffix (a trailing ``.gz`` is looked through)."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    last = suffixes[-1] if suffixes else ""
    if last == ".csv":
        return "csv"
    if last in (".jsonl", ".ndjson"):
        return "jsonl"
    raise TraceFormatError(f"{path}: cannot tell the format from the name; name it .csv or .jsonl (or .csv.gz)")


def _open_text(path: Path) -> IO[str]:
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def _rows(path: str | os.PathLike[str], columns: tuple[Column, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a CSV or JSON Lines file; empty cells and JSON nulls are None. Refuses unknown
    and missing required columns (a misspelt ``preemptable`` would otherwise be silently ignored)."""
    file = Path(path)
    if not file.is_file():
        raise TraceFormatError(f"{file}: no such file")
    fmt = file_format(file)
    known = {c.name for c in columns}
    required = [c.name for c in columns if c.required]
    with _open_text(file) as fh:
        if fmt == "csv":
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            _check_keys(file, 1, header, known, required, header=True)
            for row in reader:
                if None in row:
                    raise TraceFormatError(f"{file} line {reader.line_num}: more cells than the header has columns")
                yield reader.line_num, {k: (v if v is not None and v.strip() != "" else None) for k, v in row.items()}
            return
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(f"{file} line {number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise TraceFormatError(f"{file} line {number}: expected a JSON object, got {type(row).__name__}")
            _check_keys(file, number, list(row), known, required, header=False)
            yield number, {k: (None if v == "" else v) for k, v in row.items()}


def _check_keys(file: Path, line: int, keys: list[str], known: set[str], required: list[str], *, header: bool) -> None:
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise TraceFormatError(
            f"{file} line {line}: unknown column {unknown[0]!r}; the columns are {', '.join(sorted(known))}"
        )
    if header:
        missing = [k for k in required if k not in keys]
        if missing:
            raise TraceFormatError(f"{file} line {line}: the header lacks the required column {missing[0]!r}")


class _Cells:
    """Typed access to one row's cells; every problem is raised with the file, line and column."""

    def __init__(self, file: str | os.PathLike[str], line: int, row: dict[str, Any]) -> None:
        self.file, self.line, self.row = file, line, row

    def fail(self, column: str, problem: str) -> TraceFormatError:
        return TraceFormatError(f"{self.file} line {self.line}, column {column!r}: {problem}")

    def text(self, column: str, *, required: bool = False) -> str | None:
        value = self.row.get(column)
        if value is None:
            if required:
                raise self.fail(column, "is required")
            return None
        return str(value).strip()

    def number(self, column: str, *, required: bool = False, minimum: float | None = None) -> float | None:
        value = self.row.get(column)
        if value is None:
            if required:
                raise self.fail(column, "is required")
            return None
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise self.fail(column, f"expected a number, got {value!r}")
        if minimum is not None and number < minimum:
            raise self.fail(column, f"must be at least {minimum:g}, got {value!r}")
        return number

    def whole(self, column: str, *, required: bool = False, minimum: int | None = None) -> int | None:
        number = self.number(column, required=required, minimum=minimum)
        if number is None:
            return None
        if number != int(number):
            raise self.fail(column, f"expected a whole number, got {self.row[column]!r}")
        return int(number)

    def flag(self, column: str, default: bool) -> bool:
        value = self.row.get(column)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in TRUE:
            return True
        if text in FALSE:
            return False
        raise self.fail(column, f"expected true or false, got {value!r}")

    def names(self, column: str) -> tuple[str, ...]:
        value = self.row.get(column)
        if value is None:
            return ()
        items = value if isinstance(value, list) else str(value).split("|")
        return tuple(str(item).strip() for item in items if str(item).strip())


def _priority(cells: _Cells) -> int:
    value = cells.row.get("priority")
    if value is None:
        return int(PriorityClass.NORMAL)
    text = str(value).strip().lower().replace("-", "_").replace(" ", "_")
    if text in PRIORITY_NAMES:
        return PRIORITY_NAMES[text]
    try:
        return int(text)
    except ValueError:
        raise cells.fail("priority", f"expected {', '.join(PRIORITY_NAMES)} or a whole number, got {value!r}") from None


def _topology(cells: _Cells) -> Topology:
    text = (cells.text("topology") or Topology.NONE.value).lower()
    if text not in TOPOLOGIES:
        raise cells.fail("topology", f"expected one of {', '.join(TOPOLOGIES)}, got {text!r}")
    return TOPOLOGIES[text]


def _job(cells: _Cells) -> SimJob:
    cards = cells.whole("cards", minimum=1)
    millis = cells.whole("millis", minimum=1)
    if cards is None and millis is None:
        raise cells.fail("cards", "give the cards (whole cards) or the millis of each replica")
    if cards is not None and millis is not None and millis != cards * MILLIS_PER_DEVICE:
        raise cells.fail("millis", f"says {millis} but cards says {cards} ({cards * MILLIS_PER_DEVICE} millis)")
    per_replica = millis if millis is not None else cards * MILLIS_PER_DEVICE
    cpu = cells.number("cpu_cores", minimum=0) or 0.0
    job = SimJob(
        job_id=cells.text("job_id", required=True),
        tenant=cells.text("tenant", required=True),
        submit_s=cells.number("submit_s", required=True, minimum=0),
        duration_s=cells.number("duration_s", required=True, minimum=0),
        millis=per_replica,
        replicas=cells.whole("replicas", minimum=1) or 1,
        flavors=cells.names("flavors"),
        any_flavor=cells.flag("any_flavor", False),
        memory_mib=cells.whole("memory_mib", minimum=0) or 0,
        priority=_priority(cells),
        preemptible=cells.flag("preemptible", True),
        cpu_millicores=round(cpu * 1000),
        host_memory_mib=cells.whole("host_memory_mib", minimum=0) or 0,
        topology=_topology(cells),
        runtime_estimate_s=cells.number("runtime_estimate_s", minimum=0),
    )
    if job.duration_s <= 0:
        raise cells.fail("duration_s", "must be more than 0")
    if not job.job_id or not job.tenant:
        raise cells.fail("job_id" if not job.job_id else "tenant", "must not be blank")
    # The engine's own check of a request (the flavor is filled in later, from the cluster, when none is named).
    request = ReplicaRequest(flavors=job.flavors or ("any",), millis=job.millis, memory_mib=job.memory_mib)
    problem = validate(PendingJob(job_id=job.job_id, tenant=job.tenant, request=request, replicas=job.replicas))
    if problem:
        raise cells.fail("millis" if millis is not None else "cards", problem)
    return job


@dataclass(frozen=True, slots=True)
class _JobsFile:
    jobs: list[SimJob]
    lines: dict[str, int]  # job id → its line, for errors found later (flavors, tenants)


def _read_jobs(path: str | os.PathLike[str]) -> _JobsFile:
    jobs: list[SimJob] = []
    lines: dict[str, int] = {}
    for line, row in _rows(path, JOB_COLUMNS):
        cells = _Cells(path, line, row)
        job = _job(cells)
        if job.job_id in lines:
            raise cells.fail("job_id", f"{job.job_id!r} is also the id of the job on line {lines[job.job_id]}")
        lines[job.job_id] = line
        jobs.append(job)
    jobs.sort(key=lambda j: j.submit_s)  # stable: ties keep the file's order
    return _JobsFile(jobs, lines)


def read_jobs(path: str | os.PathLike[str]) -> list[SimJob]:
    """The jobs of a jobs file, in submit order (ties in the file's order)."""
    return _read_jobs(path).jobs


def read_cluster(path: str | os.PathLike[str]) -> tuple[Node, ...]:
    """The nodes of a cluster file, in the file's order; rows naming one node add cards to it."""
    order: list[str] = []
    cards: dict[str, list[Device]] = defaultdict(list)
    host: dict[str, tuple[int | None, int | None, int]] = {}
    for line, row in _rows(path, CLUSTER_COLUMNS):
        cells = _Cells(path, line, row)
        base = cells.text("node", required=True)
        count = cells.whole("count", minimum=1) or 1
        per_node = cells.whole("cards", required=True, minimum=1)
        flavor = cells.text("flavor", required=True)
        memory = cells.whole("memory_mib", required=True, minimum=1)
        cpu = cells.number("cpu_cores", minimum=0)
        host_memory = cells.whole("host_memory_mib", minimum=0)
        domains = cells.whole("nvlink_domains", minimum=0)
        domains = 1 if domains is None else min(domains, per_node)
        cpu_millicores = None if cpu is None else round(cpu * 1000)
        names = [base] if count == 1 else [f"{base}-{i}" for i in range(1, count + 1)]
        for name in names:
            if name in host and host[name][:2] != (cpu_millicores, host_memory):
                raise cells.fail("cpu_cores", f"node {name!r} states other CPU or memory on line {host[name][2]}")
            if name not in host:
                order.append(name)
                host[name] = (cpu_millicores, host_memory, line)
            if any(d.flavor == flavor for d in cards[name]):
                raise cells.fail("flavor", f"node {name!r} already has {flavor} cards; give them on one row")
            first = len(cards[name])
            for i in range(per_node):
                domain = None
                if domains == 1:
                    domain = f"{name}:nvl"
                elif domains > 1:
                    domain = f"{name}:nvl{i * domains // per_node}"
                cards[name].append(
                    Device(
                        uuid=f"{name}-{flavor}-{i}",
                        node=name,
                        index=first + i,
                        flavor=flavor,
                        memory_mib=memory,
                        nvlink_domain=domain,
                    )
                )
    if not order:
        raise TraceFormatError(f"{path}: the cluster file has no nodes")
    return tuple(
        Node(name=n, devices=tuple(cards[n]), cpu_millicores=host[n][0], host_memory_mib=host[n][1]) for n in order
    )


def read_tenants(path: str | os.PathLike[str]) -> TenantSpec:
    """The tenant tree and quotas of a tenants file."""
    parents: dict[str, str | None] = {}
    parent_line: dict[str, int] = {}
    parts: dict[str, dict[str, dict[str, int | None]]] = {
        k: defaultdict(dict) for k in ("guarantees", "limits", "lending", "jobs")
    }
    seen: dict[tuple[str, str], int] = {}
    for line, row in _rows(path, TENANT_COLUMNS):
        cells = _Cells(path, line, row)
        tenant = cells.text("tenant", required=True)
        parent = cells.text("parent")
        if parent is not None:
            if parents.get(tenant) not in (None, parent):
                raise cells.fail("parent", f"{tenant!r} has parent {parents[tenant]!r} on line {parent_line[tenant]}")
            parents[tenant] = parent
            parent_line[tenant] = line
        parents.setdefault(tenant, None)
        flavor = cells.text("flavor")
        if flavor is None:
            for column in ("guaranteed_millis", "limit_millis", "lending_limit_millis", "max_running_jobs"):
                if row.get(column) is not None:
                    raise cells.fail(column, "a quota needs its flavor; fill in the flavor column")
            continue
        if (tenant, flavor) in seen:
            raise cells.fail("flavor", f"{tenant!r} already has a {flavor} quota on line {seen[tenant, flavor]}")
        seen[tenant, flavor] = line
        parts["guarantees"][tenant][flavor] = cells.whole("guaranteed_millis", minimum=0) or 0
        parts["limits"][tenant][flavor] = cells.whole("limit_millis", minimum=0)
        parts["lending"][tenant][flavor] = cells.whole("lending_limit_millis", minimum=0)
        parts["jobs"][tenant][flavor] = cells.whole("max_running_jobs", minimum=0)
    for tenant, parent in parents.items():
        if parent is not None and parent not in parents:
            raise TraceFormatError(
                f"{path} line {parent_line[tenant]}, column 'parent': {parent!r} is not a tenant of this file; "
                "add a row for it"
            )
        walk, hops = parent, 0
        while walk is not None:
            hops += 1
            if walk == tenant or hops > len(parents):
                raise TraceFormatError(
                    f"{path} line {parent_line[tenant]}, column 'parent': {tenant!r} is its own ancestor"
                )
            walk = parents[walk]
    return TenantSpec(
        parents=parents,
        guarantees={t: dict(f) for t, f in parts["guarantees"].items()},
        limits={t: dict(f) for t, f in parts["limits"].items()},
        lending_limits=_stated(parts["lending"]),
        max_running_jobs=_stated(parts["jobs"]),
    )


def _stated(values: Mapping[str, Mapping[str, int | None]]) -> dict[str, dict[str, int]]:
    """Only the tenants and flavors with a value (None: no limit, the same as not stated)."""
    stated = {t: {f: v for f, v in by_flavor.items() if v is not None} for t, by_flavor in values.items()}
    return {t: by_flavor for t, by_flavor in stated.items() if by_flavor}


# -- the cluster and guarantees a trace does not give -------------------------------------------------------


def peak_cluster(jobs: Iterable[SimJob], *, cards_per_node: int = PEAK_NODE_CARDS) -> tuple[Node, ...]:
    """Nodes for each flavor the jobs ask first (``gpu`` when they name none): enough ``cards_per_node``-card
    nodes for the peak demand if every job started on arrival, and for the largest replica."""
    by_flavor: dict[str, list[SimJob]] = defaultdict(list)
    for job in jobs:
        by_flavor[job.flavors[0] if job.flavors else "gpu"].append(job)
    nodes: list[Node] = []
    for flavor, flavor_jobs in sorted(by_flavor.items()):
        widest = max(max(1, j.millis // MILLIS_PER_DEVICE) for j in flavor_jobs)
        per_node = max(cards_per_node, widest)
        count = max(1, math.ceil(peak_demand_gpus(flavor_jobs) / per_node))
        memory = max([PEAK_CARD_MEMORY_MIB, *(j.memory_mib for j in flavor_jobs)])
        for i in range(count):
            name = f"{flavor}-{i + 1:04d}"
            devices = tuple(
                Device(
                    uuid=f"{name}-{flavor}-{k}",
                    node=name,
                    index=k,
                    flavor=flavor,
                    memory_mib=memory,
                    nvlink_domain=f"{name}:nvl",
                )
                for k in range(per_node)
            )
            nodes.append(Node(name=name, devices=devices))
    return tuple(nodes)


def flavor_capacity(nodes: Iterable[Node]) -> dict[str, int]:
    """Millis of each flavor in the cluster."""
    capacity: dict[str, int] = defaultdict(int)
    for node in nodes:
        for device in node.devices:
            capacity[device.flavor] += MILLIS_PER_DEVICE
    return dict(capacity)


def derive_guarantees(jobs: Iterable[SimJob], nodes: Iterable[Node]) -> TenantSpec:
    """Guarantees from the window's demand: on each flavor, every tenant's share of the GPU time its jobs
    could run there (a job accepting k of the cluster's flavors counts 1/k on each), in whole cards summing to
    the flavor's capacity; every tenant with jobs gets a row on every flavor (0 if none: it may still
    borrow), limited to the flavor's capacity."""
    capacity = flavor_capacity(nodes)
    jobs = list(jobs)
    weights: dict[str, dict[str, float]] = {f: defaultdict(float) for f in capacity}
    for job in jobs:
        usable = [f for f in job.flavors if f in capacity] or list(capacity)
        for flavor in usable:
            weights[flavor][job.tenant] += job.gpus * job.duration_s / len(usable)
    tenants = sorted({j.tenant for j in jobs})
    guarantees: dict[str, dict[str, int]] = {t: {} for t in tenants}
    limits: dict[str, dict[str, int | None]] = {t: {} for t in tenants}
    for flavor, cap in sorted(capacity.items()):
        split = proportional_split(cap, dict(sorted(weights[flavor].items())))
        for tenant in tenants:
            guarantees[tenant][flavor] = split.get(tenant, 0)
            limits[tenant][flavor] = cap
    return TenantSpec(parents={t: None for t in tenants}, guarantees=guarantees, limits=limits)


def load_trace(
    jobs_path: str | os.PathLike[str],
    cluster_path: str | os.PathLike[str] | None = None,
    tenants_path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
) -> Workload:
    """The ``Workload`` of a trace: its jobs, the cluster file's nodes (else ``peak_cluster``) and the
    tenants file's tree and quotas (else ``derive_guarantees``). A job whose flavors are all missing from the
    cluster, or whose tenant the tenants file does not name, is an error (it could never run)."""
    jobs_file = _read_jobs(jobs_path)
    jobs = jobs_file.jobs
    nodes = read_cluster(cluster_path) if cluster_path else peak_cluster(jobs)
    capacity = flavor_capacity(nodes)
    order = flavors_by_capacity(nodes)
    resolved = []
    for job in jobs:
        if not job.flavors:  # any flavor of the cluster: alternatives, not a preference
            job = replace(job, flavors=order, any_flavor=True)
        elif not any(f in capacity for f in job.flavors):
            raise TraceFormatError(
                f"{jobs_path} line {jobs_file.lines[job.job_id]}, column 'flavors': job {job.job_id!r} asks for "
                f"{'|'.join(job.flavors)}, none of which the cluster has ({', '.join(sorted(capacity))})"
            )
        resolved.append(job)
    if tenants_path:
        spec = read_tenants(tenants_path)
        for job in resolved:
            if job.tenant not in spec.parents:
                raise TraceFormatError(
                    f"{jobs_path} line {jobs_file.lines[job.job_id]}, column 'tenant': {job.tenant!r} is not in "
                    f"{tenants_path}; add a row for it there"
                )
    else:
        spec = derive_guarantees(resolved, nodes)
    meta = {
        "gpus": sum(capacity.values()) // MILLIS_PER_DEVICE,
        "jobs": len(resolved),
        "trace": str(jobs_path),
        "cluster": str(cluster_path) if cluster_path else "peak demand",
        "guarantees_from": str(tenants_path) if tenants_path else "window",
    }
    return Workload(
        name=name or Path(jobs_path).name.split(".")[0],
        nodes=nodes,
        jobs=tuple(resolved),
        guarantees=spec.guarantees,
        limits=spec.limits,
        meta=meta,
        parents=spec.parents,
        lending_limits=spec.lending_limits,
        max_running_jobs=spec.max_running_jobs,
    )


# -- writing ---------------------------------------------------------------------------------------------------


def _number(value: float | int | None) -> float | int | None:
    """Whole floats as ints (3600.0 → 3600), so files stay readable; others unchanged (repr round-trips)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def job_row(job: SimJob) -> dict[str, Any]:
    """One job as a row of the jobs file (JSON values: lists, numbers, booleans, None for empty)."""
    whole = job.millis >= MILLIS_PER_DEVICE and job.millis % MILLIS_PER_DEVICE == 0
    priority: int | str = job.priority
    for text, value in PRIORITY_NAMES.items():
        if value == job.priority:
            priority = text
    return {
        "job_id": job.job_id,
        "submit_s": _number(job.submit_s),
        "tenant": job.tenant,
        "replicas": job.replicas,
        "cards": job.millis // MILLIS_PER_DEVICE if whole else None,
        "millis": None if whole else job.millis,
        "memory_mib": job.memory_mib or None,
        "cpu_cores": _number(job.cpu_millicores / 1000) if job.cpu_millicores else None,
        "host_memory_mib": job.host_memory_mib or None,
        "flavors": list(job.flavors),
        "any_flavor": True if job.any_flavor else None,
        "priority": priority,
        "preemptible": job.preemptible,
        "duration_s": _number(job.duration_s),
        "runtime_estimate_s": _number(job.runtime_estimate_s),
        "topology": None if job.topology == Topology.NONE else job.topology.value,
    }


def cluster_rows(nodes: Iterable[Node]) -> list[dict[str, Any]]:
    """One row per (node, flavor): its cards, the smallest card memory among them, the node's host resources
    and how many NVLink domains the cards form."""
    rows = []
    for node in nodes:
        by_flavor: dict[str, list[Device]] = defaultdict(list)
        for device in node.devices:
            by_flavor[device.flavor].append(device)
        for flavor, devices in by_flavor.items():
            domains = {d.nvlink_domain for d in devices if d.nvlink_domain}
            rows.append(
                {
                    "node": node.name,
                    "cards": len(devices),
                    "flavor": flavor,
                    "memory_mib": min(d.memory_mib for d in devices),
                    "cpu_cores": None if node.cpu_millicores is None else _number(node.cpu_millicores / 1000),
                    "host_memory_mib": node.host_memory_mib,
                    "nvlink_domains": len(domains),
                }
            )
    return rows


def tenant_rows(spec: TenantSpec) -> list[dict[str, Any]]:
    """One row per (tenant, flavor) quota; a tenant without quotas gets one row that places it in the tree."""
    rows = []
    for tenant in spec.tenants:
        parent = spec.parents.get(tenant)
        flavors = sorted(spec.guarantees.get(tenant, {}))
        if not flavors:
            rows.append({"tenant": tenant, "parent": parent})
        for flavor in flavors:
            rows.append(
                {
                    "tenant": tenant,
                    "parent": parent,
                    "flavor": flavor,
                    "guaranteed_millis": spec.guarantees[tenant][flavor],
                    "limit_millis": spec.limits.get(tenant, {}).get(flavor),
                    "lending_limit_millis": spec.lending_limits.get(tenant, {}).get(flavor),
                    "max_running_jobs": spec.max_running_jobs.get(tenant, {}).get(flavor),
                }
            )
    return rows


def dump_rows(rows: Iterable[Mapping[str, Any]], columns: tuple[Column, ...], fmt: str) -> str:
    """Rows as the text of a CSV (every column, in order) or JSON Lines file (only the non-empty keys)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    names = [c.name for c in columns]
    out = io.StringIO()
    if fmt == "jsonl":
        for row in rows:
            out.write(json.dumps({k: row[k] for k in names if row.get(k) not in (None, [])}) + "\n")
        return out.getvalue()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        writer.writerow([_cell(row.get(k)) for k in names])
    return out.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "|".join(str(v) for v in value)
    return str(value)


def trace_texts(jobs: Iterable[SimJob], nodes: Iterable[Node], tenants: TenantSpec, fmt: str = "csv") -> dict[str, str]:
    """File name → text of the three files (``jobs.csv``, ``cluster.csv``, ``tenants.csv`` or ``.jsonl``)."""
    return {
        f"jobs.{fmt}": dump_rows((job_row(j) for j in jobs), JOB_COLUMNS, fmt),
        f"cluster.{fmt}": dump_rows(cluster_rows(nodes), CLUSTER_COLUMNS, fmt),
        f"tenants.{fmt}": dump_rows(tenant_rows(tenants), TENANT_COLUMNS, fmt),
    }


def write_trace(
    directory: str | os.PathLike[str],
    jobs: Iterable[SimJob],
    nodes: Iterable[Node],
    tenants: TenantSpec,
    fmt: str = "csv",
) -> dict[str, Path]:
    """Write the three files into ``directory`` (made if missing); returns ``{"jobs": path, ...}``."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, text in trace_texts(jobs, nodes, tenants, fmt).items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        written[name.split(".")[0]] = path
    return written


def write_workload(workload: Workload, directory: str | os.PathLike[str], fmt: str = "csv") -> dict[str, Path]:
    """Any ``Workload`` (a bundled trace's too) in this format: its jobs, nodes, tenants and quotas."""
    return write_trace(directory, workload.jobs, workload.nodes, TenantSpec.of(workload), fmt)
