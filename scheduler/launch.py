"""The launch contract: what every replica of a job is told so that an unmodified framework finds its peers.

A gang is placed all at once; this module then reserves its ports and writes, for each replica, the variables
PyTorch (``env://`` and ``torchrun``), MPI and DeepSpeed (a hostfile), TensorFlow (``TF_CONFIG``) and JAX read,
beside gpupool's own. docs/distributed-training.md has the table and how it compares with Kubeflow's training
operator, the MPI Operator, Volcano and Slurm.

Ports (the *Reserve* step of kube-scheduler's framework: the plan chose nodes, binding takes what only binding
can check): each replica holds one port of its node's job port range (``GPUPOOL_JOB_PORT_RANGE``), replica 0
one more, the job's rendezvous port. A port is never held by two live replicas of one node (a unique constraint
says so to the database too). Ports come back when the replica's allocations end — after its process exited —
and are reclaimed lazily: a reservation on a node first deletes the rows of that node whose replica no longer
holds cards there. A gang whose nodes lack free ports stays queued with :data:`PORTS_EXHAUSTED` and a message
naming the node; it is never failed for it.
"""

from __future__ import annotations

import json
import secrets
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.db.models import Exists, OuterRef

from kernel.db.bulk import insert_rows
from nodeagent import protocol
from scheduler.core import sentences
from scheduler.core.sentences import say
from scheduler.core.types import PendingReason
from scheduler.fleet.models import Node
from scheduler.models import ACTIVE_JOB_STATES, MILLIS_PER_DEVICE, Allocation, Job, JobState, ReplicaPort

#: The pending reason of a gang placed on nodes whose port ranges are used up.
PORTS_EXHAUSTED = PendingReason.PORTS_EXHAUSTED


def port_range(node: Node | None = None) -> range:
    """The job port range of ``node``: what its agent announced (``--job-ports``), else the portal's
    ``GPUPOOL_JOB_PORT_RANGE`` ("first-last", inclusive)."""
    if node is not None:
        return _announced_range(node.job_port_first, node.job_port_last)
    raw = str(getattr(settings, "GPUPOOL_JOB_PORT_RANGE", "29500-32767"))
    try:
        low, high = protocol.parse_port_range(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"GPUPOOL_JOB_PORT_RANGE={exc}") from None
    return range(low, high + 1)


def _announced_range(first: int | None, last: int | None) -> range:
    """``port_range`` of a node whose agent announced ``first``-``last`` (None: nothing announced)."""
    return range(first, last + 1) if first and last else port_range()


@dataclass(frozen=True)
class Site:
    """Where one replica runs: its node, the address peers reach that node by, its own port, its processes."""

    replica: int
    node_id: int
    address: str
    port: int
    #: Processes the replica runs when it runs one per card: its whole cards, else 1.
    slots: int
    #: The replica's named ports (the job spec's ``ports``), name → port.
    named: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Launch:
    """The whole job's layout, the same for every replica: rank 0 (replica 0) is the master."""

    master_address: str
    master_port: int
    sites: tuple[Site, ...]  # by replica
    #: A secret of this placement: what a replica's launcher server (``nodeagent/mpi_launch.py``) asks for.
    token: str = ""

    def site(self, replica: int) -> Site:
        return next(site for site in self.sites if site.replica == replica)

    @property
    def node_order(self) -> list[int]:
        """The job's nodes in the order of their first replica (node rank 0 holds the master)."""
        order: list[int] = []
        for site in self.sites:
            if site.node_id not in order:
                order.append(site.node_id)
        return order

    def hostfile(self) -> str:
        """An Open MPI / DeepSpeed hostfile: one line per node, ``address slots=N``, in node-rank order."""
        slots: dict[int, int] = defaultdict(int)
        address: dict[int, str] = {}
        for site in self.sites:
            slots[site.node_id] += site.slots
            address[site.node_id] = site.address
        return "".join(f"{address[node]} slots={slots[node]}\n" for node in self.node_order)

    def peer_addresses(self) -> list[str]:
        """Every node address of the job, once each (the node agents let these reach the job's ports)."""
        return sorted({site.address for site in self.sites})


