"""The contract of the scheduling engine: what goes in (``Snapshot``, ``Policy``) and what comes out (``Plan``).

Plain frozen dataclasses, standard library only, no Django. The Django side converts models into a
``Snapshot`` and the decisions of a ``Plan`` back into rows; the simulator feeds synthetic snapshots.

Units, everywhere:
- compute in *millis* (milli-devices): 1000 is one whole card, a fraction is 100..990 in steps of 10;
  a request of N whole cards is ``N * 1000`` and takes N cards exclusively;
- device memory in MiB;
- host CPU in *millicores* (1000 is one core) and host memory in MiB, per node and per replica; a node that
  states neither (``None``) is not limited on that dimension (older snapshots, tests);
- time in seconds as a float (``Snapshot.now`` is the only clock the engine sees).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

MILLIS_PER_DEVICE = 1000
MIN_FRACTION_MILLIS = 100
FRACTION_STEP_MILLIS = 10  # a hundredth of a card: MPS takes its thread share in whole per cent


class PriorityClass(IntEnum):
    """Named priority classes; any int works, higher wins."""

    CRITICAL = 1000
    HIGH = 800
    NORMAL = 500
    LOW = 200
    BEST_EFFORT = 0


class JobKind(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    INTERACTIVE = "interactive"
    BATCH = "batch"


class Topology(StrEnum):
    """Placement constraint of a job.

    - ``none``: each replica's cards on one node (a replica never spans nodes); the best link is preferred.
    - ``same_node``: all replicas of the job on one node.
    - ``nvlink``: each replica's cards inside one NVLink domain (required, not just preferred).
    - ``numa``: each replica's cards on one NUMA node.
    """

    NONE = "none"
    SAME_NODE = "same_node"
    NVLINK = "nvlink"
    NUMA = "numa"


class Ordering(StrEnum):
    PRIORITY_FAIRSHARE = "priority_fairshare"  # priority class, then fair share, then submit time
    FIFO = "fifo"  # submit time only


class FractionalStrategy(StrEnum):
    BEST_FIT = "best_fit"  # the fullest card that still fits (least fragmentation)
    WORST_FIT = "worst_fit"  # the emptiest card (spreads load)
    RANDOM = "random"  # a seeded random card that fits (``Policy.seed``)
    # the card that raises the node's fragmentation for the target workload the least (FGD, ``fragment.py``)
    FRAGMENTATION = "fragmentation"


class PreemptReason(StrEnum):
    RECLAIM_BORROWED = "reclaim_borrowed"  # the lender needs its guarantee back
    PRIORITY = "priority"  # a higher-priority job needs the capacity
    RESERVATION_RECLAIM = "reservation_reclaim"  # an inference service scales up into its reservation
    # A small job within its own tenant's guarantee restarts elsewhere so that a job within another tenant's
    # guarantee gets the whole node it needs (``Policy.relocate_for_guarantee``).
    RELOCATE = "relocate"
    # An aged gang takes its tenant's guarantee back from the tenant's own jobs that started after it was
    # submitted (``Policy.gang_aging_s``).
    NEWER_OWN = "newer_own"


# A node that does not state its CPU or host memory is not limited on that dimension.
UNLIMITED = 1 << 62


class PendingReason(StrEnum):
    """Why a job is still pending after a cycle; ``Explain.message`` says it in words."""

    AWAITING_APPROVAL = "awaiting_approval"
    INVALID_REQUEST = "invalid_request"
    # no registered node, or no limit up the quota tree, could ever give what it asks (``feasibility.py``)
    NEVER_FITS = "never_fits"
    NO_QUOTA = "no_quota"  # the tenant has no quota at all for the flavor
    QUOTA_EXHAUSTED = "quota_exhausted"  # guarantee used up and borrowing is not possible for this job
    QUOTA_LIMIT = "quota_limit"  # the tenant (or an ancestor) would go over its limit
    MAX_RUNNING_JOBS = "max_running_jobs"
    NO_LENDABLE_CAPACITY = "no_lendable_capacity"  # would borrow, but the cohort has nothing idle to lend
    NO_SUCH_FLAVOR = "no_such_flavor"  # no healthy schedulable device of any requested flavor
    NO_MATCHING_NODE = "no_matching_node"  # node selector matches no node with the flavor
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    INSUFFICIENT_HOST = "insufficient_host"  # cards are free, but not the CPU cores or host memory beside them
    TOPOLOGY = "topology"
    GANG = "gang"  # some replicas would fit, but not all at once
    WAITING_FOR_PREEMPTION = "waiting_for_preemption"  # victims were asked to stop; placed next cycle
    BLOCKED_BY_HEAD = "blocked_by_head"  # capacity is held for a job ahead in the queue
    CYCLE_LIMIT = "cycle_limit"  # not looked at this cycle (work cap)
    PORTS_EXHAUSTED = "ports_exhausted"  # placed, but its nodes have no free port left (set when binding)


@dataclass(frozen=True, slots=True)
class Device:
    uuid: str
    node: str
    index: int
    flavor: str
    memory_mib: int
    healthy: bool = True
    nvlink_domain: str | None = None  # cards sharing a value are NVLink-connected
    pcie_switch: str | None = None
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    devices: tuple[Device, ...]
    schedulable: bool = True  # False when not_ready, cordoned or draining
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    cpu_millicores: int | None = None  # allocatable host CPU; None: not limited (not stated)
    host_memory_mib: int | None = None  # allocatable host memory; None: not limited (not stated)


@dataclass(frozen=True, slots=True)
class Allocation:
    """One (job replica, device) that is running or starting. A job's allocations are preempted together."""

    job_id: str
    replica: int
    device_uuid: str
    node: str
    tenant: str
    flavor: str
    millis: int
    memory_mib: int
    priority: int
    preemptible: bool
    borrowed_millis: int = 0  # part of ``millis`` above the tenant's guarantee (reclaimable)
    started_at: float = 0.0
    last_checkpoint_at: float | None = None
    kind: JobKind = JobKind.TRAINING
    reservation_of: str | None = None  # runs on this inference service's idle reservation
    expected_end_at: float | None = None  # from max runtime or an estimate; helps backfill
    # Host resources of the replica, stated on one row of the replica (its first device), 0 on the others.
    cpu_millicores: int = 0
    host_memory_mib: int = 0
    preemptions: int = 0  # times this job was preempted before (protection grows with it, ``preempt.py``)

    @property
    def exclusive(self) -> bool:
        return self.millis >= MILLIS_PER_DEVICE


