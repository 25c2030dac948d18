"""Never fits: a job no state of the registered pool and its quota tree could ever start (``sbatch`` refuses
such a job at submit; so do we, and a job that becomes one later says so instead of waiting silently).

Two sources bound what a job can ever get, each per flavor:

- the *fleet*: every registered node with cards of the flavor, whatever its state (a cordoned, draining or
  not-ready node and an unhealthy card may come back; a node deleted no longer counts) — the most cards one
  node has, the largest card's memory, the cards and device memory of the whole flavor, the most host CPU and
  memory one node states (:class:`FlavorFleet`, built by :func:`fleets_of` from the snapshot's nodes, or by
  the submit service from the same rows in SQL);
- the *quota tree*: the smallest ``limit_millis`` on the path from the quota node the job is charged to up to
  the root; a job that is not preemptible never borrows, so for it also its quota node's guarantee.

A flavor no registered node has (a fresh install, nodes not enrolled yet) bounds nothing on the fleet side:
the job is judged against its quota tree only and waits with ``no_such_flavor`` meanwhile. A job naming several
flavors never fits only when it fits on none of them. The bounds are upper bounds: a job refused here cannot
start in any state of the pool; a job accepted may still wait for a shape the pool has but never has free at
once (the engine's ordinary reasons say so).

Pure: no Django, no clock; :func:`never_fits` is what the submit service and the cycle both call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from scheduler.core import sentences
from scheduler.core.sentences import say

from .quota import cards
from .types import (
    MILLIS_PER_DEVICE,
    Explain,
    Node,
    PendingJob,
    PendingReason,
    Plan,
    Quota,
    ReplicaRequest,
    Snapshot,
    Tenant,
    Topology,
)

#: What a pending message adds after the sentences: nothing the job does changes it, only the pool.
NEVER_FITS_SUFFIX = sentences.CANNOT_START_UNTIL_NODES


class Bound(StrEnum):
    """Which bound a job is over: stable codes for the API (``limit.bound``) and the tests."""

    CARDS_PER_NODE = "cards_per_node"
    CARD_MEMORY = "card_memory"
    CARDS_IN_POOL = "cards_in_pool"
    MEMORY_IN_POOL = "memory_in_pool"
    SAME_NODE = "same_node"
    NODE_CPU = "node_cpu"
    NODE_MEMORY = "node_memory"
    QUOTA_LIMIT = "quota_limit"
    GUARANTEE = "guarantee"


@dataclass(frozen=True, slots=True)
class FlavorFleet:
    """The largest shape the registered nodes of one flavor can ever give."""

    flavor: str
    cards: int  # registered cards of the flavor
    max_cards_per_node: int
    max_card_memory_mib: int
    memory_mib: int  # device memory of all those cards together
    # The most host CPU (millicores) / memory (MiB) a node with the flavor states; None when a node with it
    # states none (it is not limited on that dimension, as in the engine).
    max_node_cpu_millicores: int | None = None
    max_node_host_memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class QuotaLevel:
    """One quota node on a job's path: the tenant with a ``Quota`` row for the flavor, nearest first."""

    tenant: str
    guaranteed_millis: int
    limit_millis: int | None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a job can never start on one flavor: the spec field, what it asks and the most it can ever get."""

    flavor: str
    bound: Bound
    field: str  # the job spec's field path, as in spec errors: ``resources.gpus``
    asked: int | float
    largest: int | float
    unit: str  # "cards", "MiB" or "cores"
    sentence: str  # the bound in words, without the field: "per-replica cards: 64 asked, ..."
    fix: str  # how to change the job so it fits
    by: str = ""  # the tenant whose limit or guarantee it is (quota bounds)

    def as_dict(self) -> dict[str, object]:
        body: dict[str, object] = {
            "flavor": self.flavor,
            "bound": str(self.bound),
            "field": self.field,
            "asked": self.asked,
            "largest": self.largest,
            "unit": self.unit,
        }
        if self.by:
            body["tenant"] = self.by
        return body


@dataclass(frozen=True, slots=True)
class NeverFits:
    """A job that fits on none of its flavors: one refusal per flavor, in the job's order."""

    refusals: tuple[Refusal, ...]

    @property
    def field(self) -> str:
        return self.refusals[0].field

    @property
    def sentences(self) -> str:
        return "; ".join(refusal.sentence for refusal in self.refusals)

    @property
    def fix(self) -> str:
        """How to change the job so that it fits (on its first flavor)."""
        return self.refusals[0].fix

    def pending_message(self) -> str:
        """The pending reason's sentence of a queued job that became impossible."""
        return f"{self.sentences}; {NEVER_FITS_SUFFIX}"