def slots_of(job: Job) -> int:
    """Processes one replica of ``job`` runs, one per card: its whole cards, or 1 for a fraction."""
    return max(1, job.millis_per_replica // MILLIS_PER_DEVICE)


def launch_env(launch: Launch, *, replica: int, replicas: int) -> dict[str, str]:
    """The variables replica ``replica`` of a ``replicas``-replica job starts with (beside ``GPUPOOL_REPLICA``).

    One process per replica is what ``python train.py`` gives: ``RANK`` is the replica, ``WORLD_SIZE`` the
    replicas. ``torchrun`` treats each replica as a node (``PET_*``: its arguments' environment form), starts
    ``PET_NPROC_PER_NODE`` processes (one per card) and sets their ranks itself.
    """
    site = launch.site(replica)
    node_rank = launch.node_order.index(site.node_id)
    on_node = [s.replica for s in launch.sites if s.node_id == site.node_id]
    master = f"{launch.master_address}:{launch.master_port}"
    workers = [f"{s.address}:{s.port}" for s in launch.sites]
    return {
        # gpupool's own
        "GPUPOOL_NODE_ADDRESS": site.address,
        "GPUPOOL_PORT": str(site.port),
        "GPUPOOL_MASTER": master,
        "GPUPOOL_HOSTS": ",".join(f"{address}:{slots}" for address, slots in _hosts(launch)),
        # torch.distributed env://
        "MASTER_ADDR": launch.master_address,
        "MASTER_PORT": str(launch.master_port),
        "WORLD_SIZE": str(replicas),
        "RANK": str(replica),
        "LOCAL_RANK": str(on_node.index(replica)),
        "LOCAL_WORLD_SIZE": str(len(on_node)),
        "NODE_RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        # torchrun: each replica is one of its nodes
        "PET_MASTER_ADDR": launch.master_address,
        "PET_MASTER_PORT": str(launch.master_port),
        "PET_NNODES": str(replicas),
        "PET_NODE_RANK": str(replica),
        "PET_NPROC_PER_NODE": str(site.slots),
        # TensorFlow MultiWorkerMirroredStrategy
        "TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": replica}}, separators=(",", ":")
        ),
        # jax.distributed.initialize()
        "JAX_COORDINATOR_ADDRESS": master,
        "JAX_NUM_PROCESSES": str(replicas),
        "JAX_PROCESS_ID": str(replica),
        **({"GPUPOOL_LAUNCH_TOKEN": launch.token} if launch.token else {}),
        **named_port_env(site.named),
    }


def named_port_env(named: tuple[tuple[str, int], ...]) -> dict[str, str]:
    """``GPUPOOL_PORT_<NAME>`` for each named port ('-' as '_'), and ``PORT`` for the first (what most servers
    read)."""
    env = {f"GPUPOOL_PORT_{name.upper().replace('-', '_')}": str(port) for name, port in named}
    if named:
        env["PORT"] = str(named[0][1])
    return env


def _hosts(launch: Launch) -> list[tuple[str, int]]:
    lines = launch.hostfile().splitlines()
    return [(line.split()[0], int(line.split("slots=")[1])) for line in lines]


# --- reserving ports ----------------------------------------------------------------------------------------


@dataclass
class PortRequest:
    """What one accepted place needs: its job, the node of each new replica, and whether it joins replicas that
    already run (a service scaling up keeps its rendezvous port and adds only its new replicas' ports)."""

    job: Job
    replica_nodes: Mapping[int, int]
    scaling: bool = False


@dataclass
class PortOutcome:
    launches: dict[int, Launch]  # by job pk
    refused: dict[int, str]  # job pk → why it stays queued


