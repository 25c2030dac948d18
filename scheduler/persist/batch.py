"""The rows a plan touches, locked once up front and read as values (``PlanBatch``); see ``scheduler.persist``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Sum

from catalog.models import ResourceFlavor
from kernel.db.bulk import AnyOf
from scheduler.core import types as core
from scheduler.fleet.models import Device, Node
from scheduler.models import Allocation, InferenceReservation, Job, JobKind, JobState
from scheduler.snapshot import CompiledQuery
from tenants.models import Tenant


def plan_job_id(text: str) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class DeviceRow:
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


class PlanBatch:
    """The rows every preemption and place of a plan touches, locked once up front: the jobs, then the devices,
    then the devices' reservations (each in pk order, so concurrent writers never deadlock), with the devices'
    active usage summed once. The locks hold until commit, so the usage kept here stays true: any other insert
    onto these devices waits for them (the PostgreSQL trigger locks the device row too), and ending
    allocations only frees capacity."""

    def __init__(self, plan: core.Plan, *, also_lock: Sequence[int] = ()) -> None:
        """``also_lock``: more job pks to lock in the same pk-ordered pass (the jobs whose explanation changes)."""
        wanted = {pk for place in plan.places if (pk := plan_job_id(place.job_id)) is not None} | {
            pk for preempt in plan.preemptions if (pk := plan_job_id(preempt.job_id)) is not None
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
        self.devices: dict[str, DeviceRow] = {
            uuid: DeviceRow(pk, uuid, index, node_id, *nodes[node_id], health, flavor_id, memory_mib)
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
        #: The jobs a place of this plan has taken: a second place of the same job is refused.
        self.placed: set[int] = set()
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


# The batch's reads and locks (see ``PlanBatch``), each compiled once; each argument is a list of values.
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