@dataclass(frozen=True, slots=True)
class Reservation:
    """Capacity an inference service holds for replicas it may scale up to (``max_replicas``) but does not run.

    Ordinary jobs cannot use it; preemptible training or batch jobs may run on it and are reclaimed
    (``PreemptReason.RESERVATION_RECLAIM``) when the service needs it.
    """

    job_id: str  # the inference service
    tenant: str
    node: str
    device_uuid: str
    flavor: str
    millis: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Hold:
    """Device ``device_uuid`` is kept for preemptor ``job_id`` while ``victims`` stop, and until it starts.

    A plan that preempts returns the devices its preemptor will get as holds (``Plan.holds``); the caller
    stores them and passes them back (``Snapshot.holds``) every cycle until the plan stops returning them.
    While held, no other job may be placed on the device, backfilled onto it or reserve it. The preemptor
    waits (``WAITING_FOR_PREEMPTION``) and searches for no new victims while any of ``victims`` still has an
    allocation; once they have all stopped it is placed (on the held devices or anywhere that fits), or — if
    it still does not fit, say its node failed — the hold is dropped and it is scheduled afresh.
    """

    job_id: str  # the preemptor
    device_uuid: str
    victims: tuple[str, ...] = ()  # jobs stopping to free capacity for it (sorted)
    since: float = 0.0  # when the preemption that made the hold was planned


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    parent: str | None = None
    fair_share_weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Quota:
    """Quota of one tenant for one flavor. Usage rolls up the tenant tree (a parent counts its subtree)."""

    tenant: str
    flavor: str
    guaranteed_millis: int = 0
    limit_millis: int | None = None  # max including borrowing; None = no limit beyond what can be borrowed
    lending_limit_millis: int | None = None  # how much idle guarantee others may borrow; None = all of it
    max_running_jobs: int | None = None  # None = no limit


QuotaNode = Quota  # the name used in the issue


@dataclass(frozen=True, slots=True)
class ReplicaRequest:
    """What one replica needs: a fraction of one card (100..990 millis + memory) or N whole cards (N*1000)."""

    flavors: tuple[str, ...]  # any of these, in order of preference
    millis: int = MILLIS_PER_DEVICE
    memory_mib: int = 0  # required for a fraction; for whole cards the minimum card memory (0 = any)
    cpu_millicores: int = 0  # host CPU beside the replica's cards, on the same node (0: none asked)
    host_memory_mib: int = 0  # host memory beside the replica's cards, on the same node (0: none asked)
    # The flavors are alternatives, not a preference (``"any_flavor": true`` in a job spec; a trace row naming
    # no model): with the fragmentation strategy the job goes to the flavor where it borrows the least, then
    # raises fragmentation the least, not the first it fits on.
    any_flavor: bool = False

    @property
    def fractional(self) -> bool:
        return self.millis < MILLIS_PER_DEVICE

    @property
    def device_count(self) -> int:
        return 1 if self.fractional else self.millis // MILLIS_PER_DEVICE

    @classmethod
    def cards(
        cls,
        count: int,
        flavors: tuple[str, ...] | str,
        memory_mib: int = 0,
        *,
        cpu_millicores: int = 0,
        host_memory_mib: int = 0,
    ) -> ReplicaRequest:
        return cls(
            flavors=_flavors(flavors),
            millis=count * MILLIS_PER_DEVICE,
            memory_mib=memory_mib,
            cpu_millicores=cpu_millicores,
            host_memory_mib=host_memory_mib,
        )

    @classmethod
    def fraction(
        cls,
        millis: int,
        memory_mib: int,
        flavors: tuple[str, ...] | str,
        *,
        cpu_millicores: int = 0,
        host_memory_mib: int = 0,
    ) -> ReplicaRequest:
        return cls(
            flavors=_flavors(flavors),
            millis=millis,
            memory_mib=memory_mib,
            cpu_millicores=cpu_millicores,
            host_memory_mib=host_memory_mib,
        )