def fleets_of(nodes: Iterable[Node]) -> dict[str, FlavorFleet]:
    """Per flavor, what the registered ``nodes`` can ever give (states and health do not matter here)."""
    per_node: dict[str, list[tuple[Node, int]]] = {}
    max_memory: dict[str, int] = {}
    total_memory: dict[str, int] = {}
    for node in nodes:
        counts: dict[str, int] = {}
        for device in node.devices:
            counts[device.flavor] = counts.get(device.flavor, 0) + 1
            max_memory[device.flavor] = max(max_memory.get(device.flavor, 0), device.memory_mib)
            total_memory[device.flavor] = total_memory.get(device.flavor, 0) + device.memory_mib
        for flavor, count in counts.items():
            per_node.setdefault(flavor, []).append((node, count))
    fleets = {}
    for flavor, rows in per_node.items():
        cpus = [node.cpu_millicores for node, _ in rows]
        memories = [node.host_memory_mib for node, _ in rows]
        fleets[flavor] = FlavorFleet(
            flavor=flavor,
            cards=sum(count for _, count in rows),
            max_cards_per_node=max(count for _, count in rows),
            max_card_memory_mib=max_memory[flavor],
            memory_mib=total_memory[flavor],
            max_node_cpu_millicores=None if None in cpus else max(c for c in cpus if c is not None),
            max_node_host_memory_mib=None if None in memories else max(m for m in memories if m is not None),
        )
    return fleets


class QuotaPaths:
    """The quota tree read once (``quota_paths`` per tenant, without re-reading every quota row each time)."""

    def __init__(self, tenants: Sequence[Tenant], quotas: Sequence[Quota]) -> None:
        self._parent = {t.name: t.parent for t in tenants}
        self._rows: dict[str, list[Quota]] = {}
        for quota in sorted(quotas, key=lambda q: (q.tenant, q.flavor)):
            self._rows.setdefault(quota.tenant, []).append(quota)

    def of(self, tenant: str) -> dict[str, tuple[QuotaLevel, ...]]:
        """Per flavor with a quota row on ``tenant``'s way up, the quota nodes a job of ``tenant`` answers to:
        the one it is charged to (the nearest with a row, as in ``QuotaBook.account``), then its ancestors with
        one. A flavor without any row on the way is not in the answer (no limit from the tree)."""
        chain, seen = [tenant], {tenant}
        while (up := self._parent.get(chain[-1])) is not None and up not in seen:  # tolerate a cycle in bad input
            chain.append(up)
            seen.add(up)
        paths: dict[str, list[QuotaLevel]] = {}
        for name in chain:
            for quota in self._rows.get(name, ()):
                paths.setdefault(quota.flavor, []).append(QuotaLevel(name, quota.guaranteed_millis, quota.limit_millis))
        return {flavor: tuple(levels) for flavor, levels in paths.items()}


def quota_paths(tenant: str, tenants: Sequence[Tenant], quotas: Sequence[Quota]) -> dict[str, tuple[QuotaLevel, ...]]:
    """:meth:`QuotaPaths.of` for one tenant."""
    return QuotaPaths(tenants, quotas).of(tenant)


def never_fits(
    *,
    request: ReplicaRequest,
    replicas: int,
    preemptible: bool,
    topology: Topology | str = Topology.NONE,
    fleets: Mapping[str, FlavorFleet],
    quota_paths: Mapping[str, Sequence[QuotaLevel]],
    replicas_field: str = "replicas",
) -> NeverFits | None:
    """Why a job of ``replicas`` (its gang: all at once) of ``request`` can never start, or None when some
    flavor could ever give it. ``quota_paths`` as :func:`quota_paths` gives them; ``replicas_field`` names the
    spec field the gang size comes from (``min_replicas`` for an inference service that starts with fewer)."""
    refusals = []
    for flavor in request.flavors:
        refusal = _refusal(request, flavor, replicas, preemptible, str(topology), fleets.get(flavor), quota_paths)
        if refusal is None:
            return None
        refusals.append(refusal if replicas_field == "replicas" else _renamed(refusal, replicas_field))
    return NeverFits(tuple(refusals)) if refusals else None


def _renamed(refusal: Refusal, replicas_field: str) -> Refusal:
    return replace(refusal, field=replicas_field) if refusal.field == "replicas" else refusal


