"""``plan(snapshot, policy)``: one scheduling cycle, as a pipeline of named steps.

1. **order** (``order.py``) — priority class, fair share, submit time; lazily, so shares move as jobs start.
2. **admit** (``quota.py``) — guarantee, borrowing from the cohort, limits, max running jobs.
3. **filter → score → gang** (``placement.py``) — devices for all replicas or none.
4. **reservations** (``reservations.py``) — a service's own reservation first; training on idle ones.
5. **preempt** (``preempt.py``) — the cheapest victim set when an admitted job does not fit.
6. **backfill** (``backfill.py``) — hold capacity for a blocked head; later jobs only use the holes.
7. **explain** (``explain.py``) — a reason code, a sentence and queue positions for every pending job.

The cycle only ever *takes* capacity (places, holds), never frees it — preempted work frees its devices
when it stops, and the preemptor starts in a later cycle on the devices held for it (``holds.py``: the
plan returns its holds and the caller passes them back until the preemptor has started). So a shape of job that
did not fit once will not fit later in the same cycle, which lets the cycle skip repeated attempts
(``Plan.stats["skipped_repeat_shapes"]``) and keeps a 10,000-job queue cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

from .backfill import HeadReservations
from .capacity import Cluster
from .explain import Pending, explanations
from .fragment import Fragmentation
from .holds import Holds
from .order import FairShare, ordered
from .placement import Failure, Placer, Take, rollback
from .preempt import Preemptor, VictimChoice
from .quota import Admission, QuotaBook, cards
from .reservations import Reservations
from .types import (
    FRACTION_STEP_MILLIS,
    MILLIS_PER_DEVICE,
    MIN_FRACTION_MILLIS,
    Assignment,
    FractionalStrategy,
    JobKind,
    PendingJob,
    PendingReason,
    Place,
    Plan,
    Policy,
    Preempt,
    PreemptReason,
    Snapshot,
    Topology,
)

# Pending reasons for which holding capacity for the job makes sense (it is waiting for devices).
_CAPACITY_REASONS = frozenset(
    {
        PendingReason.INSUFFICIENT_CAPACITY,
        PendingReason.INSUFFICIENT_MEMORY,
        PendingReason.INSUFFICIENT_HOST,
        PendingReason.TOPOLOGY,
        PendingReason.GANG,
    }
)


# Refusals by the job's own quota, which stopping the tenant's lower-priority work can lift.
_QUOTA_REASONS = frozenset({PendingReason.QUOTA_LIMIT, PendingReason.QUOTA_EXHAUSTED, PendingReason.MAX_RUNNING_JOBS})


def validate(job: PendingJob) -> str | None:
    """A problem with the request that no amount of waiting fixes, in words; None when it is fine."""
    req = job.request
    if not req.flavors:
        return "the job names no device flavor"
    if job.replicas < 1:
        return "the job asks for no replicas"
    if req.millis < MIN_FRACTION_MILLIS:
        return f"a replica must ask for at least {MIN_FRACTION_MILLIS} millis (1/10 of a card)"
    if req.fractional:
        if req.millis % FRACTION_STEP_MILLIS:
            return f"a fraction of a card must be a multiple of {FRACTION_STEP_MILLIS} millis"
        if req.memory_mib <= 0:
            return "a fractional request must state memory_mib"
    elif req.millis % MILLIS_PER_DEVICE:
        return "more than one card must be a whole number of cards (a multiple of 1000 millis)"
    if req.memory_mib < 0:
        return "memory_mib cannot be negative"
    if req.cpu_millicores < 0 or req.host_memory_mib < 0:
        return "host CPU and host memory cannot be negative"
    return None


@dataclass(slots=True)
class _Attempt:
    flavor: str
    admission: Admission
    failure: Failure
    count: int


class _Cycle:
    def __init__(self, snapshot: Snapshot, policy: Policy) -> None:
        self.s = snapshot
        self.p = policy
        self.cluster = Cluster(snapshot)
        # Before anything else looks at free capacity: devices held for preemptors are nobody else's.
        self.holds = Holds(snapshot, self.cluster)
        self.book = QuotaBook(snapshot, self.cluster.capacity_millis, require_quota=policy.require_quota)
        self.fair = FairShare(snapshot, self.cluster.capacity_millis)
        frag = (
            Fragmentation(self.cluster, snapshot)
            if policy.fractional_strategy == FractionalStrategy.FRAGMENTATION
            else None
        )
        self.placer = Placer(
            self.cluster,
            strategy=policy.fractional_strategy,
            energy_mode=policy.energy_mode,
            seed=policy.seed,
            fragmentation=frag,
        )
        self.preemptor = (
            Preemptor(
                snapshot=snapshot,
                cluster=self.cluster,
                placer=self.placer,
                book=self.book,
                min_runtime_s=policy.min_runtime_before_preempt_s,
                stopping=self.holds.stopping,
                restart_cost_s=policy.restart_cost_s,
                max_doublings=policy.max_protection_doublings,
            )
            if policy.preemption
            else None
        )
        self.heads = HeadReservations(snapshot, self.cluster, self.placer, max_heads=policy.max_head_reservations)
        self.reservations = Reservations(snapshot, self.cluster)
        self.places: list[Place] = []
        self.preemptions: list[Preempt] = []
        self.pending: list[Pending] = []
        self.failed_shapes: dict[tuple, Failure] = {}
        self.failed_searches: set[tuple] = set()
        self.searches = 0
        self.stats = {
            "skipped_repeat_shapes": 0,
            "preemption_searches": 0,
            "head_reservations": 0,
            "backfilled_into_held": 0,
            "holds_kept": 0,
        }

    # -- the loop --------------------------------------------------------------------------------------------

    def run(self) -> Plan:
        cap = self.p.max_jobs_per_cycle
        for i, job in enumerate(ordered(self.s, self.p, self.fair, self._within)):
            if cap is not None and i >= cap:
                self._wait(job, PendingReason.CYCLE_LIMIT, f"not looked at this cycle (at most {cap} jobs a cycle)")
                continue
            self._schedule(job)
        self.stats["placed"] = len(self.places)
        self.stats["preempted"] = len(self.preemptions)
        self.stats["pending"] = len(self.pending)
        self.stats["idle_nodes"] = sum(1 for n in range(len(self.cluster.node_name)) if self.cluster.node_busy[n] == 0)
        return Plan(
            places=tuple(self.places),
            preemptions=tuple(self.preemptions),
            explanations=explanations(self.pending),
            holds=self.holds.result(),
            stats=dict(self.stats),
        )

    def _within(self, job: PendingJob) -> bool:
        """The job fits in its tenant's unused guarantee on one of its flavors (it would borrow nothing)."""
        millis = job.request.millis * job.gang_min
        for flavor in job.request.flavors:
            node = self.book.account(job.tenant, flavor)
            if node is not None and self.book.usage(node, flavor) + millis <= self.book.guaranteed(node, flavor):
                return True
        return False

    def _wait(self, job: PendingJob, code: PendingReason, message: str) -> None:
        self.pending.append(Pending(job, code, message))

    def _schedule(self, job: PendingJob) -> None:
        held = self.holds.take(job.job_id)
        problem = validate(job)
        if problem:
            self._wait(job, PendingReason.INVALID_REQUEST, f"the request cannot be scheduled: {problem}")
            return
        if job.awaiting_approval:
            self._wait(job, PendingReason.AWAITING_APPROVAL, "waiting for approval by an administrator")
            return
        waiting = self.holds.waiting_for(held)
        if self._own_reservation(job, waiting):
            return
        attempts: list[_Attempt] = []
        refusals: list[Failure] = []
        for flavor in job.request.flavors:
            outcome = self._try_flavor(job, flavor, holder=bool(held))
            if outcome is None:
                return  # placed
            if isinstance(outcome, _Attempt):
                attempts.append(outcome)
            else:
                refusals.append(outcome)
        if waiting:
            self._keep_waiting(job, held, waiting)
            return
        for attempt in attempts:
            if attempt.failure.code in _CAPACITY_REASONS and self._on_reservation(job, attempt):
                return
        for attempt in attempts:
            if attempt.failure.code in _CAPACITY_REASONS and self._backfill_held(job, attempt):
                return
        for attempt in attempts:
            if attempt.failure.code in _CAPACITY_REASONS and self._preempt_for(job, attempt):
                return
        if attempts:
            first = attempts[0]
            message = first.failure.message
            if first.failure.code in _CAPACITY_REASONS:
                held = self.heads.reserve(job, first.flavor, first.count)
                if held is not None:
                    self.stats["head_reservations"] += 1
                    message += f"; {len(held[0])} {first.flavor} device(s) are held for it as the head of the queue"
            self._wait(job, first.failure.code, message)
            return
        # A flavor the pool lacks says less than a quota refusal on another one.
        first = next((r for r in refusals if r.code != PendingReason.NO_SUCH_FLAVOR), refusals[0])
        if any(r.code in _QUOTA_REASONS for r in refusals) and self._preempt_for_quota(job):
            return
        self._wait(job, first.code, first.message)

    # -- one flavor: admit, place ----------------------------------------------------------------------------

    def _try_flavor(self, job: PendingJob, flavor: str, *, holder: bool = False) -> _Attempt | Failure | None:
        """Admit and place on ``flavor``; None when placed. A ``holder`` (a preemptor with devices held for it)
        sees capacity no other job sees, so shape failures of others say nothing about it and vice versa."""
        req = job.request
        if not self.cluster.has_flavor(flavor):
            return Failure(PendingReason.NO_SUCH_FLAVOR, f"no healthy, schedulable {flavor} device in the pool")
        count = job.gang_min
        admission = self.book.admit(
            tenant=job.tenant,
            flavor=flavor,
            millis=req.millis * count,
            preemptible=job.preemptible,
            borrowing=self.p.borrowing,
        )
        if not admission.ok:
            return Failure(admission.code or PendingReason.QUOTA_EXHAUSTED, admission.message)
        head = self.heads.head(flavor)
        if head is not None and not self.p.backfill and not holder:
            return Failure(
                PendingReason.BLOCKED_BY_HEAD,
                f"waiting behind job {head}, which is first in the {flavor} queue (backfill is off)",
            )
        shape = (
            flavor,
            req.millis,
            req.memory_mib,
            req.cpu_millicores,
            req.host_memory_mib,
            count,
            job.topology,
            tuple(sorted(job.node_selector.items())),
        )
        failure = None if holder else self.failed_shapes.get(shape)
        if failure is not None:
            self.stats["skipped_repeat_shapes"] += 1
            return _Attempt(flavor, admission, failure, count)
        log: list[Take] = []
        failure = self.placer.place(
            flavor=flavor,
            millis=req.millis,
            memory_mib=req.memory_mib,
            count=count,
            first_replica=job.first_replica,
            topology=job.topology,
            selector=job.node_selector,
            log=log,
            cpu_millicores=req.cpu_millicores,
            host_memory_mib=req.host_memory_mib,
        )
        if failure is not None:
            if not holder:
                self.failed_shapes[shape] = failure
            return _Attempt(flavor, admission, failure, count)
        self._commit_place(job, flavor, admission, log)
        return None

    def _keep_waiting(self, job: PendingJob, held: list, waiting: tuple[str, ...]) -> None:
        """A preemptor whose victims are still stopping: its devices stay held, it preempts nobody new."""
        self.holds.keep(job.job_id, held, waiting)
        self.stats["holds_kept"] += 1
        req = job.request
        flavor = self.cluster.dev_flavor[held[0][0]]
        node = self.book.account(job.tenant, flavor)
        if node is not None:  # as when it preempted: jobs behind it cannot spend its quota meanwhile
            self.book.charge(node=node, flavor=flavor, millis=req.millis * job.gang_min)
        self._wait(
            job,
            PendingReason.WAITING_FOR_PREEMPTION,
            f"waiting for {len(waiting)} preempted job(s) to stop; {len({d for d, _ in held})} {flavor} "
            "device(s) are held for it meanwhile",
        )

    def _commit_place(self, job: PendingJob, flavor: str, admission: Admission, log: list[Take]) -> None:
        req = job.request
        node = admission.accounted_to
        assert node is not None
        placed_millis = req.millis * job.gang_min
        self.book.charge(node=node, flavor=flavor, millis=placed_millis)
        borrowed = admission.borrowed_millis
        # Inference: more replicas than the minimum when they fit and quota allows, one by one.
        for i in range(job.gang_min, job.replicas):
            extra = self.book.admit(
                tenant=job.tenant,
                flavor=flavor,
                millis=req.millis,
                preemptible=job.preemptible,
                borrowing=self.p.borrowing,
                new_job=False,
            )
            if not extra.ok:
                break
            replica_log: list[Take] = []
            if job.topology == Topology.SAME_NODE and log:
                # The extra replica joins the others on their node (a lone replica is no same-node gang).
                if not self.placer.place_replica(
                    flavor,
                    req.millis,
                    req.memory_mib,
                    job.first_replica + i,
                    Topology.NONE,
                    {},
                    replica_log,
                    self.cluster.dev_node[log[0][1]],
                    (req.cpu_millicores, req.host_memory_mib),
                ):
                    break
            elif self.placer.place(
                flavor=flavor,
                millis=req.millis,
                memory_mib=req.memory_mib,
                count=1,
                first_replica=job.first_replica + i,
                topology=job.topology,
                selector=job.node_selector,
                log=replica_log,
                cpu_millicores=req.cpu_millicores,
                host_memory_mib=req.host_memory_mib,
            ):
                break
            self.book.charge(node=node, flavor=flavor, millis=req.millis, jobs=0)
            borrowed += extra.borrowed_millis
            placed_millis += req.millis
            log.extend(replica_log)
        assignments = tuple(self._assignment(r, d, m, mem, cpu=cpu, host_mem=hm) for r, d, m, mem, cpu, hm in log)
        reserved = self._reserve_idle_replicas(job, flavor, node, len({a.replica for a in assignments}))
        self.fair.add(job.tenant, flavor, placed_millis)
        self.places.append(Place(job.job_id, job.tenant, flavor, assignments, borrowed, reserved))

    def _assignment(
        self,
        replica: int,
        d: int,
        millis: int,
        memory_mib: int,
        of: str | None = None,
        *,
        cpu: int = 0,
        host_mem: int = 0,
    ) -> Assignment:
        c = self.cluster
        return Assignment(replica, c.node_name[c.dev_node[d]], c.dev_uuid[d], millis, memory_mib, of, cpu, host_mem)

    def _reserve_idle_replicas(self, job: PendingJob, flavor: str, node: str, placed: int) -> tuple[Assignment, ...]:
        """Inference: hold capacity for replicas up to ``max_replicas`` (charged to the tenant's quota)."""
        if job.kind != JobKind.INFERENCE or job.max_replicas is None:
            return ()
        req = job.request
        per = 1 if req.fractional else req.device_count
        want = job.max_replicas - job.first_replica - placed - self.reservations.count(job.job_id, per)
        out: list[Assignment] = []
        for i in range(max(0, want)):
            if not self.book.admit(
                tenant=job.tenant, flavor=flavor, millis=req.millis, preemptible=False, borrowing=False, new_job=False
            ).ok:
                break
            log: list[Take] = []
            replica = job.first_replica + placed + i
            if self.placer.place(
                flavor=flavor,
                millis=req.millis,
                memory_mib=req.memory_mib,
                count=1,
                first_replica=replica,
                topology=job.topology,
                selector=job.node_selector,
                log=log,
                cpu_millicores=req.cpu_millicores,
                host_memory_mib=req.host_memory_mib,
            ):
                break
            self.book.charge(node=node, flavor=flavor, millis=req.millis, jobs=0)
            out.extend(self._assignment(r, d, m, mem, cpu=cpu, host_mem=hm) for r, d, m, mem, cpu, hm in log)
        return tuple(out)

    # -- reservations ----------------------------------------------------------------------------------------

    def _own_reservation(self, job: PendingJob, waiting: tuple[str, ...] = ()) -> bool:
        """An inference service scaling up goes onto its own reservation first (no new quota: it is charged).
        Borrowers in the way are preempted once; while they stop (``waiting``) the service waits for them."""
        if job.job_id not in self.reservations.slots:
            return False
        for flavor in job.request.flavors:
            assigned, blockers = self.reservations.place(
                job=job, flavor=flavor, count=job.replicas, first_replica=job.first_replica, service=job.job_id
            )
            if assigned:
                self.places.append(Place(job.job_id, job.tenant, flavor, tuple(assigned), 0, ()))
                return True
            if blockers:
                # Reclaiming a reservation needs no preemption policy: the borrowers ran there on loan.
                taken = self.preemptor.taken if self.preemptor else set()
                known = self.preemptor.victims if self.preemptor else {}
                for victim in [b for b in blockers if b not in taken and b not in waiting]:
                    taken.add(victim)
                    tenant = known[victim].tenant if victim in known else ""
                    self.preemptions.append(
                        Preempt(
                            job_id=victim,
                            victim_of=job.job_id,
                            reason=PreemptReason.RESERVATION_RECLAIM,
                            grace_s=self.p.grace_period_s,
                            tenant=tenant,
                            message=f"inference service {job.job_id} scales up into its reserved capacity",
                        )
                    )
                slots = self.reservations.slots[job.job_id]
                self.holds.add(job.job_id, (s.d for s in slots if set(s.borrowers) & set(blockers)), blockers)
                self._wait(
                    job,
                    PendingReason.WAITING_FOR_PREEMPTION,
                    f"scaling up into its reservation; waiting for {len(blockers)} job(s) running on it to stop",
                )
                return True
        return False

    def _on_reservation(self, job: PendingJob, attempt: _Attempt) -> bool:
        """A preemptible training/batch job that fits nowhere may run on an idle inference reservation."""
        for service in self.reservations.services():
            assigned, _ = self.reservations.place(
                job=job, flavor=attempt.flavor, count=attempt.count, first_replica=job.first_replica, service=service
            )
            if assigned:
                node = attempt.admission.accounted_to
                assert node is not None
                millis = job.request.millis * attempt.count
                self.book.charge(node=node, flavor=attempt.flavor, millis=millis)
                self.fair.add(job.tenant, attempt.flavor, millis)
                self.places.append(
                    Place(job.job_id, job.tenant, attempt.flavor, tuple(assigned), attempt.admission.borrowed_millis)
                )
                return True
        return False

    # -- backfill onto a head's held devices ----------------------------------------------------------------

    def _backfill_held(self, job: PendingJob, attempt: _Attempt) -> bool:
        head = self.heads.head(attempt.flavor)
        devices = self.heads.window(attempt.flavor, job)
        if head is None or not devices:
            return False
        req = job.request
        shape = ("backfill", head, attempt.flavor, req.millis, req.memory_mib, attempt.count, job.topology)
        shape += (req.cpu_millicores, req.host_memory_mib)
        shape += (tuple(sorted(job.node_selector.items())),)
        if shape in self.failed_shapes:
            return False
        for d in devices:
            self.cluster.release(d)
        log: list[Take] = []
        failure = self.placer.place(
            flavor=attempt.flavor,
            millis=req.millis,
            memory_mib=req.memory_mib,
            count=attempt.count,
            first_replica=job.first_replica,
            topology=job.topology,
            selector=job.node_selector,
            log=log,
            cpu_millicores=req.cpu_millicores,
            host_memory_mib=req.host_memory_mib,
        )
        for d in devices:
            self.cluster.hold(d, head)
        if failure is not None:
            self.failed_shapes[shape] = failure
            return False
        self.stats["backfilled_into_held"] += 1
        self._commit_place(job, attempt.flavor, attempt.admission, log)
        return True

    # -- preemption ------------------------------------------------------------------------------------------

    def _preempt_for_quota(self, job: PendingJob) -> bool:
        if self.preemptor is None or self.searches >= self.p.max_preemption_searches:
            return False
        req = job.request
        count = job.gang_min
        for flavor in job.request.flavors:
            node = self.book.account(job.tenant, flavor)
            if node is None or not self.cluster.has_flavor(flavor):
                continue
            key = ("quota", flavor, node, int(job.priority), req.millis * count, job.preempted_by)
            if key in self.failed_searches:
                continue

            def admitted(flavor: str = flavor) -> bool:
                return self.book.admit(
                    tenant=job.tenant,
                    flavor=flavor,
                    millis=req.millis * count,
                    preemptible=job.preemptible,
                    borrowing=self.p.borrowing,
                ).ok

            before = self.preemptor.quota_searches
            choice = self.preemptor.search_quota(
                job=job, flavor=flavor, count=count, accounted_to=node, admitted=admitted
            )
            if self.preemptor.quota_searches > before:  # there were candidates: it counts as a search
                self.searches += 1
                self.stats["preemption_searches"] += 1
            if choice is None:
                self.failed_searches.add(key)
            else:
                self._commit_preemption(job, flavor, node, count, choice)
                return True
        return False

    def _preempt_for(self, job: PendingJob, attempt: _Attempt) -> bool:
        borrowing = attempt.admission.borrowed_millis > 0
        # A job within its tenant's guarantee reclaims whatever the cap says: the guarantee is a promise, and
        # a search cap must not leave the lender waiting while others borrow (its searches still count).
        if self.preemptor is None or (borrowing and self.searches >= self.p.max_preemption_searches):
            return False
        node = attempt.admission.accounted_to
        assert node is not None
        req = job.request
        key = (
            attempt.flavor,
            req.millis,
            req.memory_mib,
            req.cpu_millicores,
            req.host_memory_mib,
            attempt.count,
            job.topology,
            tuple(sorted(job.node_selector.items())),
            int(job.priority),
            node,
            borrowing,
            job.preempted_by,
        )
        if key in self.failed_searches:
            return False
        self.searches += 1
        self.stats["preemption_searches"] += 1
        choice = self.preemptor.search(
            job=job, flavor=attempt.flavor, count=attempt.count, accounted_to=node, borrowing=borrowing
        )
        if choice is None:
            self.failed_searches.add(key)
            return False
        self._commit_preemption(job, attempt.flavor, node, attempt.count, choice)
        return True

    def _commit_preemption(self, job: PendingJob, flavor: str, node: str, count: int, choice: VictimChoice) -> None:
        assert self.preemptor is not None
        req = job.request
        self.preemptor.commit(choice)
        for d in choice.devices:
            self.cluster.hold(d, job.job_id)
        self.holds.add(job.job_id, choice.devices, (v.job_id for v, _ in choice.victims))
        # The preemptor's quota is taken now so that jobs behind it cannot spend it while victims stop.
        self.book.charge(node=node, flavor=flavor, millis=req.millis * count)
        for victim, reason in choice.victims:
            why = (
                f"its tenant {victim.tenant} borrowed capacity that {job.tenant} needs back"
                if reason == PreemptReason.RECLAIM_BORROWED
                else f"higher-priority job {job.job_id} (priority {int(job.priority)}) needs the capacity"
            )
            self.preemptions.append(
                Preempt(
                    job_id=victim.job_id,
                    victim_of=job.job_id,
                    reason=reason,
                    grace_s=self.p.grace_period_s,
                    tenant=victim.tenant,
                    message=why,
                )
            )
        self._wait(
            job,
            PendingReason.WAITING_FOR_PREEMPTION,
            f"waiting for {len(choice.victims)} job(s) to stop and free {cards(req.millis * count)} "
            f"{flavor} card(s) for it; it starts in a following cycle",
        )


def plan(snapshot: Snapshot, policy: Policy | None = None) -> Plan:
    """One scheduling cycle: pure and deterministic (same snapshot and policy → same plan)."""
    return _Cycle(snapshot, policy or Policy()).run()


__all__ = ["plan", "rollback", "validate"]
