"""``plan(snapshot, policy)``: one scheduling cycle — the DESIGN's six steps (``docs/scheduler.md``).

1. **order** (``order.py``) — priority class, fair share, submit time; lazily, so shares move as jobs start.
2. **admit** (``quota.py``) — a valid, approved request; guarantee, borrowing from the cohort, limits, max
   running jobs.
3. **place** (``placement.py``: filter → score → gang; ``reservations.py``) — devices for all replicas or
   none; an inference service's own reservation first, preemptible training on idle reservations.
4. **preempt** (``preempt.py``, ``holds.py``) — the cheapest victim set when an admitted job does not fit (or
   its own quota refuses it); the freed devices are held for it across cycles.
5. **backfill** (``backfill.py``) — hold capacity for a blocked head; later jobs only use the holes.
6. **explain** (``explain.py``) — a reason code, a sentence and queue positions for every pending job.

Each job goes through ``_Cycle._schedule`` in one straight line, like kube-scheduler's ``scheduleOne``:
admit → place (one placement helper, ``Placer.place_job``) → bind; a job that fits nowhere takes the one
failure path (``_unschedulable``, PostFilter), which carries one ``_Diagnosis`` to the reason it waits with.

The cycle only ever *takes* capacity (places, holds), never frees it — preempted work frees its devices
when it stops, and the preemptor starts in a later cycle on the devices held for it (``holds.py``: the
plan returns its holds and the caller passes them back until the preemptor has started). So a shape of job that
did not fit once will not fit later in the same cycle, which lets the cycle skip repeated attempts
(``Plan.stats["skipped_repeat_shapes"]``) and keeps a 10,000-job queue cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scheduler.core import sentences
from scheduler.core.sentences import clauses, say

from .backfill import HeadReservations
from .capacity import Cluster
from .explain import Pending, explanations
from .feasibility import split_never_fits, with_never_fits
from .fragment import Fragmentation
from .holds import Holds
from .order import FairShare, aged_gang, job_key, ordered
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
    Hold,
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
    at_preemption_ceiling,
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


def _minutes(seconds: float) -> int:
    return max(1, -int(-seconds // 60))


def validate(job: PendingJob) -> str | None:
    """A problem with the request that no amount of waiting fixes, in words; None when it is fine."""
    req = job.request
    if not req.flavors:
        return sentences.JOB_NAMES_NO_DEVICE
    if job.replicas < 1:
        return sentences.JOB_ASKS_NO_REPLICAS
    if req.millis < MIN_FRACTION_MILLIS:
        return say(sentences.REPLICA_MUST_ASK_LEAST, min=MIN_FRACTION_MILLIS)
    if req.fractional:
        if req.millis % FRACTION_STEP_MILLIS:
            return say(sentences.FRACTION_CARD_MUST_MULTIPLE, step=FRACTION_STEP_MILLIS)
        if req.memory_mib <= 0:
            return sentences.FRACTIONAL_REQUEST_MUST_STATE
    elif req.millis % MILLIS_PER_DEVICE:
        return f"more than one card must be a whole number of cards (a multiple of {MILLIS_PER_DEVICE} millis)"
    if req.memory_mib < 0:
        return sentences.MEMORY_MIB_CANNOT_NEGATIVE
    if req.cpu_millicores < 0 or req.host_memory_mib < 0:
        return sentences.HOST_CPU_HOST_MEMORY
    return None


@dataclass(slots=True)
class _Fit:
    """Devices found for a job's gang on one flavor (already taken in the cluster, undo list in ``log``)."""

    flavor: str
    admission: Admission
    log: list[Take]


@dataclass(slots=True)
class _Attempt:
    """A flavor on which the job was admitted but its gang did not fit."""

    flavor: str
    admission: Admission
    failure: Failure
    count: int