def _refusal(
    req: ReplicaRequest,
    flavor: str,
    replicas: int,
    preemptible: bool,
    topology: str,
    fleet: FlavorFleet | None,
    paths: Mapping[str, Sequence[QuotaLevel]],
) -> Refusal | None:
    """The first bound the job is over on ``flavor``: the replica's own shape, then the gang, then quota."""
    size_field = "resources.millis" if req.fractional else "resources.gpus"
    per_replica = req.device_count
    total_millis = req.millis * replicas
    gang_field = "replicas" if replicas > 1 else size_field
    if fleet is not None and fleet.cards > 0:
        if not req.fractional and per_replica > fleet.max_cards_per_node:
            return Refusal(
                flavor,
                Bound.CARDS_PER_NODE,
                size_field,
                per_replica,
                fleet.max_cards_per_node,
                "cards",
                say(sentences.PER_REPLICA_CARDS_ASKED, n=per_replica, flavor=flavor, m=fleet.max_cards_per_node),
                say(sentences.REPLICAS_CARDS_ONE_NODE, m=fleet.max_cards_per_node),
            )
        if req.memory_mib > fleet.max_card_memory_mib:
            return Refusal(
                flavor,
                Bound.CARD_MEMORY,
                "resources.memory_mib",
                req.memory_mib,
                fleet.max_card_memory_mib,
                "MiB",
                say(sentences.MEMORY_MIB_ASKED_LARGEST, n=req.memory_mib, flavor=flavor, m=fleet.max_card_memory_mib),
                say(sentences.ASK_MOST_MIB_DEVICE, m=fleet.max_card_memory_mib),
            )
        if fleet.max_node_cpu_millicores is not None and req.cpu_millicores > fleet.max_node_cpu_millicores:
            return Refusal(
                flavor,
                Bound.NODE_CPU,
                "resources.cpu_cores",
                req.cpu_millicores / 1000,
                fleet.max_node_cpu_millicores / 1000,
                "cores",
                say(
                    sentences.CPU_CORES_PER_REPLICA,
                    n=format(req.cpu_millicores / 1000, "g"),
                    flavor=flavor,
                    m=format(fleet.max_node_cpu_millicores / 1000, "g"),
                ),
                say(sentences.ASK_MOST_CORES_PER, m=format(fleet.max_node_cpu_millicores / 1000, "g")),
            )
        if fleet.max_node_host_memory_mib is not None and req.host_memory_mib > fleet.max_node_host_memory_mib:
            return Refusal(
                flavor,
                Bound.NODE_MEMORY,
                "resources.host_memory_mib",
                req.host_memory_mib,
                fleet.max_node_host_memory_mib,
                "MiB",
                say(
                    sentences.HOST_MEMORY_PER_REPLICA,
                    n=req.host_memory_mib,
                    flavor=flavor,
                    m=fleet.max_node_host_memory_mib,
                ),
                say(sentences.ASK_MOST_MIB_HOST, m=fleet.max_node_host_memory_mib),
            )
        if total_millis > fleet.cards * MILLIS_PER_DEVICE:
            return Refusal(
                flavor,
                Bound.CARDS_IN_POOL,
                gang_field,
                total_millis / MILLIS_PER_DEVICE,
                fleet.cards,
                "cards",
                say(
                    sentences.CARDS_ONCE_ASKED_X,
                    n=cards(total_millis),
                    r=replicas,
                    c=cards(req.millis),
                    m=fleet.cards,
                    flavor=flavor,
                ),
                say(sentences.ALL_REPLICAS_START_TOGETHER, m=fleet.cards),
            )
        if req.fractional and req.memory_mib * replicas > fleet.memory_mib:
            return Refusal(
                flavor,
                Bound.MEMORY_IN_POOL,
                gang_field,
                req.memory_mib * replicas,
                fleet.memory_mib,
                "MiB",
                say(
                    sentences.DEVICE_MEMORY_ONCE_MIB,
                    n=req.memory_mib * replicas,
                    r=replicas,
                    c=req.memory_mib,
                    flavor=flavor,
                    m=fleet.memory_mib,
                ),
                sentences.ALL_REPLICAS_START_TOGETHER_ASK,
            )
        node_millis = fleet.max_cards_per_node * MILLIS_PER_DEVICE
        if topology == Topology.SAME_NODE and replicas > 1 and total_millis > node_millis:
            return Refusal(
                flavor,
                Bound.SAME_NODE,
                "topology",
                total_millis / MILLIS_PER_DEVICE,
                fleet.max_cards_per_node,
                "cards",
                say(sentences.CARDS_ONE_NODE_SAME, n=cards(total_millis), flavor=flavor, m=fleet.max_cards_per_node),
                say(sentences.ASK_MOST_CARDS_ALL, m=fleet.max_cards_per_node),
            )
    return _quota_refusal(flavor, total_millis, gang_field, preemptible, paths.get(flavor, ()))


