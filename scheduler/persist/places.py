"""Each place of a plan checked in memory against the locked rows (``place_check``), and what an accepted
place writes (``PlaceWrite``); nothing here writes to the database. See ``scheduler.persist``."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from scheduler import launch
from scheduler.core import sentences
from scheduler.core import types as core
from scheduler.core.sentences import say
from scheduler.fleet.models import DeviceHealth, NodeStatus
from scheduler.models import MILLIS_PER_DEVICE, Allocation, InferenceReservation, Job, JobKind, JobState
from scheduler.persist.batch import DeviceRow, PlanBatch, plan_job_id

M = TypeVar("M", Allocation, InferenceReservation)

logger = logging.getLogger("scheduler.persist")


class PlaceRejected(Exception):
    """The place no longer fits (or never did); the job stays queued."""


def card_row(model: type[M], *, job: Any, replica: int, flavor: Any, device: Any, **fields: Any) -> M:
    """A row holding part of one card for one replica of ``job`` (an ``Allocation`` of a placement, or an
    ``InferenceReservation`` of a service's reserved cards): the same job, tenant, flavor, device and node
    fields, and whatever else the model keeps (``fields``)."""
    return model(
        job=job,
        replica=replica,
        tenant_id=job.tenant_id,
        flavor=flavor,
        device_id=device.pk,
        node_id=device.node_id,
        **fields,
    )


def _memory_taken(device: DeviceRow, assignment: core.Assignment) -> int:
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
class PlaceWrite:
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


def place_check(place: core.Place, *, batch: PlanBatch, now: datetime) -> PlaceWrite:
    """Check ``place`` against the locked rows and build what it writes; raises PlaceRejected. Changes nothing
    (``_accept`` counts an accepted place's usage)."""
    job = batch.jobs.get(plan_job_id(place.job_id))
    # A job an earlier place of this plan took counts as admitted (its transition is written with the rest).
    state = (JobState.ADMITTED if job.pk in batch.placed else job.state) if job is not None else None
    scaling = job is not None and job.kind == JobKind.INFERENCE and state in (JobState.ADMITTED, JobState.RUNNING)
    if job is None or (state != JobState.QUEUED and not scaling):
        raise PlaceRejected(f"job is {state if job else 'gone'}, not queued")
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
            service = plan_job_id(assignment.reservation_of) if assignment.reservation_of else None
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
                card_row(
                    Allocation,
                    job=job,
                    replica=replica,
                    flavor=flavor,
                    device=device,
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
        message = say(sentences.REPLICAS_PLACED, replicas=", ".join(map(str, new)), nodes=", ".join(nodes))
        details = {**details, "replicas": new}
        batch.running[job.pk].update(new)
    else:
        message = say(sentences.PLACED, nodes=", ".join(nodes))
        batch.placed.add(job.pk)  # a second place of the same job in this plan is refused
    return PlaceWrite(
        job=job,
        scaling=scaling,
        allocations=rows,
        consumed=consumed,
        reserved=_reserve(place, job=job, batch=batch),
        event_message=message,
        details=details,
    )


def _own_reservation_row(
    batch: PlanBatch, device: DeviceRow, job: Job, millis: int, taken: list[InferenceReservation]
) -> InferenceReservation:
    """The reservation row of ``job`` on ``device`` its new replica takes over; no borrower may be on it."""
    if batch.lent[(device.pk, job.pk)][0] > 0:
        raise PlaceRejected(f"work borrowing the reservation on device {device.uuid} has not stopped yet")
    for reservation in batch.reserved.get((device.pk, job.pk), []):
        if reservation not in taken and reservation.millis == min(millis, MILLIS_PER_DEVICE):
            return reservation
    raise PlaceRejected(f"job {job.pk} has no {millis}-millis reservation on device {device.uuid}")


def _reserve(place: core.Place, *, job: Job, batch: PlanBatch) -> list[InferenceReservation]:
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
                card_row(
                    InferenceReservation,
                    job=job,
                    replica=replica,
                    flavor=flavor,
                    device=device,
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