def ports_reserve(requests: Iterable[PortRequest], *, now: datetime) -> PortOutcome:
    """Reserve the ports of every request, all or nothing per job, in the caller's transaction (the cycle's,
    under its lock: the only writer of ports). Returns each job's :class:`Launch`, and why a job was refused."""
    requests = list(requests)
    outcome = PortOutcome(launches={}, refused={})
    if not requests:
        return outcome
    fresh = [r.job.pk for r in requests if not r.scaling]
    scaling = [r.job.pk for r in requests if r.scaling]
    nodes = {node for r in requests for node in r.replica_nodes.values()}
    # Rows of existing replicas of services that scale up: their sites stay in the launch.
    existing = (
        list(
            ReplicaPort.objects.filter(job_id__in=scaling).values_list(
                "job_id", "replica", "node_id", "port", "purpose", "name"
            )
        )
        if scaling
        else []
    )
    nodes |= {row[2] for row in existing}
    node_names: dict[int, str] = {}
    addresses: dict[int, str] = {}
    ranges: dict[int, range] = {}
    for pk, name, address, first, last in _nodes_read(nodes):
        node_names[pk], addresses[pk] = name, address or name  # Node.reachable_address
        ranges[pk] = _announced_range(first, last)
    taken: dict[int, set[int]] = defaultdict(set)
    for node_id, port in _release_stale_and_read_taken(node_ids=nodes, placing=fresh):
        taken[node_id].add(port)

    rows: list[tuple] = []
    for request in requests:
        job = request.job
        names = named_ports_of(job)
        needs: dict[int, int] = defaultdict(int)
        for replica, node_id in request.replica_nodes.items():
            # Its own port and its named ports; replica 0 also holds the rendezvous port.
            needs[node_id] += 1 + len(names) + (1 if replica == 0 else 0)
        chosen: dict[int, list[int]] = {}
        short = None
        for node_id, count in sorted(needs.items()):
            ports = ranges.get(node_id) or port_range()
            free = list(islice((port for port in ports if port not in taken[node_id]), count))
            if len(free) < count:
                short = node_id
                break
            chosen[node_id] = free
        if short is not None:
            ports = ranges.get(short) or port_range()
            node_name = node_names.get(short, short)
            outcome.refused[job.pk] = say(
                sentences.NODE_NO_FREE_PORT,
                node=node_name,
                range=f"{ports.start}-{ports.stop - 1}",
                held=len(taken[short]),
            )
            continue
        sites = []
        master_port = None
        mine = [row for row in existing if row[0] == job.pk]
        named_of: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for _job, replica, _node, port, purpose, name in mine:
            if purpose == ReplicaPort.Purpose.NAMED:
                named_of[replica].append((name, port))
        for _job, replica, node_id, port, purpose, _name in mine:
            if purpose == ReplicaPort.Purpose.RENDEZVOUS:
                master_port = port
            elif purpose == ReplicaPort.Purpose.REPLICA:
                named = tuple(sorted(named_of[replica], key=lambda item: names.index(item[0])))
                address = addresses.get(node_id, str(node_id))
                sites.append(Site(replica, node_id, address, port, slots_of(job), named))
        for replica, node_id in sorted(request.replica_nodes.items()):
            free = chosen[node_id]
            port = free.pop(0)
            taken[node_id].add(port)
            rows.append(_row(node_id, port, job, replica, ReplicaPort.Purpose.REPLICA, now))
            named = []
            for name in names:
                named.append((name, free.pop(0)))
                taken[node_id].add(named[-1][1])
                rows.append(_row(node_id, named[-1][1], job, replica, ReplicaPort.Purpose.NAMED, now, name=name))
            address = addresses.get(node_id, str(node_id))
            sites.append(Site(replica, node_id, address, port, slots_of(job), tuple(named)))
            if replica == 0:
                master_port = free.pop(0)
                taken[node_id].add(master_port)
                rows.append(_row(node_id, master_port, job, replica, ReplicaPort.Purpose.RENDEZVOUS, now))
        sites.sort(key=lambda site: site.replica)
        master_site = next((site for site in sites if site.replica == 0), sites[0])
        outcome.launches[job.pk] = Launch(
            master_address=master_site.address,
            master_port=master_port if master_port is not None else master_site.port,
            sites=tuple(sites),
            token=secrets.token_urlsafe(24),
        )
    insert_rows(ReplicaPort, _PORT_COLUMNS, rows)
    return outcome


_PORT_COLUMNS = ("node_id", "port", "job_id", "replica", "purpose", "name", "reserved_at")


