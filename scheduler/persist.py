"""A ``scheduler.core`` Plan → rows, in the caller's transaction, safe against concurrent writers, in bulk.

The plan was computed from a snapshot that may be stale by the time it is written (another worker, a cancel,
a node going away). So every ``Place`` is re-checked under row locks. Locking rule (the project's lock order,
after the cycle's advisory lock): every row is locked once, up front, with
``select_for_update(of=("self",), no_key=True)`` (FOR NO KEY UPDATE: the deferred foreign-key checks of other
transactions, FOR KEY SHARE, never wait on it; never a tenant or user row through ``select_related``), rows
of one table in primary-key order, tables in the order Job → Device → InferenceReservation. The jobs of the
plan's places and preemptions come first, then the devices its places touch, whose active allocations are
summed once inside the transaction and kept up to date in memory as places are accepted.

Each place is checked in memory against that state; a place that no longer fits is skipped (its job stays
queued for the next cycle) and no device is ever double-booked. What the accepted places write is then
written in bulk — a few statements for the whole plan, not a few per place: the allocations and reservations
in one INSERT each, the jobs' ``queued → admitted`` transitions in one UPDATE, their ``JobEvent`` rows in one
INSERT, the ``workload.start`` commands in bulk; the audit records are buffered by ``audit_record`` and
inserted at commit. On PostgreSQL the allocation trigger (migration 0003) is the last line of defence: if it
refuses the bulk insert, the places are written again one by one, each in a savepoint, and only the refused
ones are skipped.

Inference reservations count as used capacity of their device. An assignment on a reservation
(``reservation_of``) uses the reservation's capacity instead: the service's own replica consumes the
reservation row (it becomes the allocation), a borrower's allocation is marked ``reservation_of`` and must
fit in what the reservation has not lent. ``Place.reserved`` becomes reservation rows. The plan's holds
replace the stored ones (``CapacityHold``) in the same transaction.

Pending explanations are written only for the jobs whose stored reason, message or positions differ.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from audit.services import audit_record
from portal.db.bulk import AnyOf, insert_rows, update_rows
from scheduler import launch, outbox, serving
from scheduler.core import types as core
from scheduler.logs import job_log_ends
from scheduler.models import (
    MILLIS_PER_DEVICE,
    Allocation,
    CapacityHold,
    Device,
    DeviceHealth,
    InferenceReservation,
    Job,
    JobEvent,
    JobKind,
    JobState,
    Node,
    NodeStatus,
    ResourceFlavor,
)
from scheduler.services.transitions import ALLOWED_TRANSITIONS, job_transition
from scheduler.snapshot import CompiledQuery
from tenants.models import Tenant

logger = logging.getLogger(__name__)

#: Rows per INSERT / UPDATE statement (PostgreSQL takes at most 65,535 parameters per statement).
WRITE_BATCH = 1000
#: What a pending job shows: (reason code, message, position in its tenant, position overall).
StoredExplanation = tuple[str, str, int | None, int | None]


@dataclass
class PersistOutcome:
    placed: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    explained: int = 0
    skipped: list[dict] = field(default_factory=list)


class PlaceRejected(Exception):
    """The place no longer fits (or never did); the job stays queued."""


def _job_id(text: str) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _memory_taken(device: _DeviceRow, assignment: core.Assignment) -> int:
    """A whole card takes all its memory; a fraction takes what it asked for."""
    return device.memory_mib if assignment.millis >= MILLIS_PER_DEVICE else assignment.memory_mib


def _check_shape(job: Job, place: core.Place, running: set[int]) -> dict[int, list[core.Assignment]]:
    by_replica: dict[int, list[core.Assignment]] = defaultdict(list)
    for assignment in place.assignments:
        by_replica[assignment.replica].append(assignment)
    if running:  # a running service scaling up: any number of new replicas up to what it wants
        wanted, least = job.replicas - len(running), 1
        if running & set(by_replica):
            raise PlaceRejected(f"replicas {sorted(running & set(by_replica))} already run")
    else:
        wanted = job.replicas
        least = wanted if job.min_replicas is None else min(job.min_replicas, wanted)
    if not least <= len(by_replica) <= wanted:
        raise PlaceRejected(f"plan places {len(by_replica)} replicas, the job needs {least}..{wanted}")
    for replica, assignments in by_replica.items():
        total = sum(a.millis for a in assignments)
        if total != job.millis_per_replica:
            raise PlaceRejected(f"replica {replica} gets {total} millis, it asked for {job.millis_per_replica}")
        if len({a.node for a in assignments}) != 1:
            raise PlaceRejected(f"replica {replica} spans nodes")
    return by_replica


@dataclass
class _PlaceWrite:
    """Everything one accepted place writes; nothing of it is in the database until ``_write`` runs."""

    job: Job
    scaling: bool  # a running service's new replicas (a JobEvent, no transition)
    allocations: list[Allocation]
    consumed: list[InferenceReservation]  # the service's own reservations its new replicas take over
    reserved: list[InferenceReservation]  # capacity held for idle replicas (``Place.reserved``)
    event_message: str
    details: dict
    #: Its replicas' ports and addresses (``scheduler.launch``), once reserved.
    layout: launch.Launch | None = None


@dataclass(frozen=True, slots=True)
class _DeviceRow:
    """What a place needs of a device (and its node): read as values, not as model instances (thousands)."""

    pk: int
    uuid: str
    index: int
    node_id: int
    node_name: str
    node_status: str
    health: str
    flavor_id: int | None
    memory_mib: int


class _Batch:
    """The rows every preemption and place of a plan touches, locked once up front: the jobs, then the devices,
    then the devices' reservations (each in pk order, so concurrent writers never deadlock), with the devices'
    active usage summed once. The locks hold until commit, so the usage kept here stays true: any other insert
    onto these devices waits for them (the PostgreSQL trigger locks the device row too), and ending
    allocations only frees capacity."""

    def __init__(self, plan: core.Plan, *, also_lock: Sequence[int] = ()) -> None:
        """``also_lock``: more job pks to lock in the same pk-ordered pass (the jobs whose explanation changes)."""
        wanted = {pk for place in plan.places if (pk := _job_id(place.job_id)) is not None} | {
            pk for preempt in plan.preemptions if (pk := _job_id(preempt.job_id)) is not None
        }
        every = sorted(wanted | set(also_lock))
        # Compiled once (``CompiledQuery``), and none run for what nothing asks for: most cycles of a busy
        # worker place a job or two, or none.
        self.jobs: dict[int, Job] = {}
        if len(every) > len(wanted):
            # Lock every job, then read in full only those the plan places or preempts.
            _JOBS_LOCK.rows(every)
            if wanted:
                self.jobs = {job.pk: job for job in _JOBS.rows(sorted(wanted))}
        elif every:
            self.jobs = {job.pk: job for job in _JOBS_LOCKED.rows(every)}
        if self.jobs:
            # The few tenants, read once (not locked, not joined per job).
            tenants = {tenant.pk: tenant for tenant in _TENANTS.rows(sorted({j.tenant_id for j in self.jobs.values()}))}
            for job in self.jobs.values():
                job.tenant = tenants[job.tenant_id]
        uuids = sorted({a.device_uuid for place in plan.places for a in (*place.assignments, *place.reserved)})
        devices = _DEVICES_LOCKED.rows(uuids) if uuids else []
        nodes = (
            {pk: (name, status) for pk, name, status in _NODES.rows(sorted({row[3] for row in devices}))}
            if devices
            else {}
        )
        self.devices: dict[str, _DeviceRow] = {
            uuid: _DeviceRow(pk, uuid, index, node_id, *nodes[node_id], health, flavor_id, memory_mib)
            for pk, uuid, index, node_id, health, flavor_id, memory_mib in devices
        }
        device_pks = sorted(d.pk for d in self.devices.values())
        # Per device: what allocations off any reservation and the reservations themselves take.
        self.used: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        # Per (device, service): what borrowers hold of the service's reservation there.
        self.lent: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
        for device_id, reservation_of_id, millis, memory in _DEVICE_USE.rows(device_pks) if device_pks else ():
            target = self.used[device_id] if reservation_of_id is None else self.lent[(device_id, reservation_of_id)]
            target[0] += millis or 0
            target[1] += memory or 0
        self.reserved: dict[tuple[int, int], list[InferenceReservation]] = defaultdict(list)
        for reservation in _RESERVATIONS_LOCKED.rows(device_pks) if device_pks else ():
            self.reserved[(reservation.device_id, reservation.job_id)].append(reservation)
            self.used[reservation.device_id][0] += reservation.millis
            self.used[reservation.device_id][1] += reservation.memory_mib
        self.device_memory = {device.pk: device.memory_mib for device in self.devices.values()}
        self.by_pk = {device.pk: device for device in self.devices.values()}
        names = sorted({place.flavor for place in plan.places})
        self.flavors = {flavor.name: flavor for flavor in _FLAVORS.rows(names)} if names else {}
        # Replicas that run now, per running inference service a place scales up (one query for them all).
        scaling_pks = [
            pk
            for pk, job in self.jobs.items()
            if job.kind == JobKind.INFERENCE and job.state in (JobState.ADMITTED, JobState.RUNNING)
        ]
        self.running: dict[int, set[int]] = defaultdict(set)
        for job_pk, replica in _REPLICAS_RUNNING.rows(scaling_pks) if scaling_pks else ():
            self.running[job_pk].add(replica)


# The batch's reads and locks (see ``_Batch``), each compiled once; each argument is a list of values.
_JOBS_LOCK = CompiledQuery(
    lambda pks: (
        Job.objects.select_for_update(of=("self",), no_key=True)
        .filter(AnyOf("pk", pks))
        .order_by("pk")
        .values_list("pk")
    ),
    arguments=1,
)
_JOBS_LOCKED = CompiledQuery(
    lambda pks: Job.objects.select_for_update(of=("self",), no_key=True).filter(AnyOf("pk", pks)).order_by("pk"),
    arguments=1,
    instances=True,
)
_JOBS = CompiledQuery(lambda pks: Job.objects.filter(AnyOf("pk", pks)), arguments=1, instances=True)
_TENANTS = CompiledQuery(lambda pks: Tenant.objects.filter(AnyOf("pk", pks)), arguments=1, instances=True)
_DEVICES_LOCKED = CompiledQuery(
    lambda uuids: (
        Device.objects.select_for_update(of=("self",), no_key=True)
        .filter(AnyOf("uuid", uuids))
        .order_by("pk")
        .values_list("pk", "uuid", "index", "node_id", "health", "flavor_id", "memory_mib")
    ),
    arguments=1,
)
_NODES = CompiledQuery(
    lambda pks: Node.objects.filter(AnyOf("pk", pks)).values_list("pk", "name", "status"), arguments=1
)
_DEVICE_USE = CompiledQuery(
    lambda pks: (
        Allocation.objects.active()
        .filter(AnyOf("device_id", pks))
        .values_list("device_id", "reservation_of_id")
        .annotate(millis=Sum("millis"), memory=Sum("memory_mib"))
        .order_by()
    ),
    arguments=1,
)
_RESERVATIONS_LOCKED = CompiledQuery(
    lambda pks: (
        InferenceReservation.objects.select_for_update(of=("self",)).filter(AnyOf("device_id", pks)).order_by("pk")
    ),
    arguments=1,
    instances=True,
)
_FLAVORS = CompiledQuery(lambda names: ResourceFlavor.objects.filter(AnyOf("name", names)), arguments=1, instances=True)
_REPLICAS_RUNNING = CompiledQuery(
    lambda pks: Allocation.objects.active().filter(AnyOf("job_id", pks)).values_list("job_id", "replica"),
    arguments=1,
)


def _check_place(place: core.Place, *, batch: _Batch, now: datetime) -> _PlaceWrite:
    """Check ``place`` against the locked rows and build what it writes; raises PlaceRejected. Changes nothing
    (``_accept`` counts an accepted place's usage)."""
    job = batch.jobs.get(_job_id(place.job_id))
    scaling = job is not None and job.kind == JobKind.INFERENCE and job.state in (JobState.ADMITTED, JobState.RUNNING)
    if job is None or (job.state != JobState.QUEUED and not scaling):
        raise PlaceRejected(f"job is {job.state if job else 'gone'}, not queued")
    running = batch.running[job.pk] if scaling else set()
    if scaling and not running:
        raise PlaceRejected("the service has no running replica to scale")
    by_replica = _check_shape(job, place, running)
    if place.flavor not in job.flavors:
        raise PlaceRejected(f"flavor {place.flavor} was not asked for")
    flavor = batch.flavors.get(place.flavor)
    if flavor is None:
        raise PlaceRejected(f"flavor {place.flavor} no longer exists")

    uuids = sorted({a.device_uuid for a in place.assignments})
    if any(uuid not in batch.devices for uuid in uuids):
        raise PlaceRejected("a device in the plan no longer exists")
    adding: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    lending: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    consumed: list[InferenceReservation] = []
    rows = []
    borrowed_left = place.borrowed_millis
    for replica in sorted(by_replica):
        for assignment in sorted(by_replica[replica], key=lambda a: a.device_uuid):
            device = batch.devices[assignment.device_uuid]
            if device.node_name != assignment.node:
                raise PlaceRejected(f"device {device.uuid} is on {device.node_name}, not {assignment.node}")
            if device.node_status != NodeStatus.READY:
                raise PlaceRejected(f"node {device.node_name} is {device.node_status}")
            if device.health != DeviceHealth.HEALTHY or device.flavor_id != flavor.pk:
                raise PlaceRejected(f"device {device.uuid} is {device.health} / not {flavor.name}")
            memory = _memory_taken(device, assignment)
            service = _job_id(assignment.reservation_of) if assignment.reservation_of else None
            if service is None:
                adding[device.pk][0] += assignment.millis
                adding[device.pk][1] += memory
            elif service == job.pk:
                consumed.append(_own_reservation_row(batch, device, job, assignment.millis, consumed))
            else:
                lending[(device.pk, service)][0] += assignment.millis
                lending[(device.pk, service)][1] += memory
            borrowed = min(borrowed_left, assignment.millis)
            borrowed_left -= borrowed
            rows.append(
                Allocation(
                    job=job,
                    replica=replica,
                    tenant_id=job.tenant_id,
                    flavor=flavor,
                    device_id=device.pk,
                    node_id=device.node_id,
                    millis=assignment.millis,
                    memory_mib=memory,
                    borrowed_millis=borrowed,
                    reservation_of_id=service if service is not None and service != job.pk else None,
                    started_at=now,
                )
            )
    for (device_pk, service), (new_millis, new_memory) in lending.items():
        held = batch.reserved.get((device_pk, service), [])
        lent_millis, lent_memory = batch.lent[(device_pk, service)]
        if not held or lent_millis + new_millis > sum(r.millis for r in held):
            raise PlaceRejected(f"the reservation of job {service} has no room left on device {device_pk}")
        if lent_memory + new_memory > sum(r.memory_mib for r in held):
            raise PlaceRejected(f"the reservation of job {service} has no memory left on device {device_pk}")
    for uuid in uuids:
        device = batch.devices[uuid]
        held_millis, held_memory = batch.used[device.pk]
        new_millis, new_memory = adding[device.pk]
        if held_millis + new_millis > MILLIS_PER_DEVICE:
            raise PlaceRejected(f"device {device.uuid} has {MILLIS_PER_DEVICE - held_millis} millis free")
        if held_memory + new_memory > device.memory_mib:
            raise PlaceRejected(f"device {device.uuid} has {device.memory_mib - held_memory} MiB free")

    # Only now (nothing above raised) does the batch count the new usage.
    for device_pk, (new_millis, new_memory) in adding.items():
        batch.used[device_pk][0] += new_millis
        batch.used[device_pk][1] += new_memory
    for key, (new_millis, new_memory) in lending.items():
        batch.lent[key][0] += new_millis
        batch.lent[key][1] += new_memory
    for reservation in consumed:
        batch.reserved[(reservation.device_id, job.pk)].remove(reservation)
    nodes = sorted({device.node_name for device in map(batch.by_pk.get, (row.device_id for row in rows))})
    details = {"devices": uuids, "borrowed_millis": place.borrowed_millis}
    if scaling:
        new = sorted(by_replica)
        message = f"Replicas {', '.join(map(str, new))} placed on {', '.join(nodes)}."
        details = {**details, "replicas": new}
        batch.running[job.pk].update(new)
    else:
        message = f"Placed on {', '.join(nodes)}."
        job.state = JobState.ADMITTED  # a second place of the same job in this plan is refused
    return _PlaceWrite(
        job=job,
        scaling=scaling,
        allocations=rows,
        consumed=consumed,
        reserved=_reserve(place, job=job, batch=batch),
        event_message=message,
        details=details,
    )


def _own_reservation_row(
    batch: _Batch, device: _DeviceRow, job: Job, millis: int, taken: list[InferenceReservation]
) -> InferenceReservation:
    """The reservation row of ``job`` on ``device`` its new replica takes over; no borrower may be on it."""
    if batch.lent[(device.pk, job.pk)][0] > 0:
        raise PlaceRejected(f"work borrowing the reservation on device {device.uuid} has not stopped yet")
    for reservation in batch.reserved.get((device.pk, job.pk), []):
        if reservation not in taken and reservation.millis == min(millis, MILLIS_PER_DEVICE):
            return reservation
    raise PlaceRejected(f"job {job.pk} has no {millis}-millis reservation on device {device.uuid}")


def _reserve(place: core.Place, *, job: Job, batch: _Batch) -> list[InferenceReservation]:
    """Reservation rows for ``Place.reserved`` (idle replicas up to ``max_replicas``), counted in the batch.
    One that no longer fits is left out: the service runs anyway, with less room to scale into."""
    by_replica: dict[int, list[core.Assignment]] = defaultdict(list)
    for assignment in place.reserved:
        by_replica[assignment.replica].append(assignment)
    flavor = batch.flavors[place.flavor]
    kept: list[InferenceReservation] = []
    for replica in sorted(by_replica):
        rows = []
        adding: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for assignment in by_replica[replica]:
            device = batch.devices.get(assignment.device_uuid)
            if device is None:
                break
            memory = _memory_taken(device, assignment)
            adding[device.pk][0] += assignment.millis
            adding[device.pk][1] += memory
            rows.append(
                InferenceReservation(
                    job=job,
                    replica=replica,
                    tenant_id=job.tenant_id,
                    flavor=flavor,
                    device_id=device.pk,
                    node_id=device.node_id,
                    millis=assignment.millis,
                    memory_mib=memory,
                )
            )
        fits = len(rows) == len(by_replica[replica]) and all(
            batch.used[pk][0] + m <= MILLIS_PER_DEVICE and batch.used[pk][1] + mem <= batch.device_memory[pk]
            for pk, (m, mem) in adding.items()
        )
        if not fits:
            logger.info("reservation of job %s replica %s no longer fits; left out", job.pk, replica)
            continue
        kept.extend(rows)
        for row in rows:
            batch.reserved[(row.device_id, job.pk)].append(row)
        for pk, (m, mem) in adding.items():
            batch.used[pk][0] += m
            batch.used[pk][1] += mem
    return kept


def _write(writes: Sequence[_PlaceWrite], *, now: datetime) -> None:
    """The rows of accepted places, a few statements for all of them."""
    consumed = [reservation.pk for write in writes for reservation in write.consumed]
    if consumed:  # the service's replicas take over their reserved capacity
        InferenceReservation.objects.filter(AnyOf("pk", consumed)).delete()
    insert_rows(
        Allocation,
        ALLOCATION_COLUMNS,
        [
            (
                row.job_id,
                row.replica,
                row.tenant_id,
                row.flavor_id,
                row.device_id,
                row.node_id,
                row.millis,
                row.memory_mib,
                row.borrowed_millis,
                row.reservation_of_id,
                row.started_at,
            )
            for write in writes
            for row in write.allocations
        ],
    )
    InferenceReservation.objects.bulk_create(
        [row for write in writes for row in write.reserved], batch_size=WRITE_BATCH
    )
    admitted = [write for write in writes if not write.scaling]
    _admit(admitted, now=now)
    insert_rows(
        JobEvent,
        ("job_id", "from_state", "to_state", "reason", "message", "actor_id", "details", "created_at"),
        [
            (
                write.job.pk,
                str(write.job.state if write.scaling else JobState.QUEUED),
                str(write.job.state),
                "scaled_up" if write.scaling else "placed",
                write.event_message[:500],
                None,
                write.details,
                now,
            )
            for write in writes
        ],
    )
    for write in admitted:
        # As ``job_transition`` records it (``audit_record`` buffers the records; they are inserted at commit).
        audit_record(
            action="job.transition",
            actor=None,
            tenant=write.job.tenant,
            target=f"job:{write.job.pk}",
            details={
                "before": {"state": JobState.QUEUED},
                "after": {"state": JobState.ADMITTED},
                "reason": "placed",
                **write.details,
            },
        )


ALLOCATION_COLUMNS = (
    "job_id",
    "replica",
    "tenant_id",
    "flavor_id",
    "device_id",
    "node_id",
    "millis",
    "memory_mib",
    "borrowed_millis",
    "reservation_of_id",
    "started_at",
)


def _admit(writes: Sequence[_PlaceWrite], *, now: datetime) -> None:
    """The ``queued → admitted`` transition of many jobs in one UPDATE per batch, with the same fields as
    ``scheduler.services.transitions.job_transition`` sets (it writes one row per call: ~9 ms a job with its event and
    audit record). The caller holds the rows' locks and has checked each job is queued."""
    if not writes:
        return
    if JobState.ADMITTED not in ALLOWED_TRANSITIONS[JobState.QUEUED]:  # the rules changed: say so loudly
        raise RuntimeError("queued → admitted is no longer an allowed transition; persist must follow")
    for write in writes:
        job = write.job
        job.state = JobState.ADMITTED
        job.admitted_at = job.updated_at = now
        job.state_message = write.event_message[:500]
        job.pending_reason_code = job.pending_message = ""
        job.position_in_tenant = job.position_overall = None
    at = connection.ops.adapt_datetimefield_value(now)
    update_rows(
        Job,
        columns=(("id", "bigint"), ("message", "text")),
        rows=[(write.job.pk, write.job.state_message) for write in writes],
        set_sql=(
            "state = %s, admitted_at = %s, updated_at = %s, state_message = v.message, "
            "pending_reason_code = '', pending_message = '', position_in_tenant = NULL, position_overall = NULL"
        ),
        set_params=[JobState.ADMITTED.value, at, at],
    )


def _write_places(writes: list[_PlaceWrite], *, now: datetime, outcome: PersistOutcome) -> list[_PlaceWrite]:
    """Write every accepted place in bulk; returns those written. When the database refuses the bulk insert (the
    PostgreSQL trigger saw a double booking the checks did not), the places are written one by one, each in a
    savepoint, and only the refused ones are skipped."""
    if not writes:
        return []
    try:
        with transaction.atomic():  # a savepoint: a refusal leaves the rest of the cycle intact
            _write(writes, now=now)
        return writes
    except IntegrityError as exc:
        logger.warning(
            "the database refused the bulk write of %d places (%s); writing them one by one", len(writes), exc
        )
    written = []
    for write in writes:
        for row in (*write.allocations, *write.reserved):  # rolled back: insert afresh
            row.pk = None
            row._state.adding = True
        try:
            with transaction.atomic():
                _write([write], now=now)
        except IntegrityError as exc:
            logger.warning("place of job %s refused by the database: %s", write.job.pk, exc)
            _skipped(str(write.job.pk), "refused by the database", outcome=outcome)
            continue
        written.append(write)
    return written


def _holds_replace(holds: tuple[core.Hold, ...], *, now: datetime) -> None:
    """Store the plan's holds in place of the last cycle's (the engine returns every hold to keep)."""
    CapacityHold.objects.all().delete()
    if not holds:
        return
    jobs = set(Job.objects.filter(pk__in={_job_id(h.job_id) for h in holds}).values_list("pk", flat=True))
    devices = dict(Device.objects.filter(uuid__in={h.device_uuid for h in holds}).values_list("uuid", "pk"))
    rows: dict[int, CapacityHold] = {}
    for hold in holds:
        device = devices.get(hold.device_uuid)
        if _job_id(hold.job_id) not in jobs or device is None or device in rows:
            continue  # a job or device gone meanwhile; one preemptor per device (the engine keeps that too)
        rows[device] = CapacityHold(
            job_id=_job_id(hold.job_id),
            device_id=device,
            victim_ids=[int(v) for v in hold.victims if _job_id(v) is not None],
            since=datetime.fromtimestamp(hold.since, tz=UTC) if hold.since else now,
        )
    CapacityHold.objects.bulk_create(rows.values())


def _preempt(preempt: core.Preempt, *, batch: _Batch, outcome: PersistOutcome) -> None:
    job = batch.jobs.get(_job_id(preempt.job_id))  # locked by the batch (FOR NO KEY UPDATE, not its tenant)
    if job is None or job.state not in (JobState.ADMITTED, JobState.RUNNING):
        return  # already stopping, finished or gone
    preemptor = _job_id(preempt.victim_of)
    if preemptor is not None and preemptor not in job.preempted_by:
        job.preempted_by = [*job.preempted_by, preemptor]
    job.preemption_count += 1
    job.save(update_fields=["preempted_by", "preemption_count"])
    outbox.stop_active_replicas(job=job, grace_s=preempt.grace_s, reason="preempted")
    job_transition(
        job=job,
        to_state=JobState.PREEMPTING,
        actor=None,
        reason=str(preempt.reason),
        message=preempt.message or f"Preempted for job {preempt.victim_of}.",
        details={"preempted_for": preempt.victim_of, "grace_s": preempt.grace_s},
    )
    outcome.preempted.append(job.pk)


def _changed_explanations(
    explanations: tuple[core.Explain, ...], *, stored: Mapping[int, StoredExplanation] | None
) -> list[tuple[int, str, str, int | None, int | None]]:
    """The explanations that differ from what the jobs show, as ``(pk, code, message, in tenant, overall)``.
    ``stored`` is what the snapshot read (``build_snapshot(stored_explanations=...)``); without it the jobs
    are read here. Only jobs still pending take an explanation (a running service scaling up does not)."""
    by_pk = {pk: e for e in explanations if (pk := _job_id(e.job_id)) is not None}
    if not by_pk:
        return []
    if stored is None:
        stored = {
            pk: (code, message, in_tenant, overall)
            for pk, code, message, in_tenant, overall in Job.objects.filter(
                AnyOf("pk", by_pk), state__in=[JobState.QUEUED, JobState.PENDING_APPROVAL]
            ).values_list("pk", "pending_reason_code", "pending_message", "position_in_tenant", "position_overall")
        }
    changed = []
    for pk, explain in by_pk.items():
        values = (str(explain.code), explain.message[:500], explain.position_in_tenant, explain.position_overall)
        current = stored.get(pk)
        if current is not None and values != current:
            changed.append((pk, *values))
    changed.sort()
    return changed


def _write_explanations(rows: list[tuple[int, str, str, int | None, int | None]]) -> int:
    """The changed explanations in one UPDATE; a job that stopped pending meanwhile keeps its fields."""
    return update_rows(
        Job,
        columns=(
            ("id", "bigint"),
            ("code", "text"),
            ("message", "text"),
            ("in_tenant", "integer"),
            ("overall", "integer"),
        ),
        rows=rows,
        set_sql=(
            "pending_reason_code = v.code, pending_message = v.message, position_in_tenant = v.in_tenant, "
            "position_overall = v.overall"
        ),
        where_sql=f"AND state IN ('{JobState.QUEUED.value}', '{JobState.PENDING_APPROVAL.value}')",
    )


def _reserve_ports(accepted: list[_PlaceWrite], *, now: datetime, outcome: PersistOutcome) -> list[_PlaceWrite]:
    """The *Reserve* step: each accepted place's ports (``scheduler.launch``); a place whose nodes have none left
    is not written, and its job stays queued saying so (the capacity it was counted with stays counted for the
    rest of this plan: conservative, never a double booking)."""
    requests = [
        launch.PortRequest(
            job=write.job,
            replica_nodes={row.replica: row.node_id for row in write.allocations},
            scaling=write.scaling,
        )
        for write in accepted
    ]
    reserved = launch.ports_reserve(requests, now=now)
    kept = []
    for write in accepted:
        why = reserved.refused.get(write.job.pk)
        if why is None:
            write.layout = reserved.launches[write.job.pk]
            kept.append(write)
            continue
        logger.info("place of job %s skipped: %s", write.job.pk, why)
        outcome.skipped.append({"job_id": str(write.job.pk), "reason": why})
        if not write.scaling:
            write.job.state = JobState.QUEUED  # _check_place marked it admitted for this plan only
        Job.objects.filter(pk=write.job.pk, state=JobState.QUEUED).update(
            pending_reason_code=str(launch.PORTS_EXHAUSTED), pending_message=why[:500]
        )
    return kept


def _skipped(job_id: str, reason: str, *, outcome: PersistOutcome) -> None:
    outcome.skipped.append({"job_id": job_id, "reason": reason})
    Job.objects.filter(pk=_job_id(job_id), state=JobState.QUEUED).update(
        pending_reason_code=str(core.PendingReason.INSUFFICIENT_CAPACITY),
        pending_message="The devices chosen for this job were taken a moment ago; it is tried again next cycle.",
    )


def persist_plan(
    plan: core.Plan,
    *,
    now: datetime | None = None,
    stored_explanations: Mapping[int, StoredExplanation] | None = None,
    holds_stored: bool = True,
) -> PersistOutcome:
    """Write ``plan``: allocations and ``workload.start`` for each place that still fits, ``workload.stop`` for
    each preemption, pending reasons for the rest (only those that changed; ``stored_explanations`` is what
    the snapshot read, so they need not be read again). ``holds_stored=False`` says the snapshot found no
    stored hold (read under the cycle lock, which every writer of holds holds): a plan without holds then
    writes none. Runs in one transaction (the caller's, or its own)."""
    now = now or timezone.now()
    outcome = PersistOutcome()
    # No savepoint inside the cycle's transaction: a failure here fails the whole cycle anyway.
    with transaction.atomic(savepoint=False):
        explained = _changed_explanations(plan.explanations, stored=stored_explanations)
        batch = _Batch(plan, also_lock=[row[0] for row in explained])
        for preempt in plan.preemptions:
            _preempt(preempt, batch=batch, outcome=outcome)
        accepted = []
        for place in plan.places:
            try:
                accepted.append(_check_place(place, batch=batch, now=now))
            except PlaceRejected as exc:
                logger.info("place of job %s skipped: %s", place.job_id, exc)
                _skipped(place.job_id, str(exc), outcome=outcome)
        accepted = _reserve_ports(accepted, now=now, outcome=outcome)
        starts = []
        # Only a job placed before (preempted, requeued; a service scaling up) can have a log: its output comes
        # from the nodes of its allocations. Read before the writes set this placement's admitted_at.
        placed_before = {write.job.pk for write in accepted if write.scaling or write.job.admitted_at is not None}
        written = _write_places(accepted, now=now, outcome=outcome)
        # A job that ran before continues its log where the last run ended.
        log_ends = job_log_ends(job_ids=[write.job.pk for write in written if write.job.pk in placed_before])
        for write in written:
            replica_devices: dict[int, list[tuple[int, str, int, int]]] = defaultdict(list)
            replica_node: dict[int, int] = {}
            for row in write.allocations:
                device = batch.by_pk[row.device_id]
                replica_devices[row.replica].append((device.index, device.uuid, row.millis, row.memory_mib))
                replica_node[row.replica] = row.node_id  # a replica's devices are all on one node
            for replica in sorted(replica_devices):
                message = outbox.workload_start_frame(
                    job=write.job,
                    replica=replica,
                    devices=replica_devices[replica],
                    log_offset=log_ends.get((write.job.pk, replica), 0),
                    layout=write.layout,
                )
                starts.append((replica_node[replica], write.job, message))
            outcome.placed.append(write.job.pk)
        outbox.commands_bulk_create(starts)
        if any((write.job.spec or {}).get("ports") for write in written):
            transaction.on_commit(serving.serving_sync)  # new replicas join their endpoints once ready
        if holds_stored or plan.holds:
            _holds_replace(plan.holds, now=now)
        outcome.explained = _write_explanations(explained)
    return outcome