def _flavors(flavors: tuple[str, ...] | str) -> tuple[str, ...]:
    return (flavors,) if isinstance(flavors, str) else tuple(flavors)


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: str
    tenant: str
    request: ReplicaRequest
    priority: int = PriorityClass.NORMAL
    preemptible: bool = True
    submitted_at: float = 0.0
    kind: JobKind = JobKind.TRAINING
    replicas: int = 1  # gang size: all replicas or none (for inference: the replicas wanted now)
    topology: Topology = Topology.NONE
    min_replicas: int | None = None  # inference: place at least this many (None = all ``replicas``)
    max_replicas: int | None = None  # inference: reserve capacity up to this many (None = no reservation)
    first_replica: int = 0  # replica index of the first pending replica (a running service scaling up)
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    preempted_by: frozenset[str] = frozenset()  # jobs that preempted this one; it never preempts them back
    awaiting_approval: bool = False
    runtime_estimate_s: float | None = None
    last_checkpoint_at: float | None = None
    preemptions: int = 0  # times this job was preempted before (it keeps the count when it runs again)
    last_preempted_at: float | None = None  # when it was last preempted (the decision); None: never

    @property
    def gang_min(self) -> int:
        return self.replicas if self.min_replicas is None else max(1, min(self.min_replicas, self.replicas))


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[Node, ...]
    allocations: tuple[Allocation, ...] = ()
    tenants: tuple[Tenant, ...] = ()  # tenants missing here but named elsewhere are roots
    quotas: tuple[Quota, ...] = ()
    # tenant -> flavor -> time-decayed average millis held, updated with what is held now (``decay_usage``);
    # fair share counts max(held now, this), never the sum, so current use is not counted twice.
    usage: Mapping[str, Mapping[str, float]] = field(default_factory=dict, hash=False)
    pending: tuple[PendingJob, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    holds: tuple[Hold, ...] = ()  # what the last plan returned as ``Plan.holds``


@dataclass(frozen=True, slots=True)
class Policy:
    preemption: bool = True
    borrowing: bool = True
    fair_share: bool = True
    backfill: bool = True  # False: once the head of a flavor's queue is blocked, nothing behind it starts there
    ordering: Ordering = Ordering.PRIORITY_FAIRSHARE
    energy_mode: bool = False  # pack onto busy nodes so idle nodes can sleep
    min_runtime_before_preempt_s: float = 300.0
    grace_period_s: float = 60.0
    usage_half_life_s: float = 3600.0  # for the caller's usage decay (``fairshare.decay_usage``)
    fractional_strategy: FractionalStrategy = FractionalStrategy.FRAGMENTATION
    seed: int = 0
    require_quota: bool = True  # False: a tenant with no quota row for a flavor is unlimited (guarantee 0)
    max_jobs_per_cycle: int | None = None  # work cap: jobs beyond it get CYCLE_LIMIT (None = all)
    max_preemption_searches: int = 64  # victim searches per cycle (each is the costly part)
    max_head_reservations: int = 8  # blocked queue heads that get capacity held for them
    # Churn: a job preempted k times is protected for min_runtime_before_preempt_s * 2**k from priority
    # preemption, and its restarts count in victim choice (``restart_cost_s`` of every card it holds is lost
    # on top of the work since its last checkpoint). Reclaim of borrowed capacity keeps the base minimum
    # runtime (the guarantee's bound), but prefers victims preempted fewer times.
    restart_cost_s: float = 60.0
    max_protection_doublings: int = 4
    # Reclaim churn: a job preempted k times may not borrow (start above its tenant's guarantee) until
    # ``borrow_backoff_s * 2**(k-1)`` after its last preemption (``PendingJob.last_preempted_at``); within its
    # tenant's guarantee it may start at once. None: off.
    borrow_backoff_s: float | None = 7200.0
    # A job preempted this many times that fits in its tenant's guarantee no longer borrows: it starts within
    # the guarantee (jobs larger than the guarantee keep the doubling back-off). None: off.
    borrow_preemption_limit: int | None = 3
    # A hard ceiling on churn: a job preempted this many times is not preempted again, neither by reclaim, by
    # priority, by relocation nor by an inference service taking back its reservation (such a job does not go
    # onto one). It may still borrow after the back-off above, and that loan is then firm, so it is made only
    # from guarantee its owners have left idle — above what they hold or their decayed use, plus what their
    # queued jobs ask, less the firm loans out (``QuotaBook.idle_guarantee``). None: no ceiling.
    max_preemptions_per_job: int | None = 3
    # Reclaim by usage: a job within its guarantee may reclaim *any* preemptible job of a quota node that holds
    # more than its guarantee (as far as that node's excess goes, counting victims already stopping), not
    # only the jobs flagged as borrowed when they started — which may sit on other nodes than the ones a gang
    # needs whole. False: only flagged borrowers.
    reclaim_by_usage: bool = True
    # Relocation: when reclaim alone frees no node for a job within its guarantee (each node it could empty
    # also holds a one-card job within another tenant's guarantee), such small jobs may be stopped too — at
    # most half of what the job needs there, and no more than the excess of borrowing tenants leaves for them
    # to reclaim at once. Needs ``reclaim_by_usage``. False: the job waits for those jobs to end.
    relocate_for_guarantee: bool = True
    # Gangs: a job of at least ``gang_aging_cards`` cards that has waited ``gang_aging_s`` is served first in
    # its priority class and gets capacity held for it even when it is not the head of its flavor's queue.
    gang_aging_cards: int = 16
    gang_aging_s: float | None = 3600.0


@dataclass(frozen=True, slots=True)
class Assignment:
    replica: int
    node: str
    device_uuid: str
    millis: int
    memory_mib: int
    reservation_of: str | None = None  # placed on this inference service's idle reservation
    cpu_millicores: int = 0  # the replica's host CPU, on its first device's row (0 on the others)
    host_memory_mib: int = 0


def at_preemption_ceiling(preemptions: int, ceiling: int | None) -> bool:
    """A job (or allocation) preempted ``ceiling`` times is not preempted again (``Policy.max_preemptions_per_job``;
    None: no ceiling)."""
    return ceiling is not None and preemptions >= ceiling


@dataclass(frozen=True, slots=True)
class Place:
    job_id: str
    tenant: str
    flavor: str
    assignments: tuple[Assignment, ...]
    borrowed_millis: int = 0  # part of the job's millis above the tenant's guarantee
    reserved: tuple[Assignment, ...] = ()  # inference: capacity held for idle replicas up to max_replicas

    @property
    def replicas(self) -> int:
        return len({a.replica for a in self.assignments})

    def allocations(
        self,
        *,
        priority: int,
        preemptible: bool,
        started_at: float,
        last_checkpoint_at: float | None,
        expected_end_at: float | None,
        kind: JobKind = JobKind.TRAINING,
        preemptions: int = 0,
    ) -> list[Allocation]:
        """The running rows this placement becomes once the job starts (for a caller that steps the engine
        forward: the forecast, the simulator). ``borrowed_millis`` goes onto the first assignments in order."""
        rows = []
        borrowed_left = self.borrowed_millis
        for a in self.assignments:
            borrowed = min(borrowed_left, a.millis)
            borrowed_left -= borrowed
            rows.append(
                Allocation(
                    job_id=self.job_id,
                    replica=a.replica,
                    device_uuid=a.device_uuid,
                    node=a.node,
                    tenant=self.tenant,
                    flavor=self.flavor,
                    millis=a.millis,
                    memory_mib=a.memory_mib,
                    priority=priority,
                    preemptible=preemptible,
                    borrowed_millis=borrowed,
                    started_at=started_at,
                    last_checkpoint_at=last_checkpoint_at,
                    expected_end_at=expected_end_at,
                    kind=kind,
                    reservation_of=a.reservation_of,
                    cpu_millicores=a.cpu_millicores,
                    host_memory_mib=a.host_memory_mib,
                    preemptions=preemptions,
                )
            )
        return rows


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: str  # the victim
    victim_of: str  # the job that needs the capacity
    reason: PreemptReason
    grace_s: float
    tenant: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Explain:
    job_id: str
    code: PendingReason
    message: str  # plain English for the job's owner
    position_in_tenant: int  # 1-based place among the tenant's pending jobs
    position_overall: int  # 1-based place among all pending jobs
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    places: tuple[Place, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    explanations: tuple[Explain, ...] = ()
    # Every hold to keep until the next cycle (new ones and those still waited for); store and pass back.
    holds: tuple[Hold, ...] = ()
    stats: Mapping[str, float] = field(default_factory=dict, hash=False)