def _row(node_id: int, port: int, job: Job, replica: int, purpose: str, now: datetime, name: str = "") -> tuple:
    return (node_id, port, job.pk, replica, purpose, name, now)


# The cycle reserves ports for every job it places, so these run in every placing cycle: on PostgreSQL as fixed
# statements (composing the ORM's in_bulk, its two deletes and the read of the ports taken cost more CPU than
# the rest of the reservation, ~16 ms of a profiled placing cycle); elsewhere through the ORM.
_NODES_SQL = f"SELECT id, name, address, job_port_first, job_port_last FROM {Node._meta.db_table} WHERE id = ANY(%s)"
_RELEASE_AND_TAKEN_SQL = f"""
    WITH released AS (
        DELETE FROM {ReplicaPort._meta.db_table} p
        WHERE (p.node_id = ANY(%s) AND NOT EXISTS (
                  SELECT 1 FROM {Allocation._meta.db_table} a
                  WHERE a.job_id = p.job_id AND a.replica = p.replica AND a.node_id = p.node_id
                    AND a.ended_at IS NULL))
           OR p.job_id = ANY(%s)
        RETURNING p.id
    )
    SELECT node_id, port FROM {ReplicaPort._meta.db_table}
    WHERE node_id = ANY(%s) AND id NOT IN (SELECT id FROM released)
"""


def _nodes_read(node_ids: Iterable[int]) -> list[tuple]:
    """(id, name, address, job_port_first, job_port_last) of each node."""
    node_ids = list(node_ids)
    if connection.vendor != "postgresql":
        return list(
            Node.objects.filter(pk__in=node_ids).values_list("pk", "name", "address", "job_port_first", "job_port_last")
        )
    with connection.cursor() as cursor:
        cursor.execute(_NODES_SQL, [node_ids])
        return cursor.fetchall()


def _release_stale_and_read_taken(*, node_ids: Iterable[int], placing: Iterable[int]) -> list[tuple[int, int]]:
    """Delete the port rows of ``node_ids`` whose replica holds no active allocation there any more, and every
    row of the jobs being placed afresh (their earlier run's); then the (node, port) rows left on ``node_ids``."""
    node_ids, placing = list(node_ids), list(placing)
    if connection.vendor == "postgresql":
        # One statement: the SELECT sees the table as it was before the DELETE in its WITH, so it leaves out
        # what that deleted.
        with connection.cursor() as cursor:
            cursor.execute(_RELEASE_AND_TAKEN_SQL, [node_ids, placing, node_ids])
            return cursor.fetchall()
    holding = Allocation.objects.filter(
        job_id=OuterRef("job_id"), replica=OuterRef("replica"), node_id=OuterRef("node_id"), ended_at__isnull=True
    )
    ReplicaPort.objects.filter(node_id__in=node_ids).exclude(Exists(holding)).delete()
    if placing:
        ReplicaPort.objects.filter(job_id__in=placing).delete()
    return list(ReplicaPort.objects.filter(node_id__in=node_ids).values_list("node_id", "port"))


def named_ports_of(job: Job) -> list[str]:
    """The names of ``job``'s named ports (its spec's ``ports``), in order."""
    return [str(port["name"]) for port in (job.spec or {}).get("ports") or []]


def job_ports(job: Job) -> list[dict]:
    """The ports ``job``'s live replicas hold, for the API: ``{replica, node, address, port, purpose}``."""
    if job.state not in ACTIVE_JOB_STATES and job.state != JobState.CANCELLED:
        return []  # a pending or finished job holds none (and asks the database nothing, a submit's answer)
    holding = Allocation.objects.filter(
        job_id=OuterRef("job_id"), replica=OuterRef("replica"), node_id=OuterRef("node_id"), ended_at__isnull=True
    )
    rows = (
        ReplicaPort.objects.filter(job=job)
        .filter(Exists(holding))
        .select_related("node")
        .order_by("replica", "purpose", "port")
    )
    return [
        {
            "replica": row.replica,
            "node": row.node.name,
            "address": row.node.reachable_address,
            "port": row.port,
            "purpose": row.purpose,
            "name": row.name,
        }
        for row in rows
    ]
