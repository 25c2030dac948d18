"""Reads for jobs, nodes, devices and flavors: querysets already limited to what the caller may see.

A job outside the caller's tenants is *missing* to them: ``job_get_visible`` raises the same
``NotFoundError`` for "does not exist" and "not yours", so the API answers 404 and leaks nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Exists, OuterRef, Prefetch, QuerySet, Value

from portal.api import NotFoundError
from scheduler import access
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
        return "Waiting for approval by an administrator."
    if job.state not in (JobState.QUEUED, JobState.PENDING_APPROVAL):
        return ""
    message = job.pending_message or "Queued; the scheduler looks at it within a few seconds."
    # The engine's messages usually say the position already ("... (position 3 in the queue, ...)").
    if job.position_in_tenant and job.position_overall and "position" not in message.lower():
        message = (
            f"{message.rstrip('.')}. Position {job.position_in_tenant} in your tenant's queue, "
            f"{job.position_overall} overall."
        )
    return message
