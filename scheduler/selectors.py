"""Reads for jobs, nodes, devices and flavors: querysets already limited to what the caller may see.

A job outside the caller's tenants is *missing* to them: ``job_get_visible`` raises the same
``NotFoundError`` for "does not exist" and "not yours", so the API answers 404 and leaks nothing.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Prefetch, QuerySet, Value
from django.utils import timezone
from django.utils.translation import gettext, ngettext

from portal.api import NotFoundError
from scheduler import access
from scheduler.message_text import localize
from scheduler.models import Allocation, Device, Job, JobEvent, JobState, Node, ResourceFlavor


def jobs_visible_to(user: Any) -> QuerySet[Job]:
    queryset = Job.objects.select_related("tenant", "submitter")
    if access.sees_all_tenants(user):
        return queryset.all()
    return queryset.filter(tenant__in=access.visible_tenant_ids(user))


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
        raise NotFoundError(f"No job with id {pk} is visible to you.") from None


def job_array_get_visible(*, user: Any, array_id: Any) -> uuid.UUID:
    """The id of an array ``user`` can see (any of its jobs visible); the same 404 for missing and not yours."""
    try:
        value = uuid.UUID(str(array_id))
    except ValueError:
        value = None
    if value is None or not jobs_visible_to(user).filter(array_id=value).exists():
        raise NotFoundError(f"No job array {array_id} is visible to you.")
    return value


def nodes_visible_to(user: Any) -> QuerySet[Node]:
    """Every signed-in user sees the nodes (capacity is shared); only admins change them."""
    return Node.objects.select_related("agent").prefetch_related("devices")


def devices_visible_to(user: Any) -> QuerySet[Device]:
    """Every signed-in user sees the cards (model, flavor, health: capacity is shared), each annotated with
    ``uuid_visible``: platform roles see every UUID; a tenant user only the UUIDs of cards their tenants' jobs
    hold now. A card's UUID is the name a node agent uses for it, so the fleet's list is not handed to tenants
    (a stolen node credential once claimed another node's card by its UUID read here)."""
    queryset = Device.objects.select_related("node", "flavor")
    if access.sees_all_tenants(user):
        return queryset.annotate(uuid_visible=Value(True))
    held = Allocation.objects.active().filter(device=OuterRef("pk"), tenant__in=access.visible_tenant_ids(user))
    return queryset.annotate(uuid_visible=Exists(held))


def flavors_visible_to(user: Any) -> QuerySet[ResourceFlavor]:
    return ResourceFlavor.objects.all()


def node_get(*, pk: Any) -> Node:
    try:
        return Node.objects.get(pk=int(pk))
    except (Node.DoesNotExist, TypeError, ValueError):
        raise NotFoundError(f"No node with id {pk}.") from None


def job_pending_sentence(job: Job) -> str:
    """Why the job waits, in one sentence for its owner ('' once it left the queue)."""
    if job.state == JobState.PENDING_APPROVAL and not job.pending_message:
        return gettext("Waiting for approval by an administrator.")
    if job.state not in (JobState.QUEUED, JobState.PENDING_APPROVAL):
        return ""
    stored = job.pending_message or "Queued; the scheduler looks at it within a few seconds."
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

    from scheduler.fleet.telemetry import latest_store

    if not node_ids:
        return {}
    try:
        return latest_store().get_nodes(sorted(node_ids))
    except (OSError, redis.RedisError):
        return {}
