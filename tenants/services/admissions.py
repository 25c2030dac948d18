"""Job admission: whether a submitted job waits for approval (priority critical, or above the tenant's
size threshold), putting it in the approval inbox, and setting the threshold.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from audit.services import audit_record
from kernel.access_rules import Action
from kernel.api import DomainError
from tenants import messages as tenants_messages
from tenants.access import allows
from tenants.models import ApprovalKind, ApprovalRequest, Tenant, User
from tenants.permissions import ancestors_and_self
from tenants.services.approvals import approval_audit, approval_chain_for, approval_expires_at
from tenants.services.guards import ensure_may_write, require_permission
from tenants.services.notifications import notify_approvers

# --- job admission (called by scheduler.services.jobs.job_submit) ----------------------------------------


def job_admission_threshold_millis(tenant: Tenant) -> int | None:
    """The tenant's own threshold, else the nearest ancestor's, else ``GPUPOOL_JOB_APPROVAL_THRESHOLD_MILLIS``."""
    for node in ancestors_and_self(tenant):
        if node.job_approval_threshold_millis is not None:
            return node.job_approval_threshold_millis
    return getattr(settings, "GPUPOOL_JOB_APPROVAL_THRESHOLD_MILLIS", None)


def job_admission_needs_approval(*, tenant: Tenant, total_millis: int, critical: bool) -> bool:
    """A ``critical`` job always waits for approval; so does a job above the tenant's size threshold. The
    scheduler, which owns the priority classes, says whether the job is critical (tenants may not import it)."""
    if critical:
        return True
    threshold = job_admission_threshold_millis(tenant)
    return threshold is not None and total_millis > threshold


@transaction.atomic
def job_admission_request_create(*, job: Any, actor: User | None) -> Any:
    """Put ``job`` (already ``pending_approval``) in the approval inbox."""
    requester = actor if actor is not None else job.submitter
    chain, escalations = approval_chain_for(ApprovalKind.JOB_ADMISSION, job.tenant, requester)
    approval = ApprovalRequest.objects.create(
        kind=ApprovalKind.JOB_ADMISSION,
        tenant=job.tenant,
        job_id=job.pk,
        requester=requester,
        payload={
            "job": job.pk,
            "name": job.name,
            "priority_class": int(job.priority_class),
            "total_millis": job.total_millis,
            "summary": f"{job.name}: {job.replicas} x {job.millis_per_replica} millis, priority {job.priority_class}",
        },
        chain=chain,
        escalations=escalations,
        expires_at=approval_expires_at(),
    )
    approval_audit(
        approval,
        "request",
        actor=actor,
        details={"after": approval.payload, "chain": approval.chain, "escalations": escalations},
    )
    notify_approvers(approval)
    return approval


@transaction.atomic
def tenant_set_job_approval_threshold(
    *, actor: User | None, tenant: Tenant, threshold_millis: int | None, request: Any = None
) -> Tenant:
    """Jobs larger than ``threshold_millis`` in total wait for approval (None: inherit)."""
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            allows(actor, Action.TENANT_THRESHOLD, tenant), tenants_messages.ONLY_SYSTEM_ADMIN_SETS_JOB()
        )
    if threshold_millis is not None and threshold_millis < 0:
        raise DomainError(tenants_messages.THRESHOLD_MUST_MILLIS(), field="job_approval_threshold_millis")
    before = tenant.job_approval_threshold_millis
    tenant.job_approval_threshold_millis = threshold_millis
    tenant.save(update_fields=["job_approval_threshold_millis"])
    audit_record(
        action="tenant.update",
        actor=actor,
        tenant=tenant,
        target=f"tenant:{tenant.pk}",
        details={
            "before": {"job_approval_threshold_millis": before},
            "after": {"job_approval_threshold_millis": threshold_millis},
        },
        request=request,
    )
    return tenant
