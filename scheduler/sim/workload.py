"""What a simulation replays: the cluster (core ``Node``s), the tenants with their quotas, and the jobs.

Plain frozen dataclasses, no Django. Loaders (``loaders.py``) build a ``Workload`` from a trace; tests build
small ones by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.core.types import MILLIS_PER_DEVICE, Device, Node, PriorityClass, Topology


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of a trace. ``duration_s`` is the work it needs on its devices when it never stops."""

    job_id: str
    tenant: str
    submit_s: float
    duration_s: float
    millis: int = MILLIS_PER_DEVICE  # per replica: a fraction (100..990) or N*1000 whole cards
    replicas: int = 1
    flavors: tuple[str, ...] = ("gpu",)
    memory_mib: int = 0
    priority: int = PriorityClass.NORMAL
    preemptible: bool = True
    trace_millis: int | None = None  # per replica as the trace asked, before rounding to the core's 10-millis steps
    cpu_millicores: int = 0  # host CPU per replica (0: none asked)
    host_memory_mib: int = 0  # host memory per replica (0: none asked)
    topology: Topology = Topology.NONE
    runtime_estimate_s: float | None = None  # what the submitter said it would take (the engine's backfill uses it)
    any_flavor: bool = False  # the flavors are alternatives, not a preference (the trace named no GPU model)

    @property
    def gpus(self) -> float:
        """Cards the job holds, fractions counted as such (0.5 for 500 millis)."""
        return self.replicas * self.millis / MILLIS_PER_DEVICE

    @property
    def charged_millis(self) -> int:
        return self.replicas * self.millis


@dataclass(frozen=True, slots=True)
class Workload:
    """A cluster plus the jobs to replay on it.

    ``guarantees[tenant][flavor]`` (millis) is what each tenant is promised; policies that use quotas turn it
    into ``Quota`` rows with ``limit_millis = limits[tenant][flavor]`` (None: no limit),
    ``lending_limit_millis = lending_limits[tenant][flavor]`` and ``max_running_jobs[tenant][flavor]`` (both
    None or missing: no limit). ``parents[tenant]`` places a tenant in the tree (missing: a root); a parent's
    quota counts its whole subtree, as in the engine.
    """

    name: str
    nodes: tuple[Node, ...]
    jobs: tuple[SimJob, ...]
    guarantees: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    limits: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)
    meta: Mapping[str, object] = field(default_factory=dict)
    parents: Mapping[str, str | None] = field(default_factory=dict)
    lending_limits: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)
    max_running_jobs: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)

    @property
    def capacity_millis(self) -> int:
        return sum(MILLIS_PER_DEVICE for n in self.nodes for _ in n.devices)

    @property
    def tenants(self) -> tuple[str, ...]:
        named = {j.tenant for j in self.jobs} | set(self.guarantees) | set(self.parents)
        return tuple(sorted(named | {p for p in self.parents.values() if p}))


def uniform_nodes(
    count: int, gpus_per_node: int = 8, *, flavor: str = "gpu", memory_mib: int = 16384, prefix: str = "n"
):
    """``count`` identical nodes of ``gpus_per_node`` cards (one NVLink domain per node)."""
    return tuple(node(f"{prefix}{i:04d}", gpus_per_node, flavor=flavor, memory_mib=memory_mib) for i in range(count))


def node(
    name: str,
    gpus: int,
    *,
    flavor: str = "gpu",
    memory_mib: int = 16384,
    cpu_millicores: int | None = None,
    host_memory_mib: int | None = None,
) -> Node:
    devices = tuple(
        Device(
            uuid=f"{name}-{flavor}-{i}",
            node=name,
            index=i,
            flavor=flavor,
            memory_mib=memory_mib,
            nvlink_domain=f"{name}:nvl",
        )
        for i in range(gpus)
    )
    return Node(name=name, devices=devices, cpu_millicores=cpu_millicores, host_memory_mib=host_memory_mib)


def proportional_split(total: int, weights: Mapping[str, float], *, unit: int = MILLIS_PER_DEVICE) -> dict[str, int]:
    """Split ``total`` (a multiple of ``unit``) into shares proportional to ``weights``, in whole ``unit``s,
    summing exactly to ``total`` (largest remainder; ties by name so the split is deterministic)."""
    units = total // unit
    weight_sum = sum(max(0.0, w) for w in weights.values())
    if weight_sum <= 0 or units <= 0:
        return {t: 0 for t in weights}
    exact = {t: units * max(0.0, w) / weight_sum for t, w in weights.items()}
    out = {t: int(v) for t, v in exact.items()}
    left = units - sum(out.values())
    for t in sorted(exact, key=lambda t: (-(exact[t] - out[t]), t))[:left]:
        out[t] += 1
    return {t: v * unit for t, v in out.items()}
