"""Reads for jobs, nodes, devices and flavors: querysets already limited to what the caller may see.

A job outside the caller's tenants is *missing* to them: ``job_get_visible`` raises the same
``NotFoundError`` for "does not exist" and "not yours", so the API answers 404 and leaks nothing.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Prefetch, QuerySet, Value, Window
from django.db.models.expressions import OrderBy
from django.db.models.functions import RowNumber
from django.utils import timezone
from django.utils.translation import gettext, ngettext

from catalog.models import ResourceFlavor
from kernel.access_rules import Action
from kernel.api import NotFoundError
from scheduler import messages as scheduler_messages
from scheduler.core import sentences
from scheduler.core.types import Ordering
from scheduler.fleet import telemetry
from scheduler.fleet.models import Device, Node
from scheduler.message_text import localize
from scheduler.models import PENDING_JOB_STATES, Allocation, Job, JobArray, JobEvent, JobState
from scheduler.scheduling_policy import policy_from_settings
from scheduler.transitions import ranges_text
from tenants.access import reaches_all, restrict
from tenants.models import Tenant


def jobs_visible_to(user: Any) -> QuerySet[Job]:
    """The jobs ``user`` may read (policy action ``job.view``): every job for the system admin and the auditor,
    the jobs of their subtrees for tenant roles, none for the security admin."""
    return restrict(Job.objects.select_related("tenant", "submitter"), user, Action.JOB_VIEW)


def job_get_visible(*, user: Any, pk: Any) -> Job:
    try:
        return (
            jobs_visible_to(user)
            .prefetch_related(
                Prefetch("events", queryset=JobEvent.objects.select_related("actor")),
                Prefetch("allocations", queryset=Allocation.objects.select_related("device", "node", "flavor")),
            )
            .get(pk=int(pk))
        )
    except (Job.DoesNotExist, TypeError, ValueError):
        raise NotFoundError(scheduler_messages.NO_JOB_ID_VISIBLE_YOU(pk=pk)) from None


def job_array_get_visible(*, user: Any, array_id: Any) -> uuid.UUID:
    """The id of an array ``user`` can see (any of its jobs visible); the same 404 for missing and not yours."""
    try:
        value = uuid.UUID(str(array_id))
    except ValueError:
        value = None
    if value is None or not jobs_visible_to(user).filter(array_id=value).exists():
        raise NotFoundError(scheduler_messages.NO_JOB_ARRAY_VISIBLE_YOU(pk=array_id))
    return value


def job_array_record_visible(*, user: Any, array_id: Any) -> JobArray:
    """The record of an array ``user`` can see (its task 0 visible); the same 404 for missing and not yours."""
    try:
        value = uuid.UUID(str(array_id))
    except ValueError:
        value = None
    array = JobArray.objects.filter(pk=value).first() if value is not None else None
    if array is None or not jobs_visible_to(user).filter(pk=array.head_id).exists():
        raise NotFoundError(scheduler_messages.NO_JOB_ARRAY_VISIBLE_YOU(pk=array_id))
    return array


# --- arrays ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayState:
    """An array as its owner sees it: every task counted by state, rows or not (the answer to a submit, and
    ``array_state``)."""

    array_id: uuid.UUID
    tenant_slug: str
    name: str
    count: int
    first_job_id: int
    states: dict[str, int]
    waiting_ranges: str  # the indices that are not rows yet, Slurm's notation ("64-9999")
    submitted_at: datetime
    state: str = JobState.QUEUED  # the state every task entered at submit


def array_state(array: JobArray) -> ArrayState:
    """``array``'s tasks by state: the rows' states, plus its waiting tasks as queued and the tasks cancelled
    before they were rows as cancelled."""
    states: dict[str, int] = defaultdict(int)
    for state, n in Job.objects.filter(array_id=array.array_id).order_by().values_list("state").annotate(n=Count("pk")):
        states[state] += n
    if array.waiting:
        states[JobState.QUEUED] += array.waiting
    if array.cancelled_unmaterialized:
        states[JobState.CANCELLED] += array.cancelled_unmaterialized
    head = Job.objects.select_related("tenant").get(pk=array.head_id)
    return ArrayState(
        array_id=array.array_id,
        tenant_slug=head.tenant.slug,
        name=head.name,
        count=array.count,
        first_job_id=head.pk,
        states=dict(sorted(states.items())),
        waiting_ranges=ranges_text(array.unmaterialized),
        submitted_at=array.created_at,
    )


def job_array_summary(job: Job) -> ArrayState | None:
    """The array ``job`` is a task of, every task counted (None for a job of no array, or of an array submitted
    before arrays were one record)."""
    if job.array_id is None:
        return None
    array = JobArray.objects.filter(pk=job.array_id).first()
    return array_state(array) if array is not None else None


def job_queue_rows(user: Any) -> QuerySet[Job]:
    """The jobs ``user`` sees, with what a queue view shows beside each: ``queue_allocations`` (the job's
    allocations with their nodes, oldest first) in one prefetch query for the whole page."""
    allocations = Allocation.objects.select_related("node").order_by("started_at", "replica", "pk")
    return jobs_visible_to(user).prefetch_related(Prefetch("allocations", allocations, to_attr="queue_allocations"))


def queue_order() -> list[OrderBy]:
    """The order the scheduler serves pending jobs in, as far as the database knows it.

    The engine's order (``scheduler.core.order``: priority class, aged gangs, guarantees, fair share, submit
    time) depends on live usage and cannot be written in SQL; each cycle stores where it put every pending job
    (``position_overall``). So: that stored order, with the gaps closed by jobs that left the queue since, and
    jobs no cycle has looked at yet (submitted in the last seconds) after the others of their priority class,
    by submit time. Under the FIFO policy priority does not come first."""
    keys = [F("position_overall").asc(nulls_last=True), F("submitted_at").asc(), F("id").asc()]
    if policy_from_settings().ordering == Ordering.PRIORITY_FAIRSHARE:
        keys.insert(0, F("priority_class").desc())
    return keys


@dataclass(frozen=True, slots=True)
class QueuePosition:
    overall: int  # 1-based place among all pending jobs
    in_tenant: int  # 1-based place among the pending jobs of the same tenant


def queue_positions() -> dict[int, QueuePosition]:
    """Every pending job's place in the queue (job id → position), in one query (two window functions).

    Positions count every tenant's pending jobs, as the engine does (the API shows the same figure in
    ``position_overall``); a caller shows only the rows of jobs its user may see."""
    order = queue_order()
    rows = (
        Job.objects.filter(state__in=PENDING_JOB_STATES)
        .annotate(
            overall=Window(RowNumber(), order_by=order),
            in_tenant=Window(RowNumber(), partition_by=[F("tenant_id")], order_by=order),
        )
        .values_list("pk", "overall", "in_tenant")
    )
    return {pk: QueuePosition(overall=overall, in_tenant=in_tenant) for pk, overall, in_tenant in rows}


def nodes_visible_to(user: Any) -> QuerySet[Node]:
    """Every signed-in user sees the nodes (capacity is shared); only admins change them."""
    return Node.objects.select_related("agent").prefetch_related("devices")


def devices_visible_to(user: Any) -> QuerySet[Device]:
    """Every signed-in user sees the cards (model, flavor, health: capacity is shared), each annotated with
    ``uuid_visible``: platform roles see every UUID; a tenant user only the UUIDs of cards their tenants' jobs
    hold now. A card's UUID is the name a node agent uses for it, so the fleet's list is not handed to tenants
    (a stolen node credential once claimed another node's card by its UUID read here)."""
    queryset = Device.objects.select_related("node", "flavor")
    if reaches_all(user, Action.DEVICE_IDENTIFY):
        return queryset.annotate(uuid_visible=Value(True))
    tenants = restrict(Tenant.objects.all(), user, Action.DEVICE_IDENTIFY).values("pk")
    held = Allocation.objects.active().filter(device=OuterRef("pk"), tenant__in=tenants)
    return queryset.annotate(uuid_visible=Exists(held))


def flavors_visible_to(user: Any) -> QuerySet[ResourceFlavor]:
    return ResourceFlavor.objects.all()


def node_get(*, pk: Any) -> Node:
    try:
        return Node.objects.get(pk=int(pk))
    except (Node.DoesNotExist, TypeError, ValueError):
        raise NotFoundError(scheduler_messages.NO_NODE_ID(pk=pk)) from None


def job_pending_sentence(job: Job) -> str:
    """Why the job waits, in one sentence for its owner ('' once it left the queue)."""
    if job.state == JobState.PENDING_APPROVAL and not job.pending_message:
        return gettext(sentences.JOB_WAITS_FOR_APPROVAL)
    if job.state not in (JobState.QUEUED, JobState.PENDING_APPROVAL):
        return ""
    stored = job.pending_message or sentences.QUEUED_SCHEDULER_LOOKS_WITHIN
    message = localize(stored)
    # The engine's messages usually say the position already ("... (position 3 in the queue, ...)").
    if job.position_in_tenant and job.position_overall and "position" not in stored.lower():
        message = gettext("%(message)s. Position %(mine)s in your tenant's queue, %(overall)s overall.") % {
            "message": message.rstrip(".。"),
            "mine": job.position_in_tenant,
            "overall": job.position_overall,
        }
    expected = job_start_estimate_sentence(job)
    return f"{message.rstrip()} {expected}" if expected else message


def job_start_estimate_sentence(job: Job, *, now: datetime | None = None) -> str:
    """When a queued job is expected to start, in words ("Expected to start in about 40 min (likely between
    25 min and 1 h 10 min from now)."); '' when it has no estimate (``scheduler.eta``)."""
    if job.state != JobState.QUEUED or job.estimated_start_at is None:
        return ""
    now = now or timezone.now()
    wait_s = (job.estimated_start_at - now).total_seconds()
    if wait_s < -60:
        return gettext("Expected to start soon (later than estimated).")
    if wait_s < 60:
        return gettext("Expected to start within a minute.")
    about = duration_words(wait_s)
    if job.estimated_start_p90_at is None:
        return gettext("Expected to start in about %(about)s, possibly much later.") % {"about": about}
    early_s = (job.estimated_start_p10_at - now).total_seconds() if job.estimated_start_p10_at else wait_s
    early = duration_words(early_s) if early_s >= 60 else gettext("now")
    late = duration_words((job.estimated_start_p90_at - now).total_seconds())
    if early == late:
        return gettext("Expected to start in about %(about)s.") % {"about": about}
    return gettext("Expected to start in about %(about)s (likely between %(early)s and %(late)s from now).") % {
        "about": about,
        "early": early,
        "late": late,
    }


def job_start_estimate_words(job: Job, *, now: datetime | None = None) -> str:
    """A queued job's expected start as a short phrase for a table ("in about 40 min"); '' without one."""
    if job.state != JobState.QUEUED or job.estimated_start_at is None:
        return ""
    wait_s = (job.estimated_start_at - (now or timezone.now())).total_seconds()
    if wait_s < 60:
        return gettext("soon")
    return gettext("in about %(about)s") % {"about": duration_words(wait_s)}


def duration_words(seconds: float) -> str:
    """A wait, rounded the way a person says it: '7 min', '40 min', '1 h 20 min', '14 h', '3 days'."""
    minutes = max(1, round(seconds / 60))
    if minutes < 10:
        return gettext("%(n)d min") % {"n": minutes}
    if minutes < 60:
        return gettext("%(n)d min") % {"n": round(minutes / 5) * 5}
    if minutes < 10 * 60:
        tens = round(minutes / 10) * 10
        hours, rest = divmod(tens, 60)
        if rest == 0:
            return gettext("%(n)d h") % {"n": hours}
        return gettext("%(h)d h %(m)d min") % {"h": hours, "m": rest}
    if minutes < 48 * 60:
        return gettext("%(n)d h") % {"n": round(minutes / 60)}
    days = round(minutes / 1440)
    return ngettext("%(n)d day", "%(n)d days", days) % {"n": days}


def latest_telemetry(node_ids: set[int]) -> dict[int, dict[str, dict]]:
    """The latest per-card values of ``node_ids`` (node id → uuid → values); empty when the store is down:
    live figures are a nicety beside the inventory, which still answers."""
    import redis

    if not node_ids:
        return {}
    try:
        return telemetry.latest_store().get_nodes(sorted(node_ids))
    except (OSError, redis.RedisError):
        return {}