def _quota_refusal(
    flavor: str, total_millis: int, field: str, preemptible: bool, path: Sequence[QuotaLevel]
) -> Refusal | None:
    limits = [(level.limit_millis, level.tenant) for level in path if level.limit_millis is not None]
    if limits:
        # The tightest limit; the nearest tenant among equals (the one whose admin would be asked first).
        limit, tenant = min(limits, key=lambda item: item[0])
        if total_millis > limit:
            return Refusal(
                flavor,
                Bound.QUOTA_LIMIT,
                field,
                total_millis / MILLIS_PER_DEVICE,
                limit / MILLIS_PER_DEVICE,
                "cards",
                say(
                    sentences.TENANTS_QUOTA_TREE_ALLOWS,
                    m=cards(limit),
                    flavor=flavor,
                    tenant=tenant,
                    n=cards(total_millis),
                ),
                say(sentences.ASK_MOST_CARDS_ALL_ASK, m=cards(limit), tenant=tenant),
                by=tenant,
            )
    if path and not preemptible and total_millis > path[0].guaranteed_millis:
        account = path[0]
        return Refusal(
            flavor,
            Bound.GUARANTEE,
            "preemptible",
            total_millis / MILLIS_PER_DEVICE,
            account.guaranteed_millis / MILLIS_PER_DEVICE,
            "cards",
            say(
                sentences.JOB_NOT_PREEMPTIBLE_GETS,
                m=cards(account.guaranteed_millis),
                flavor=flavor,
                tenant=account.tenant,
                n=cards(total_millis),
            ),
            say(sentences.SET_PREEMPTIBLE_TRUE_BORROW, m=cards(account.guaranteed_millis)),
            by=account.tenant,
        )
    return None


def job_never_fits(
    job: PendingJob, fleets: Mapping[str, FlavorFleet], paths: Mapping[str, Sequence[QuotaLevel]]
) -> NeverFits | None:
    """:func:`never_fits` for a job of the snapshot (its gang: ``gang_min`` replicas)."""
    return never_fits(
        request=job.request,
        replicas=job.gang_min,
        preemptible=job.preemptible,
        topology=job.topology,
        fleets=fleets,
        quota_paths=paths,
        replicas_field="min_replicas" if job.gang_min < job.replicas else "replicas",
    )


def split_never_fits(snapshot: Snapshot) -> tuple[Snapshot, dict[str, NeverFits]]:
    """``snapshot`` without its pending jobs that can never start, and why each cannot. Those jobs are kept out
    of the cycle altogether: they would hold capacity as the head of a queue or claim guarantee they can never
    use. A running service scaling up (``first_replica > 0``) is left to the engine."""
    if not snapshot.pending:
        return snapshot, {}
    fleets = fleets_of(snapshot.nodes)
    tree = QuotaPaths(snapshot.tenants, snapshot.quotas)
    paths: dict[str, Mapping[str, Sequence[QuotaLevel]]] = {}
    refused: dict[str, NeverFits] = {}
    # Jobs of one shape in one tenant get one answer (a queue is mostly a few shapes, many times).
    answers: dict[tuple, NeverFits | None] = {}
    for job in snapshot.pending:
        if job.first_replica:
            continue
        shape = (job.tenant, job.request, job.gang_min, job.replicas, job.preemptible, job.topology)
        if shape not in answers:
            if job.tenant not in paths:
                paths[job.tenant] = tree.of(job.tenant)
            answers[shape] = job_never_fits(job, fleets, paths[job.tenant])
        why = answers[shape]
        if why is not None:
            refused[job.job_id] = why
    if not refused:
        return snapshot, {}
    kept = tuple(job for job in snapshot.pending if job.job_id not in refused)
    return replace(snapshot, pending=kept), refused


def with_never_fits(plan: Plan, snapshot: Snapshot, refused: Mapping[str, NeverFits]) -> Plan:
    """``plan`` with an explanation (``never_fits``) for each job of ``refused``, after the queue's own: they
    are not in the queue the cycle served, so they come last, by priority, then submit time (then id: the
    same whatever the snapshot's order)."""
    if not refused:
        return plan
    overall = len(plan.explanations)
    per_tenant: dict[str, int] = {}
    for explain in plan.explanations:
        per_tenant[explain.tenant] = per_tenant.get(explain.tenant, 0) + 1
    extra = []
    jobs = sorted(
        (job for job in snapshot.pending if job.job_id in refused),
        key=lambda job: (-job.priority, job.submitted_at, job.job_id),
    )
    for job in jobs:
        why = refused[job.job_id]
        overall += 1
        per_tenant[job.tenant] = per_tenant.get(job.tenant, 0) + 1
        extra.append(
            Explain(
                job_id=job.job_id,
                code=PendingReason.NEVER_FITS,
                message=why.pending_message(),
                position_in_tenant=per_tenant[job.tenant],
                position_overall=overall,
                tenant=job.tenant,
            )
        )
    return replace(plan, explanations=(*plan.explanations, *extra))