@dataclass(slots=True)
class _Diagnosis:
    """Why a job fits on none of its flavors, one entry per flavor (kube-scheduler's ``Diagnosis``)."""

    unfit: list[_Attempt] = field(default_factory=list)  # admitted, no devices: what steps 3-5 may change
    refused: list[Failure] = field(default_factory=list)  # not admitted (quota, unknown flavor, blocked by head)

    def capacity(self) -> list[_Attempt]:
        """The attempts that failed for want of devices: those an idle reservation, backfill or preemption helps."""
        return [a for a in self.unfit if a.failure.code in _CAPACITY_REASONS]

    def quota_refused(self) -> bool:
        return any(r.code in _QUOTA_REASONS for r in self.refused)

    def reason(self) -> Failure:
        """The one reason the job waits with: its first flavor's placement failure, else its first refusal —
        where a flavor the pool lacks says less than a quota refusal on another one."""
        if self.unfit:
            return self.unfit[0].failure
        return next((r for r in self.refused if r.code != PendingReason.NO_SUCH_FLAVOR), self.refused[0])


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
                reclaim_by_usage=policy.reclaim_by_usage,
                relocate=policy.relocate_for_guarantee,
                max_preemptions=policy.max_preemptions_per_job,
            )
            if policy.preemption
            else None
        )
        self.heads = HeadReservations(snapshot, self.cluster, self.placer, max_heads=policy.max_head_reservations)
        self.reservations = Reservations(snapshot, self.cluster)
        self.places: list[Place] = []
        self._firm_out: dict[str, int] = {}  # per flavor: millis lent firmly (``_firm_loan``) before this cycle
        self._firm_jobs: set[str] = set()  # jobs admitted on a firm loan this cycle
        self.preemptions: list[Preempt] = []
        self.pending: list[Pending] = []
        self.failed_shapes: dict[tuple, Failure] = {}
        self.failed_searches: set[tuple] = set()
        self.by_submit = sorted(snapshot.pending, key=job_key)  # for the order and the guarantees' claims
        # Per queued job within its tenant's guarantee: (quota node, flavor, millis) of the guarantee owed to it.
        self.claims: dict[str, tuple[str, str, int]] = self._claim_guarantees() if policy.borrowing else {}
        self.searches = 0
        self.stats = {
            "skipped_repeat_shapes": 0,
            "preemption_searches": 0,
            "head_reservations": 0,
            "backfilled_into_held": 0,
            "holds_kept": 0,
        }

    # -- the loop (step 1 orders, step 6 explains what is left) ----------------------------------------------

    def run(self) -> Plan:
        cap = self.p.max_jobs_per_cycle
        queue = ordered(self.s, self.p, self.fair, self._within, by_submit=self.by_submit, version=self.book.version)
        for i, job in enumerate(queue):
            if cap is not None and i >= cap:
                self._wait(job, PendingReason.CYCLE_LIMIT, say(sentences.NOT_LOOKED_CYCLE_MOST, cap=cap))
                continue
            self._schedule_claimed(job)
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

    # -- guarantee owed to queued jobs -----------------------------------------------------------------------

    def _claim_guarantees(self) -> dict[str, tuple[str, str, int]]:
        """Each tenant's unused guarantee handed out over its queued jobs in its queue order (priority, submit
        time): a job that fits in what is left claims its size on the first of its flavors it fits on
        (``QuotaBook.claim``). Claimed guarantee is not lent to borrowers served before the claimant this cycle
        (a borrower of a higher priority class): the room a reclaim frees for a lender, or its idle guarantee,
        stays its own instead of going to fresh work that it would then wait a minimum runtime to reclaim."""
        claims: dict[str, tuple[str, str, int]] = {}
        # Priority first, then ``job_key`` (a stable sort of the jobs already in that order).
        queue = sorted(self.by_submit, key=lambda j: -int(j.priority))
        for job in queue:
            if job.awaiting_approval or validate(job) is not None:
                continue
            millis = job.request.millis * job.gang_min
            for flavor in job.request.flavors:
                node = self.book.account(job.tenant, flavor)
                if node is not None and millis <= self.book.unclaimed_guarantee(node, flavor):
                    self.book.claim(node=node, flavor=flavor, millis=millis)
                    claims[job.job_id] = (node, flavor, millis)
                    break
        return claims

    def _schedule_claimed(self, job: PendingJob) -> None:
        """``_schedule`` with the job's own claim released while it is decided (it is admitted on its own
        guarantee, not against itself); a job that is still waiting and charged nothing claims again what its
        guarantee has left for it, for the jobs behind it."""
        claim = self.claims.pop(job.job_id, None)
        if claim is None:
            self._schedule(job)
            return
        node, flavor, millis = claim
        self.book.claim(node=node, flavor=flavor, millis=-millis)
        waiting = len(self.pending)
        self._schedule(job)
        charged = len(self.pending) == waiting or self.pending[-1].code == PendingReason.WAITING_FOR_PREEMPTION
        if not charged and millis <= self.book.unclaimed_guarantee(node, flavor):
            self.book.claim(node=node, flavor=flavor, millis=millis)
            self.claims[job.job_id] = claim

    # -- one job, one straight line --------------------------------------------------------------------------

    def _schedule(self, job: PendingJob) -> None:
        """One job's way through the cycle (kube-scheduler's ``scheduleOne``); it ends placed, preempting or
        waiting — each exactly once:

        - step 2, gate: a request that can never run, or waits for approval, waits with that reason;
        - step 3, an inference service scaling up goes onto its own reservation first;
        - steps 2 → 3 on each of the job's flavors in turn: admit, then filter → score → gang; the first flavor
          it fits on binds it;
        - otherwise the one failure path, ``_unschedulable``, with the ``_Diagnosis`` of every flavor.
        """
        held = self.holds.take(job.job_id)  # devices an earlier preemption freed for it, if any
        refusal = self._gate(job)
        if refusal is not None:
            self._wait(job, refusal.code, refusal.message)
            return
        waiting = self.holds.waiting_for(held)
        if self._own_reservation(job, waiting):
            return
        fit, diagnosis = self._find_fit(job, holder=bool(held))
        if fit is not None:
            self._bind(job, fit)
            return
        self._unschedulable(job, diagnosis, held, waiting)

    def _gate(self, job: PendingJob) -> Failure | None:
        """Step 2, before any quota: the request is one that can be scheduled, and nobody has to approve it."""
        problem = validate(job)
        if problem:
            return Failure(PendingReason.INVALID_REQUEST, say(sentences.REQUEST_CANNOT_SCHEDULED, problem=problem))
        if job.awaiting_approval:
            return Failure(PendingReason.AWAITING_APPROVAL, sentences.WAITING_FOR_APPROVAL)
        return None

    def _find_fit(self, job: PendingJob, *, holder: bool) -> tuple[_Fit | None, _Diagnosis]:
        """Steps 2 → 3 on each flavor in the job's order of preference, up to the first it fits on. A job whose
        flavors are alternatives (``ReplicaRequest.any_flavor``) under the fragmentation strategy is tried on
        all of them and goes where it borrows the least, then raises fragmentation the least (then in order)."""
        diagnosis = _Diagnosis()
        frag = self.placer.fragmentation
        compare = job.request.any_flavor and frag is not None and not holder and len(job.request.flavors) > 1
        best: tuple[tuple[int, float, int], str] | None = None
        for index, flavor in enumerate(job.request.flavors):
            outcome = self._try_flavor(job, flavor, holder=holder)
            if isinstance(outcome, _Fit):
                if not compare:
                    return outcome, diagnosis
                key = (outcome.admission.borrowed_millis, self._fragmentation_rise(outcome), index)
                if best is None or key < best[0]:
                    best = (key, flavor)
                continue
            if isinstance(outcome, _Attempt):
                diagnosis.unfit.append(outcome)
            else:
                diagnosis.refused.append(outcome)
        if best is not None:  # placed again on the chosen flavor: the same devices, the state being the same
            outcome = self._try_flavor(job, best[1], holder=holder)
            assert isinstance(outcome, _Fit)
            return outcome, diagnosis
        return None, diagnosis

    def _fragmentation_rise(self, fit: _Fit) -> float:
        """How much ``fit`` raises the fragmentation of the nodes it takes from; gives its devices back."""
        frag = self.placer.fragmentation
        assert frag is not None
        c = self.cluster
        nodes = {c.dev_node[d] for _, d, *_ in fit.log}

        def total() -> float:
            return sum(frag.frag(*frag.node_terms(n, fit.flavor), c.node_free_cpu[n]) for n in nodes)

        after = total()
        rollback(c, fit.log)
        return round(after - total(), 6)

    def _unschedulable(
        self, job: PendingJob, diagnosis: _Diagnosis, held: list[tuple[int, Hold]], waiting: tuple[str, ...]
    ) -> None:
        """The one failure path (kube-scheduler's PostFilter, then its failure handler). Cheapest remedy first:

        - a preemptor whose victims are still stopping keeps its held devices and waits (step 4, holds);
        - capacity that stops nobody: an idle inference reservation (step 3), then the devices held for a
          blocked head when the job ends before they free up (step 5, EASY backfill);
        - preemption: for a job that did not fit, else for one its own quota refused (step 4);
        - else it waits with the diagnosis' reason, and a job that wants devices holds some as the head of its
          flavor's queue (step 5), explained in step 6.
        """
        if waiting:
            self._keep_waiting(job, held, waiting)
            return
        unfit = diagnosis.capacity()
        if any(self._on_idle_reservation(job, attempt) for attempt in unfit):
            return
        if any(self._backfill_held(job, attempt) for attempt in unfit):
            return
        if self._preempt(job, diagnosis, unfit):
            return
        reason = diagnosis.reason()
        message = reason.message
        if reason.code == PendingReason.QUOTA_LIMIT:
            message += self._reclaim_note(job)
        if diagnosis.unfit and reason.code in _CAPACITY_REASONS:
            first = diagnosis.unfit[0]
            head = self.heads.reserve(job, first.flavor, first.count)
            if head is not None:
                self.stats["head_reservations"] += 1
                message = clauses(
                    message, say(sentences.DEVICE_HELD_HEAD_QUEUE, count=len(head[0]), flavor=first.flavor)
                )
        self._wait(job, reason.code, message)

    # -- steps 2 and 3 on one flavor: admit, filter → score → gang, bind -------------------------------------

    def _admit(
        self, job: PendingJob, flavor: str, replicas: int, *, new_job: bool = True, borrow: bool = True
    ) -> Admission:
        """Step 2 for ``replicas`` of the job on ``flavor`` (changes nothing). ``new_job=False``: more replicas
        of a job already counted; ``borrow=False``: only within the guarantee. A job in its borrowing back-off
        (``_borrow_backoff_until``) is admitted only within its tenant's guarantee."""
        until = self._borrow_backoff_until(job, flavor)
        admission = self.book.admit(
            tenant=job.tenant,
            flavor=flavor,
            millis=job.request.millis * replicas,
            preemptible=job.preemptible and borrow,
            borrowing=self.p.borrowing and borrow and until is None,
            new_job=new_job,
            no_borrowing=(
                sentences.BORROWING_OFF
                if until is None
                else say(sentences.PREEMPTED_NO_LONGER_BORROWS, count=job.preemptions)
                if until == math.inf
                else say(
                    sentences.PREEMPTED_MAY_BORROW_AGAIN, count=job.preemptions, minutes=_minutes(until - self.s.now)
                )
            ),
        )
        if admission.ok and admission.borrowed_millis > 0 and self._at_ceiling(job):
            return self._firm_loan(job, flavor, admission)
        return admission

    def _at_ceiling(self, job: PendingJob) -> bool:
        """The job was preempted ``Policy.max_preemptions_per_job`` times: it is not preempted again."""
        return at_preemption_ceiling(job.preemptions, self.p.max_preemptions_per_job)

    def _firm_loan(self, job: PendingJob, flavor: str, admission: Admission) -> Admission:
        """A job at the churn ceiling cannot be reclaimed, so whatever it borrows is a firm loan: it may borrow
        only guarantee its owners have left idle for a while (``QuotaBook.idle_guarantee``: above what they
        hold or their decayed use, and what their queued jobs ask), less the firm loans already out — not
        guarantee a busy tenant will want back within the hour."""
        assert admission.accounted_to is not None
        if flavor not in self._firm_out:
            ceiling = self.p.max_preemptions_per_job
            self._firm_out[flavor] = sum(
                a.borrowed_millis
                for a in self.s.allocations
                if a.flavor == flavor and at_preemption_ceiling(a.preemptions, ceiling)
            )
        placed = sum(p.borrowed_millis for p in self.places if p.flavor == flavor and p.job_id in self._firm_jobs)
        started = {p.job_id for p in self.places}
        waiting: dict[str, int] = {}
        for other in self.s.pending:
            if other.job_id not in started and flavor in other.request.flavors:
                waiting[other.tenant] = waiting.get(other.tenant, 0) + other.request.millis * other.gang_min
        idle = self.book.idle_guarantee(admission.accounted_to, flavor, self.s.usage, waiting)
        idle -= self._firm_out[flavor]
        if admission.borrowed_millis <= idle - placed:
            self._firm_jobs.add(job.job_id)
            return admission
        return Admission(
            False,
            code=PendingReason.NO_LENDABLE_CAPACITY,
            message=(
                f"preempted {job.preemptions} times, it is not preempted again, so it borrows only guarantee "
                f"other tenants have left idle for a while: {cards(max(0, idle - placed))} {flavor} cards now, "
                f"it would borrow {cards(admission.borrowed_millis)}"
            ),
            accounted_to=admission.accounted_to,
        )

    def _borrow_backoff_until(self, job: PendingJob, flavor: str) -> float | None:
        """When a preempted job may borrow again (``Policy.borrow_backoff_s``): the back-off doubles with each
        preemption, so a job larger than its tenant's unused guarantee is not started on loan only to be
        reclaimed minutes later, again and again. None: it may borrow now. A job preempted
        ``Policy.borrow_preemption_limit`` times that fits in its tenant's guarantee never borrows again
        (``math.inf``): it waits for the guarantee, which is its own."""
        base = self.p.borrow_backoff_s
        if job.preemptions <= 0 or job.last_preempted_at is None:
            return None
        limit = self.p.borrow_preemption_limit
        if limit is not None and job.preemptions >= limit:
            account = self.book.account(job.tenant, flavor)
            if account is not None and job.request.millis * job.gang_min <= self.book.guaranteed(account, flavor):
                return math.inf
        if base is None:
            return None
        until = job.last_preempted_at + base * 2 ** min(job.preemptions - 1, 16)
        return until if self.s.now < until else None

    def _try_flavor(self, job: PendingJob, flavor: str, *, holder: bool = False) -> _Fit | _Attempt | Failure:
        """Admit and place the job's gang on ``flavor``: a ``_Fit``, an admitted ``_Attempt`` that did not fit,
        or the ``Failure`` that refused it. A ``holder`` (a preemptor with devices held for it) sees capacity no
        other job sees, so shape failures of others say nothing about it and vice versa."""
        req = job.request
        if not self.cluster.has_flavor(flavor):
            return Failure(PendingReason.NO_SUCH_FLAVOR, say(sentences.NO_HEALTHY_SCHEDULABLE_DEVICE, flavor=flavor))
        count = job.gang_min
        admission = self._admit(job, flavor, count)
        if not admission.ok:
            return Failure(admission.code or PendingReason.QUOTA_EXHAUSTED, admission.message)
        head = self.heads.head(flavor)
        if head is not None and not self.p.backfill and not holder:
            return Failure(
                PendingReason.BLOCKED_BY_HEAD,
                say(sentences.WAITING_BEHIND_JOB_WHICH, head=head, flavor=flavor),
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
        failure = self.placer.place_job(job, flavor, log, count=count)
        if failure is not None:
            if not holder:
                self.failed_shapes[shape] = failure
            return _Attempt(flavor, admission, failure, count)
        return _Fit(flavor, admission, log)

    def _bind(self, job: PendingJob, fit: _Fit) -> None:
        """Record the placement: charge the quota and fair share, add the replicas beyond the gang that fit
        (inference), and the idle reservation of a service."""
        req = job.request
        flavor, log = fit.flavor, fit.log
        node = fit.admission.accounted_to
        assert node is not None
        self.book.charge(node=node, flavor=flavor, millis=req.millis * job.gang_min)
        # A same-node job's extra replicas join the others on their node (a lone replica is no same-node gang).
        near = self.cluster.dev_node[log[0][1]] if job.topology == Topology.SAME_NODE and log else None
        extra, extra_borrowed = self._add_replicas(
            job, flavor, node, log, first=job.first_replica + job.gang_min, n=job.replicas - job.gang_min, near=near
        )
        assignments = tuple(self._assignment(r, d, m, mem, cpu=cpu, host_mem=hm) for r, d, m, mem, cpu, hm in log)
        reserved = self._reserve_idle_replicas(job, flavor, node, len({a.replica for a in assignments}))
        self.fair.add(job.tenant, flavor, req.millis * (job.gang_min + extra))
        borrowed = fit.admission.borrowed_millis + extra_borrowed
        self.places.append(Place(job.job_id, job.tenant, flavor, assignments, borrowed, reserved))

    def _add_replicas(
        self,
        job: PendingJob,
        flavor: str,
        node: str,
        log: list[Take],
        *,
        first: int,
        n: int,
        borrow: bool = True,
        near: int | None = None,
    ) -> tuple[int, int]:
        """Up to ``n`` more single replicas numbered from ``first``, each admitted on its own (the job is already
        counted) and charged, into ``log``; stops at the first that is refused or does not fit. ``near``: the
        node they must join. Returns how many were added and the millis they borrow."""
        req = job.request
        added = borrowed = 0
        for replica in range(first, first + n):
            admission = self._admit(job, flavor, 1, new_job=False, borrow=borrow)
            if not admission.ok:
                break
            replica_log: list[Take] = []
            if near is not None:
                host = (req.cpu_millicores, req.host_memory_mib)
                ok = self.placer.place_replica(
                    flavor, req.millis, req.memory_mib, replica, Topology.NONE, {}, replica_log, near, host
                )
            else:
                ok = self.placer.place_job(job, flavor, replica_log, count=1, first_replica=replica) is None
            if not ok:
                break
            self.book.charge(node=node, flavor=flavor, millis=req.millis, jobs=0)
            added += 1
            borrowed += admission.borrowed_millis
            log.extend(replica_log)
        return added, borrowed

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

    # -- step 3: inference reservations ----------------------------------------------------------------------

    def _reserve_idle_replicas(self, job: PendingJob, flavor: str, node: str, placed: int) -> tuple[Assignment, ...]:
        """Inference: hold capacity for replicas up to ``max_replicas`` (charged to the tenant's quota, never
        borrowed)."""
        if job.kind != JobKind.INFERENCE or job.max_replicas is None:
            return ()
        req = job.request
        per = 1 if req.fractional else req.device_count
        want = job.max_replicas - job.first_replica - placed - self.reservations.count(job.job_id, per)
        log: list[Take] = []
        self._add_replicas(job, flavor, node, log, first=job.first_replica + placed, n=max(0, want), borrow=False)
        return tuple(self._assignment(r, d, m, mem, cpu=cpu, host_mem=hm) for r, d, m, mem, cpu, hm in log)

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
                    if self.preemptor:
                        self.preemptor.take(victim)
                    else:
                        taken.add(victim)
                    self._stop(
                        victim,
                        known[victim].tenant if victim in known else "",
                        job,
                        PreemptReason.RESERVATION_RECLAIM,
                        f"inference service {job.job_id} scales up into its reserved capacity",
                    )
                slots = self.reservations.slots[job.job_id]
                self.holds.add(job.job_id, (s.d for s in slots if set(s.borrowers) & set(blockers)), blockers)
                self._wait(
                    job,
                    PendingReason.WAITING_FOR_PREEMPTION,
                    clauses(
                        sentences.SCALING_UP_INTO_RESERVATION,
                        say(sentences.WAITING_JOB_RUNNING_STOP, count=len(blockers)),
                    ),
                )
                return True
        return False

    def _on_idle_reservation(self, job: PendingJob, attempt: _Attempt) -> bool:
        """A preemptible training/batch job that fits nowhere may run on an idle inference reservation — not one
        at the churn ceiling (``Policy.max_preemptions_per_job``), which the service could not take back."""
        if self._at_ceiling(job):
            return False
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

    # -- step 5: backfill onto a head's held devices ---------------------------------------------------------

    def _backfill_held(self, job: PendingJob, attempt: _Attempt) -> bool:
        """A job that ends before the devices held for its flavor's blocked head free up may use them."""
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
        failure = self.placer.place_job(job, attempt.flavor, log, count=attempt.count)
        for d in devices:
            self.cluster.hold(d, head)
        if failure is not None:
            self.failed_shapes[shape] = failure
            return False
        self.stats["backfilled_into_held"] += 1
        self._bind(job, _Fit(attempt.flavor, attempt.admission, log))
        return True

    # -- step 4: preemption ----------------------------------------------------------------------------------

    def _keep_waiting(self, job: PendingJob, held: list[tuple[int, Hold]], waiting: tuple[str, ...]) -> None:
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
            clauses(
                say(sentences.WAITING_PREEMPTED_JOB_STOP, count=len(waiting)),
                say(sentences.DEVICE_HELD_MEANWHILE, count=len({d for d, _ in held}), flavor=flavor),
            ),
        )

    def _preempt(self, job: PendingJob, diagnosis: _Diagnosis, unfit: list[_Attempt]) -> bool:
        """Step 4 for a job that fits nowhere: a victim search on each flavor it was admitted on but found no
        devices (``unfit``, in order); only if it was admitted on none, a search among its own quota's work."""
        if diagnosis.unfit and any(self._preempt_for(job, attempt) for attempt in unfit):
            return True
        if diagnosis.quota_refused() and self._reclaim_under_limits(job):
            return True
        if diagnosis.unfit:
            return False
        # An aged gang that nobody lends to may still take its tenant's guarantee back from newer own jobs.
        aged = aged_gang(job, self.p, self.s.now)
        refused = diagnosis.quota_refused() or (
            aged and any(r.code == PendingReason.NO_LENDABLE_CAPACITY for r in diagnosis.refused)
        )
        return refused and self._preempt_for_quota(job, aged)

    def _limits_refusing(self, job: PendingJob, flavor: str) -> tuple[str, list[tuple[str, int]]] | None:
        """The job's quota node and the limits on its path that refuse it on ``flavor`` while it is within its
        tenant's guarantee (what reclaim through a limit answers); None when that is not the case."""
        node = self.book.account(job.tenant, flavor)
        millis = job.request.millis * job.gang_min
        if node is None or not self.cluster.has_flavor(flavor) or not self.book.within_guarantee(node, flavor, millis):
            return None
        limits = self.book.over_limits(node, flavor, millis)
        return (node, limits) if limits else None

    def _reclaim_under_limits(self, job: PendingJob) -> bool:
        """A job within its tenant's guarantee that a limit on its path refuses — its parent's, an ancestor's —
        reclaims the borrowed use under that limit (``Preemptor.search_under_limits``), as it reclaims borrowed
        capacity when it fits no device: the guarantee is a promise whichever limit stands in the way. Like any
        reclaim, it is not held back by ``max_preemption_searches`` (its searches still count)."""
        if self.preemptor is None:
            return False
        req = job.request
        count = job.gang_min
        for flavor in req.flavors:
            refusing = self._limits_refusing(job, flavor)
            if refusing is None:
                continue
            node, limits = refusing
            key = ("limits", flavor, node, req.millis, req.memory_mib, req.cpu_millicores, req.host_memory_mib)
            key += (count, job.topology, tuple(sorted(job.node_selector.items())), int(job.priority))
            key += (job.preempted_by, tuple(limits))
            if key in self.failed_searches:
                continue

            def admitted(flavor: str = flavor) -> bool:
                return self._admit(job, flavor, count).ok

            self.searches += 1
            self.stats["preemption_searches"] += 1
            choice = self.preemptor.search_under_limits(
                job=job, flavor=flavor, count=count, accounted_to=node, limits=limits, admitted=admitted
            )
            if choice is None:
                self.failed_searches.add(key)
                continue
            self._commit_preemption(job, flavor, node, count, choice)
            return True
        return False

    def _reclaim_note(self, job: PendingJob) -> str:
        """For a job within its guarantee that a limit refuses and nothing can be reclaimed for yet: what it
        waits for — borrowed use under that limit that reclaim takes once it has run its minimum runtime — so
        its reason says when the wait ends rather than only that the limit is reached. Empty otherwise."""
        if self.preemptor is None:
            return ""
        for flavor in job.request.flavors:
            refusing = self._limits_refusing(job, flavor)
            if refusing is None:
                continue
            node, limits = refusing
            waits = self.preemptor.reclaim_waits(flavor=flavor, accounted_to=node, under=tuple(a for a, _ in limits))
            if waits is not None:
                jobs, wait_s = waits
                return "; " + say(
                    sentences.JOB_BORROWING_UNDER_LIMIT, jobs=jobs, flavor=flavor, minutes=_minutes(wait_s)
                )
        return ""

    def _preempt_for_quota(self, job: PendingJob, aged: bool) -> bool:
        """A job its own quota refuses may stop lower-priority work charged to the same quota node (an ``aged``
        gang also newer work of its priority)."""
        if self.preemptor is None or self.searches >= self.p.max_preemption_searches:
            return False
        req = job.request
        count = job.gang_min
        for flavor in job.request.flavors:
            node = self.book.account(job.tenant, flavor)
            if node is None or not self.cluster.has_flavor(flavor):
                continue
            # An aged gang searches more (newer own jobs): a failed search of another job says nothing of it.
            key = ("quota", flavor, node, int(job.priority), req.millis * count, job.preempted_by, aged)
            if key in self.failed_searches:
                continue

            def admitted(flavor: str = flavor) -> bool:
                return self._admit(job, flavor, count).ok

            before = self.preemptor.quota_searches
            choice = self.preemptor.search_quota(
                job=job,
                flavor=flavor,
                count=count,
                accounted_to=node,
                admitted=admitted,
                aged_gang=aged,
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
        """A job admitted on ``attempt.flavor`` that found no devices may stop the cheapest victim set there."""
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
            if reason == PreemptReason.RECLAIM_BORROWED:
                why = say(sentences.TENANT_BORROWED_CAPACITY_NEEDS, tenant=victim.tenant, other=job.tenant)
            elif reason == PreemptReason.NEWER_OWN:
                why = (
                    f"job {job.job_id}, a gang of {cards(req.millis * count)} {flavor} cards of the same tenant "
                    "waiting since before this job started, needs the tenant's guarantee"
                )
            elif reason == PreemptReason.RELOCATE:
                why = (
                    f"job {job.job_id} of {job.tenant}, within its guarantee, needs {cards(req.millis * count)} "
                    f"{flavor} cards on one node; this job restarts on capacity reclaimed for it elsewhere"
                )
            else:
                why = say(sentences.HIGHER_PRIORITY_JOB_PRIORITY, job=job.job_id, priority=int(job.priority))
            self._stop(victim.job_id, victim.tenant, job, reason, why)
        self._wait(
            job,
            PendingReason.WAITING_FOR_PREEMPTION,
            clauses(
                say(
                    sentences.WAITING_JOB_STOP_FREE,
                    count=len(choice.victims),
                    size=cards(req.millis * count),
                    flavor=flavor,
                ),
                sentences.STARTS_FOLLOWING_CYCLE,
            ),
        )

    def _stop(self, victim: str, tenant: str, job: PendingJob, reason: PreemptReason, message: str) -> None:
        """The one place a preemption decision is made: ``victim`` stops (after the grace period) for ``job``."""
        self.preemptions.append(
            Preempt(
                job_id=victim,
                victim_of=job.job_id,
                reason=reason,
                grace_s=self.p.grace_period_s,
                tenant=tenant,
                message=message,
            )
        )


def plan(snapshot: Snapshot, policy: Policy | None = None) -> Plan:
    """One scheduling cycle: pure and deterministic (same snapshot and policy → same plan). Jobs that can never
    start (``feasibility.py``) are kept out of the cycle and explained as ``never_fits``."""
    queue, refused = split_never_fits(snapshot)
    return with_never_fits(_Cycle(queue, policy or Policy()).run(), snapshot, refused)


__all__ = ["plan", "rollback", "validate"]
