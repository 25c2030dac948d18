"""A ``scheduler.core`` Plan → rows, in the caller's transaction, safe against concurrent writers.

The plan was computed from a snapshot that may be stale by the time it is written (another worker, a cancel,
a node going away). So every ``Place`` is re-checked under row locks: the plan's jobs, then the devices its
places touch (``select_for_update`` once, in pk order, so two writers never deadlock), with the active
allocations of those devices summed again inside the transaction and kept up to date as places are written.
A place that no longer fits is skipped and its job stays queued for the next cycle; no device is ever
double-booked. On PostgreSQL the allocation trigger
(migration 0003) is the last line of defence, caught per place by a savepoint.

Inference reservations count as used capacity of their device. An assignment on a reservation
(``reservation_of``) uses the reservation's capacity instead: the service's own replica consumes the
reservation row (it becomes the allocation), a borrower's allocation is marked ``reservation_of`` and must
fit in what the reservation has not lent. ``Place.reserved`` becomes reservation rows. The plan's holds
replace the stored ones (``CapacityHold``) in the same transaction.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from scheduler import outbox
from scheduler.core import types as core
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
    NodeStatus,
    ResourceFlavor,
)
from scheduler.services import job_transition

logger = logging.getLogger(__name__)


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


def _memory_taken(device: Device, assignment: core.Assignment) -> int:
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


class _PlaceBatch:
    """The rows every place of a plan touches, locked once up front: the jobs, then the devices (each in pk
    order, so concurrent writers never deadlock), with the devices' active usage summed once. The locks hold
    until commit, so the usage kept here stays true: any other insert onto these devices waits for them (the
    PostgreSQL trigger locks the device row too), and ending allocations only frees capacity."""

    def __init__(self, places: tuple[core.Place, ...]) -> None:
        job_pks = sorted({pk for place in places if (pk := _job_id(place.job_id)) is not None})
        self.jobs = {
            job.pk: job
            for job in Job.objects.select_for_update(of=("self",))
            .select_related("tenant")
            .filter(pk__in=job_pks)
            .order_by("pk")
        }
        uuids = sorted({a.device_uuid for place in places for a in (*place.assignments, *place.reserved)})
        self.devices = {
            device.uuid: device
            for device in Device.objects.select_for_update(of=("self",))
            .select_related("node")
            .filter(uuid__in=uuids)
            .order_by("pk")
        }
        device_pks = [d.pk for d in self.devices.values()]
        # Per device: what allocations off any reservation and the reservations themselves take.
        self.used: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        # Per (device, service): what borrowers hold of the service's reservation there.
        self.lent: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
        for row in (
            Allocation.objects.active()
            .filter(device_id__in=device_pks)
            .values("device_id", "reservation_of_id")
            .annotate(millis=Sum("millis"), memory=Sum("memory_mib"))
        ):
            if row["reservation_of_id"] is None:
                target = self.used[row["device_id"]]
            else:
                target = self.lent[(row["device_id"], row["reservation_of_id"])]
            target[0] += row["millis"] or 0
            target[1] += row["memory"] or 0
        self.reserved: dict[tuple[int, int], list[InferenceReservation]] = defaultdict(list)
        for reservation in (
            InferenceReservation.objects.select_for_update().filter(device_id__in=device_pks).order_by("pk")
        ):
            self.reserved[(reservation.device_id, reservation.job_id)].append(reservation)
            self.used[reservation.device_id][0] += reservation.millis
            self.used[reservation.device_id][1] += reservation.memory_mib
        self.device_memory = {device.pk: device.memory_mib for device in self.devices.values()}
        self.flavors = {
            flavor.name: flavor for flavor in ResourceFlavor.objects.filter(name__in={p.flavor for p in places})
        }
        self.starts: list[tuple[int, Job, object]] = []


def _place(place: core.Place, *, batch: _PlaceBatch, now: datetime, outcome: PersistOutcome) -> None:
    job = batch.jobs.get(_job_id(place.job_id))
    scaling = job is not None and job.kind == JobKind.INFERENCE and job.state in (JobState.ADMITTED, JobState.RUNNING)
    if job is None or (job.state != JobState.QUEUED and not scaling):
        raise PlaceRejected(f"job is {job.state if job else 'gone'}, not queued")
    running = set(Allocation.objects.active().filter(job=job).values_list("replica", flat=True)) if scaling else set()
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
            if device.node.name != assignment.node:
                raise PlaceRejected(f"device {device.uuid} is on {device.node.name}, not {assignment.node}")
            if device.node.status != NodeStatus.READY:
                raise PlaceRejected(f"node {device.node.name} is {device.node.status}")
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
                    tenant=job.tenant,
                    flavor=flavor,
                    device=device,
                    node=device.node,
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

    for reservation in consumed:  # the service's replica takes over its reserved capacity
        reservation.delete()
    Allocation.objects.bulk_create(rows)
    nodes = sorted({row.node.name for row in rows})
    details = {"devices": uuids, "borrowed_millis": place.borrowed_millis}
    if scaling:
        new = sorted(by_replica)
        JobEvent.objects.create(
            job=job,
            from_state=job.state,
            to_state=job.state,
            reason="scaled_up",
            message=f"Replicas {', '.join(map(str, new))} placed on {', '.join(nodes)}.",
            details={**details, "replicas": new},
        )
    else:
        job_transition(
            job=job,
            to_state=JobState.ADMITTED,
            actor=None,
            reason="placed",
            message=f"Placed on {', '.join(nodes)}.",
            details=details,
        )
    # Only now (nothing above raised) does the batch count the new usage and the commands to send.
    for device_pk, (new_millis, new_memory) in adding.items():
        batch.used[device_pk][0] += new_millis
        batch.used[device_pk][1] += new_memory
    for key, (new_millis, new_memory) in lending.items():
        batch.lent[key][0] += new_millis
        batch.lent[key][1] += new_memory
    for reservation in consumed:
        batch.reserved[(reservation.device_id, job.pk)].remove(reservation)
    _reserve(place, job=job, batch=batch)
    replica_rows: dict[int, list[Allocation]] = defaultdict(list)
    for row in rows:
        replica_rows[row.replica].append(row)
    for replica in sorted(replica_rows):
        message = outbox.workload_start_message(job=job, replica=replica, allocations=replica_rows[replica])
        batch.starts.append((replica_rows[replica][0].node_id, job, message))
    outcome.placed.append(job.pk)


def _own_reservation_row(
    batch: _PlaceBatch, device: Device, job: Job, millis: int, taken: list[InferenceReservation]
) -> InferenceReservation:
    """The reservation row of ``job`` on ``device`` its new replica takes over; no borrower may be on it."""
    if batch.lent[(device.pk, job.pk)][0] > 0:
        raise PlaceRejected(f"work borrowing the reservation on device {device.uuid} has not stopped yet")
    for reservation in batch.reserved.get((device.pk, job.pk), []):
        if reservation not in taken and reservation.millis == min(millis, MILLIS_PER_DEVICE):
            return reservation
    raise PlaceRejected(f"job {job.pk} has no {millis}-millis reservation on device {device.uuid}")


def _reserve(place: core.Place, *, job: Job, batch: _PlaceBatch) -> None:
    """Reservation rows for ``Place.reserved`` (idle replicas up to ``max_replicas``). One that no longer fits
    is left out: the service runs anyway, with less room to scale into."""
    by_replica: dict[int, list[core.Assignment]] = defaultdict(list)
    for assignment in place.reserved:
        by_replica[assignment.replica].append(assignment)
    flavor = batch.flavors[place.flavor]
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
                    tenant=job.tenant,
                    flavor=flavor,
                    device=device,
                    node=device.node,
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
        InferenceReservation.objects.bulk_create(rows)
        for row in rows:
            batch.reserved[(row.device_id, job.pk)].append(row)
        for pk, (m, mem) in adding.items():
            batch.used[pk][0] += m
            batch.used[pk][1] += mem


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


def _preempt(preempt: core.Preempt, *, outcome: PersistOutcome) -> None:
    job = Job.objects.select_for_update().select_related("tenant").filter(pk=_job_id(preempt.job_id)).first()
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


def _explain(explanations: tuple[core.Explain, ...], *, outcome: PersistOutcome) -> None:
    by_pk = {pk: e for e in explanations if (pk := _job_id(e.job_id)) is not None}
    if not by_pk:
        return
    changed = []
    jobs = Job.objects.filter(pk__in=list(by_pk), state__in=[JobState.QUEUED, JobState.PENDING_APPROVAL]).only(
        "pk", "pending_reason_code", "pending_message", "position_in_tenant", "position_overall"
    )
    for job in jobs:
        explain = by_pk[job.pk]
        values = (str(explain.code), explain.message[:500], explain.position_in_tenant, explain.position_overall)
        current = (job.pending_reason_code, job.pending_message, job.position_in_tenant, job.position_overall)
        if values != current:
            job.pending_reason_code, job.pending_message, job.position_in_tenant, job.position_overall = values
            changed.append(job)
    _write_explanations(changed)
    outcome.explained = len(changed)


EXPLAIN_BATCH = 500


def _write_explanations(jobs: list[Job]) -> None:
    """``UPDATE ... FROM`` a VALUES list, in batches: one statement per 500 jobs. (``bulk_update`` builds a CASE
    per column that the database evaluates row by row: quadratic, seconds for a few thousand jobs.)"""
    table = connection.ops.quote_name(Job._meta.db_table)
    for start in range(0, len(jobs), EXPLAIN_BATCH):
        chunk = jobs[start : start + EXPLAIN_BATCH]
        rows = ", ".join(["(%s, %s, %s, %s, %s)"] * len(chunk))
        params: list = []
        for job in chunk:
            params += [
                job.pk,
                job.pending_reason_code,
                job.pending_message,
                job.position_in_tenant,
                job.position_overall,
            ]
        # A CTE names the VALUES columns the same way on PostgreSQL and SQLite (3.33+ has UPDATE ... FROM).
        sql = (
            f"WITH v(id, code, message, in_tenant, overall) AS (VALUES {rows}) "
            f"UPDATE {table} SET pending_reason_code = v.code, pending_message = v.message, "
            "position_in_tenant = CAST(v.in_tenant AS integer), position_overall = CAST(v.overall AS integer) "
            f"FROM v WHERE {table}.id = CAST(v.id AS bigint)"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)


def _skipped(place: core.Place, reason: str, *, outcome: PersistOutcome) -> None:
    outcome.skipped.append({"job_id": place.job_id, "reason": reason})
    Job.objects.filter(pk=_job_id(place.job_id), state=JobState.QUEUED).update(
        pending_reason_code=str(core.PendingReason.INSUFFICIENT_CAPACITY),
        pending_message="The devices chosen for this job were taken a moment ago; it is tried again next cycle.",
    )


def persist_plan(plan: core.Plan, *, now: datetime | None = None) -> PersistOutcome:
    """Write ``plan``: allocations and ``workload.start`` for each place that still fits, ``workload.stop`` for
    each preemption, pending reasons for the rest. Runs in one transaction (the caller's, or its own)."""
    now = now or timezone.now()
    outcome = PersistOutcome()
    with transaction.atomic():
        for preempt in plan.preemptions:
            _preempt(preempt, outcome=outcome)
        batch = _PlaceBatch(plan.places) if plan.places else None
        for place in plan.places:
            try:
                with transaction.atomic():  # a savepoint: a rejected place leaves the others intact
                    _place(place, batch=batch, now=now, outcome=outcome)
            except PlaceRejected as exc:
                logger.info("place of job %s skipped: %s", place.job_id, exc)
                _skipped(place, str(exc), outcome=outcome)
            except IntegrityError as exc:
                # The database refused a double booking the checks above did not see: same outcome.
                logger.warning("place of job %s refused by the database: %s", place.job_id, exc)
                _skipped(place, "refused by the database", outcome=outcome)
        if batch is not None:
            outbox.commands_bulk_create(batch.starts)
        _holds_replace(plan.holds, now=now)
        _explain(plan.explanations, outcome=outcome)
    return outcome
