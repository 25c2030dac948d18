"""Submitting one job (tenant, admission, rows, events), cancelling it, and releasing or rejecting it when its
admission request is decided.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from audit.services import audit_record
from portal.api import ConflictError, DomainError, NotFoundError, PermissionDeniedError
from portal.policy import Action, principals_for
from scheduler import outbox
from scheduler.jobspec import JobSpec, JobSpecError, check_checkpoint_dir, check_flavors, validate_job_spec
from scheduler.models import FINAL_JOB_STATES, Allocation, Job, JobEvent, PriorityClass, ResourceFlavor
from scheduler.services.cycle import request_cycle
from scheduler.services.transitions import S, _end_allocations, _lock_job, job_transition
from tenants.permissions import can_manage_job
from tenants.policy import reaches_all

# --- submit, cancel, approval -------------------------------------------------------------------------


def _resolve_tenant(*, actor: Any | None, slug: str | None, flavors: Sequence[str] = ()):
    """The tenant a job goes to, checked in one query: the tenant (``slug``, or else the actor's only tenant
    where they may submit) with its ancestors loaded on it (the approval threshold walks them), whether
    ``actor`` holds a role on it or above it, and whether each of ``flavors`` exists.

    Refuses, in this order: an unknown flavor (``JobSpecError``, a spec error like any other), a tenant the
    actor cannot see (``NotFoundError``, the same as a missing one), a tenant where they may not submit.
    """
    from tenants.models import MAX_TENANT_DEPTH, Membership, MembershipRole, Tenant

    # ``actor`` None is the system itself; any other actor must be a signed-in, active account (an anonymous
    # user sees no tenant at all, as in ``tenants.selectors.tenants_visible_to``).
    user = actor
    if user is not None and not (getattr(user, "is_authenticated", False) and user.is_active and user.pk):
        raise NotFoundError(f"No tenant {slug!r} is visible to you.", code="not_found")
    # "parent", "parent__parent", ...: every ancestor a tenant can have (the tree is at most MAX_TENANT_DEPTH deep).
    ancestor_paths = ["__".join(["parent"] * level) for level in range(1, MAX_TENANT_DEPTH)]
    queryset = Tenant.objects.select_related(ancestor_paths[-1])
    annotations: dict[str, Any] = {
        f"flavor_{position}_exists": Exists(ResourceFlavor.objects.filter(name=name))
        for position, name in enumerate(flavors)
    }
    # The tenant roles the access policy lets submit (job.submit), read from the table.
    submit_roles = [role for role in principals_for(Action.JOB_SUBMIT) if role in MembershipRole.values]
    if user is not None:
        on_chain = Q(tenant=OuterRef("pk"))
        for path in ancestor_paths:
            on_chain |= Q(tenant=OuterRef(path))
        roles = Membership.objects.filter(on_chain, user=user)
        annotations["holds_role"] = Exists(roles)
        annotations["may_submit"] = Exists(roles.filter(role__in=submit_roles))
    if slug is None:
        if user is None:
            raise DomainError("tenant: say which tenant the job belongs to.", code="invalid_job_spec", field="tenant")
        queryset = queryset.filter(memberships__user=user, memberships__role__in=submit_roles)
    else:
        queryset = queryset.filter(slug=slug)
    rows = list(queryset.annotate(**annotations)[:2])

    if flavors and not (rows and all(getattr(rows[0], name) for name in annotations if name.startswith("flavor_"))):
        # Only a refused spec pays for this second read: the message lists the flavors that exist.
        check_flavors(flavors, set(ResourceFlavor.objects.values_list("name", flat=True)))
    if slug is None:
        if len(rows) != 1:
            raise DomainError(
                'tenant: you belong to several tenants (or none that may submit); name one with "tenant": "<slug>".',
                code="invalid_job_spec",
                field="tenant",
            )
        return rows[0]
    tenant = rows[0] if rows else None
    if user is None:
        if tenant is None:
            raise NotFoundError(f"No tenant {slug!r} is visible to you.", code="not_found")
        return tenant
    if tenant is None or not (tenant.holds_role or reaches_all(user, Action.TENANT_VIEW)):
        raise NotFoundError(f"No tenant {slug!r} is visible to you.", code="not_found")
    if not tenant.may_submit:
        raise PermissionDeniedError(
            f"You may not submit jobs to {slug}: members and tenant admins may; ask a tenant admin for the member role."
        )
    return tenant


APPROVAL_MESSAGE = "Waiting for approval by an administrator."


def _admission(*, tenant: Any, parsed: JobSpec) -> tuple[str, str, str]:
    """(state, reason, message) a new job enters with: ``pending_approval`` when the tenants app's rule asks
    for an approval (priority critical, or larger than the tenant's threshold), else ``queued``."""
    from tenants.services.admissions import job_admission_needs_approval

    if job_admission_needs_approval(
        tenant=tenant,
        total_millis=parsed.total_millis,
        critical=parsed.priority_class >= PriorityClass.CRITICAL,
    ):
        return S.PENDING_APPROVAL, "approval_required", APPROVAL_MESSAGE
    return S.QUEUED, "submitted", ""


def _new_job(
    *,
    parsed: JobSpec,
    tenant: Any,
    submitter: Any | None,
    state: str,
    message: str,
    now: datetime,
    env: dict[str, str] | None = None,
    array_id: uuid.UUID | None = None,
    array_index: int | None = None,
) -> Job:
    """An unsaved job as ``parsed`` describes it, already in its first state after ``submitted``."""
    return Job(
        tenant=tenant,
        submitter=submitter,
        name=parsed.name,
        kind=parsed.kind,
        priority_class=parsed.priority_class,
        preemptible=parsed.preemptible,
        replicas=parsed.replicas,
        min_replicas=parsed.min_replicas,
        max_replicas=parsed.max_replicas,
        flavors=list(parsed.flavors),
        millis_per_replica=parsed.millis_per_replica,
        memory_mib_per_replica=parsed.memory_mib_per_replica,
        cpu_millicores_per_replica=parsed.cpu_millicores_per_replica,
        host_memory_mib_per_replica=parsed.host_memory_mib_per_replica,
        topology=parsed.topology,
        node_selector=parsed.node_selector,
        command=parsed.command,
        env=parsed.env if env is None else env,
        working_dir=parsed.working_dir,
        max_runtime_s=parsed.max_runtime_s,
        checkpoint_dir=parsed.checkpoint_dir,
        runtime_estimate_s=parsed.runtime_estimate_s,
        spec={**parsed.normalised, "tenant": tenant.slug},
        state=state,
        state_message=message,
        queued_at=now if state == S.QUEUED else None,
        array_id=array_id,
        array_index=array_index,
    )


def _submit_events(job: Job, *, reason: str, message: str) -> list[JobEvent]:
    """The history a submit leaves, as if the job had moved ``submitted`` → its state through
    ``job_transition``: the console shows the same two events."""
    return [
        JobEvent(job=job, from_state="", to_state=S.SUBMITTED, reason="submitted", actor=job.submitter, details={}),
        JobEvent(
            job=job,
            from_state=S.SUBMITTED,
            to_state=job.state,
            reason=reason,
            message=message,
            actor=job.submitter,
            details={},
        ),
    ]


def _mark_loaded(job: Job, name: str, rows: list) -> None:
    """Give ``job.<name>`` the rows it has (what ``prefetch_related`` does after its query), so the job just
    created is serialized without reading back what was written."""
    queryset = getattr(job, name).all()
    queryset._result_cache = rows
    queryset._prefetch_done = True
    job.__dict__.setdefault("_prefetched_objects_cache", {})[name] = queryset


@transaction.atomic
def job_submit(*, actor: Any | None, spec: dict, request: Any | None = None, idempotency_key: str = "") -> Job:
    """Validate ``spec``, create the job and queue it (or hold it for approval). ``actor`` None = system.
    ``idempotency_key`` is stored on the job (``scheduler.idempotency`` answers a retried submit with it).

    The hot path of admission, a handful of statements in all: one query resolves the tenant, the actor's
    role and the flavors; the job is inserted already ``queued`` (or ``pending_approval``) with its two
    events in one insert; one audit record ``job.submit`` says the state it entered. The job returned has its
    events and (no) allocations loaded, ready to serialize.
    """
    parsed = validate_job_spec(spec, check_flavor_names=False)
    if parsed.array_count is not None:
        raise JobSpecError(
            'array: submit job arrays through POST /api/v1/jobs/; here remove "array" to submit one job.', field="array"
        )
    tenant = _resolve_tenant(actor=actor, slug=parsed.tenant_slug, flavors=parsed.flavors)
    check_checkpoint_dir(parsed.checkpoint_dir, tenant_slug=tenant.slug)
    state, reason, message = _admission(tenant=tenant, parsed=parsed)
    submitter = actor if getattr(actor, "pk", None) else None
    job = _new_job(parsed=parsed, tenant=tenant, submitter=submitter, state=state, message=message, now=timezone.now())
    job.idempotency_key = idempotency_key
    job.save(force_insert=True)
    events = JobEvent.objects.bulk_create(_submit_events(job, reason=reason, message=message))
    audit_record(
        action="job.submit",
        actor=actor,
        tenant=tenant,
        target=f"job:{job.pk}",
        details={"after": {**job.spec, "state": state}, "reason": reason},
        request=request,
    )
    if state == S.PENDING_APPROVAL:
        from tenants.services.admissions import job_admission_request_create

        job_admission_request_create(job=job, actor=actor)
    transaction.on_commit(request_cycle)
    _mark_loaded(job, "events", events)
    _mark_loaded(job, "allocations", [])
    return job


@transaction.atomic
def job_cancel(*, job: Job, actor: Any | None, reason: str = "", request: Any | None = None) -> Job:
    """Cancel a job in any non-final state: running replicas get ``workload.stop``, allocations end now."""
    job = _lock_job(job)
    if actor is not None and not can_manage_job(actor, job):
        raise PermissionDeniedError("Only the submitter, a tenant admin or a system admin may cancel this job.")
    if job.state in FINAL_JOB_STATES:
        raise ConflictError(f"Job {job.pk} is already {job.state}; there is nothing to cancel.", code="job_finished")
    freed = Allocation.objects.active().filter(job=job).exists()
    outbox.stop_active_replicas(job=job, reason="cancelled")
    _end_allocations(Allocation.objects.filter(job=job))
    job_transition(
        job=job,
        to_state=S.CANCELLED,
        actor=actor,
        reason="cancelled",
        message=reason or "Cancelled.",
        request=request,
    )
    if freed:
        transaction.on_commit(request_cycle)
    return job


@transaction.atomic
def job_release_from_approval(*, job: Job, actor: Any | None) -> Job:
    """An approved job leaves ``pending_approval`` for the queue (called by the tenants approval flow)."""
    job = _lock_job(job)
    if job.state != S.PENDING_APPROVAL:
        raise ConflictError(f"Job {job.pk} is {job.state}, not waiting for approval.", code="invalid_transition")
    job_transition(job=job, to_state=S.QUEUED, actor=actor, reason="approved", message="Approved.")
    transaction.on_commit(request_cycle)
    return job


@transaction.atomic
def job_reject_from_approval(*, job: Job, actor: Any | None, comment: str = "") -> Job:
    """A rejected job fails with the approver's comment (called by the tenants approval flow)."""
    job = _lock_job(job)
    if job.state != S.PENDING_APPROVAL:
        raise ConflictError(f"Job {job.pk} is {job.state}, not waiting for approval.", code="invalid_transition")
    return job_transition(
        job=job, to_state=S.FAILED, actor=actor, reason="rejected", message=f"Rejected: {comment}"[:500]
    )
