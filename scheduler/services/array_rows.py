"""The scheduling cycle's side of job arrays (``scheduler.models.JobArray``): before each cycle, the waiting tasks
each array may need now become job rows — as many as the pool's free cards could take of its shape, at least
``GPUPOOL_ARRAY_WINDOW`` — so the engine sees an array as a bounded group of identical jobs, not as all its tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum

from catalog.models import ResourceFlavor
from scheduler.core.types import MILLIS_PER_DEVICE
from scheduler.fleet.models import Device, DeviceHealth, NodeStatus
from scheduler.models import Allocation, Job, JobArray, JobState
from scheduler.transitions import array_tasks_materialize, ranges_first

#: Tasks of an array kept as queued rows at least (``GPUPOOL_ARRAY_WINDOW``), whatever the free capacity: enough
#: for the engine to preempt for the array, and to explain and estimate its next tasks.
DEFAULT_ARRAY_WINDOW = 64


def _free_millis_by_flavor() -> dict[int, int]:
    """Millis free per flavor id on ready nodes' healthy cards: an estimate of what a cycle could place (it sizes
    a window of rows, it decides nothing)."""
    cards = (
        Device.objects.filter(node__status=NodeStatus.READY, health=DeviceHealth.HEALTHY, flavor__isnull=False)
        .order_by()
        .values_list("flavor_id")
        .annotate(n=Count("pk"))
    )
    held = Allocation.objects.active().order_by().values_list("flavor_id").annotate(millis=Sum("millis"))
    free = {flavor_id: n * MILLIS_PER_DEVICE for flavor_id, n in cards}
    for flavor_id, millis in held:
        if flavor_id in free:
            free[flavor_id] -= millis or 0
    return free


@dataclass(frozen=True)
class TopUp:
    rows_made: int = 0
    arrays_waiting: int = 0  # arrays that still had tasks that are not rows (before this top-up)


def array_tasks_top_up(*, window: int | None = None) -> TopUp:
    """Before a cycle (inside its transaction, under the cycle lock): make job rows of the waiting tasks each array
    may need now. Per array, in submit order: enough queued rows for the free cards of its flavors to take, at least
    ``window`` (``GPUPOOL_ARRAY_WINDOW``), never more than it has waiting. Earlier arrays take the free cards
    first. Says how many rows were made (none, and one indexed query, when no array waits)."""
    with connection.cursor() as cursor:  # the usual case, no array waiting: one statement, no ORM compile
        cursor.execute(f"SELECT 1 FROM {JobArray._meta.db_table} WHERE waiting > 0 LIMIT 1")
        if cursor.fetchone() is None:
            return TopUp()
    arrays = list(JobArray.objects.select_for_update(no_key=True).filter(waiting__gt=0).order_by("created_at"))
    if not arrays:
        return TopUp()
    window = int(getattr(settings, "GPUPOOL_ARRAY_WINDOW", DEFAULT_ARRAY_WINDOW)) if window is None else window
    ids = [array.array_id for array in arrays]
    queued = dict(
        Job.objects.filter(array_id__in=ids, state=JobState.QUEUED)
        .order_by()
        .values_list("array_id")
        .annotate(n=Count("pk"))
    )
    heads = {
        row[0]: row[1:]
        for row in Job.objects.filter(pk__in=[a.head_id for a in arrays]).values_list(
            "pk", "flavors", "millis_per_replica", "replicas"
        )
    }
    flavor_ids = _flavor_ids({name for flavors, _m, _r in heads.values() for name in flavors or []})
    free = _free_millis_by_flavor()
    made = 0
    for array in arrays:
        flavors, millis, replicas = heads[array.head_id]
        size = max(1, millis * replicas)
        fits = max((free.get(flavor_ids.get(name), 0) // size for name in flavors or []), default=0)
        want = max(window, fits) - queued.get(array.array_id, 0)
        if want <= 0:
            continue
        indices = ranges_first(array.unmaterialized, min(want, array.waiting))
        made += len(array_tasks_materialize(array=array, indices=indices, message=""))
        taken = min(fits, len(indices)) * size
        for name in flavors or []:  # the next array sees the cards this one's rows may take
            flavor_id = flavor_ids.get(name)
            if flavor_id in free:
                used = min(free[flavor_id], taken)
                free[flavor_id] -= used
                taken -= used
    return TopUp(rows_made=made, arrays_waiting=len(arrays))


def _flavor_ids(names: set[str]) -> dict[str, int]:
    return dict(ResourceFlavor.objects.filter(name__in=names).values_list("name", "pk")) if names else {}
