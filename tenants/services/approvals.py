"""The approval inbox shared by quota changes and job admissions: chains, requests, decisions (approve,
reject, request changes, resubmit, cancel) and expiry.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.access_rules import Action
from kernel.api import ConflictError, DomainError, PermissionDeniedError
from tenants import messages as tenants_messages
from tenants.access import allows
from tenants.approval_chain import eligible_approvers, resolve_chain
from tenants.approval_handlers import approval_handler
from tenants.models import (
    OPEN_APPROVAL_STATUSES,
    ApprovalDecision,
    ApprovalKind,
    ApprovalRequest,
    ApprovalStatus,
    ApprovalStep,
    ApprovalStepRole,
    Quota,
    Tenant,
    User,
)
from tenants.permissions import can_admin_tenant, can_decide_approval, is_approval_override, is_system_admin
from tenants.services.guards import ensure_may_write, require_permission
from tenants.services.notifications import notify_approvers, notify_requester
from tenants.services.quotas import quota_apply, quota_path_lock, quota_tree_check, quota_values_clean

# --- approvals (quota changes and job admissions share one inbox) ----------------------------------------

DEFAULT_APPROVAL_CHAINS = {
    "quota_change": ["parent_tenant_admin", "system_admin"],
    "job_admission": ["tenant_admin", "system_admin"],
}


def _configured_chain(kind: str, tenant: Tenant) -> list[str]:
    chains = getattr(settings, "GPUPOOL_APPROVAL_CHAINS", None) or DEFAULT_APPROVAL_CHAINS
    chain = list(chains.get(kind, DEFAULT_APPROVAL_CHAINS[kind]))
    unknown = [role for role in chain if role not in ApprovalStepRole.values]
    if unknown:
        raise DomainError(
            tenants_messages.GPUPOOL_APPROVAL_CHAINS_UNKNOWN_ROLE(kind=repr(kind), roles=unknown), code="misconfigured"
        )
    if tenant.parent_id is None:
        # A top-level tenant has no parent tenant admin to ask.
        chain = [role for role in chain if role != ApprovalStepRole.PARENT_TENANT_ADMIN]
    return chain or [ApprovalStepRole.SYSTEM_ADMIN]


def approval_chain_for(kind: str, tenant: Tenant, requester: User | None) -> tuple[list[str], list[dict]]:
    """The configured chain with the steps nobody but the requester could decide passed over
    (``tenants.approval_chain``), so every request reaches someone who can finish it."""
    return resolve_chain(_configured_chain(kind, tenant), tenant, getattr(requester, "pk", None))


def _require_decision_comment(actor: User, approval: Any, comment: str) -> bool:
    """A system admin may decide a step that waits for someone else's role, saying why; returns whether this
    decision is such an override (it is audited as one)."""
    override = is_approval_override(actor, approval)
    if override and not comment.strip():
        role = (approval.awaiting_role or "").replace("_", " ")
        raise DomainError(
            tenants_messages.STEP_WAITS_SYSTEM_ADMIN_DECIDING(role=role),
            field="comment",
        )
    return override


def approval_expires_at() -> dt.datetime:
    return timezone.now() + dt.timedelta(hours=getattr(settings, "GPUPOOL_APPROVAL_TTL_HOURS", 72))


def _audit_prefix(approval: Any) -> str:
    return "quota_request" if approval.kind == ApprovalKind.QUOTA_CHANGE else "approval"


def approval_audit(approval: Any, verb: str, *, actor: User | None, details: dict, request: Any = None) -> None:
    audit_record(
        action=f"{_audit_prefix(approval)}.{verb}",
        actor=actor,
        tenant=approval.tenant,
        target=f"approval:{approval.pk}",
        details={"kind": approval.kind, "status": approval.status, "step": approval.step, **details},
        request=request,
    )


@transaction.atomic
def quota_change_request_create(
    *, actor: User, tenant: Tenant, flavor: Any, values: dict, reason: str = "", request: Any = None
) -> Any:
    """A tenant admin asks for a new quota for ``tenant`` (its own or one below). The values are checked now
    (so an impossible request is refused at once) and again, under locks, when it is finally approved."""
    ensure_may_write(actor)
    require_permission(
        can_admin_tenant(actor, tenant), tenants_messages.ONLY_TENANT_ADMIN_MAY_REQUEST(tenant=tenant.slug)
    )
    current = Quota.objects.filter(tenant=tenant, flavor=flavor).first()
    merged = {**(current.values() if current else {}), **values}
    cleaned = quota_values_clean(merged, tenant=tenant, flavor=flavor)
    quota_tree_check(tenant=tenant, flavor=flavor, new=cleaned)
    chain, escalations = approval_chain_for(ApprovalKind.QUOTA_CHANGE, tenant, actor)
    if is_system_admin(actor) and not all(eligible_approvers(role, tenant, actor.pk) for role in chain):
        # The platform's only system admin asking: nobody else exists to decide, and they need no one.
        # (A platform with no system admin at all keeps the request for the first one appointed.)
        raise DomainError(
            tenants_messages.NOBODY_BUT_YOU_COULD_APPROVE(),
            code="no_approver",
        )
    approval = ApprovalRequest.objects.create(
        kind=ApprovalKind.QUOTA_CHANGE,
        tenant=tenant,
        flavor=flavor,
        requester=actor,
        payload=cleaned,
        reason=reason,
        chain=chain,
        escalations=escalations,
        expires_at=approval_expires_at(),
    )
    approval_audit(
        approval,
        "create",
        actor=actor,
        details={
            "before": current.values() if current else None,
            "after": cleaned,
            "chain": approval.chain,
            "escalations": escalations,
        },
        request=request,
    )
    notify_approvers(approval)
    return approval


def _lock_approval(approval: Any) -> Any:
    return (
        ApprovalRequest.objects.select_for_update(of=("self",), no_key=True)
        .select_related("tenant__parent", "flavor", "requester")
        .get(pk=approval.pk)
    )


def _require_open(approval: Any, *statuses: str) -> None:
    allowed = statuses or (ApprovalStatus.PENDING,)
    if approval.status not in allowed:
        raise ConflictError(
            tenants_messages.REQUEST_NOTHING_MORE_CAN_DECIDED(pk=approval.pk, status=approval.status),
            code="approval_closed",
        )


def _decision_begin(*, actor: User, approval: Any, refusal: Callable[[Any], str] | None = None) -> Any:
    """The start every decision shares: the actor may write, the request is locked and still pending, and it
    waits for ``actor`` (``refusal(locked request)`` is the answer otherwise)."""
    ensure_may_write(actor)
    approval = _lock_approval(approval)
    _require_open(approval)
    if not can_decide_approval(actor, approval):
        raise PermissionDeniedError(
            refusal(approval) if refusal else tenants_messages.YOU_NOT_APPROVER_REQUEST_WAITING()
        )
    return approval


def _step_record(approval: Any, *, actor: User, decision: str, comment: str, role: str | None = None) -> None:
    ApprovalStep.objects.create(
        request=approval,
        step=approval.step,
        role=role if role is not None else approval.awaiting_role,
        actor=actor,
        decision=decision,
        comment=comment,
    )


@transaction.atomic
def approval_approve(*, actor: User, approval: Any, comment: str = "", request: Any = None) -> Any:
    """Approve the awaited step. On the last step the change is applied: a quota change is re-validated
    under row locks and either applied whole or marked ``failed`` with the reason; an admitted job is
    released to the queue."""
    approval = _decision_begin(
        actor=actor,
        approval=approval,
        refusal=lambda locked: tenants_messages.YOU_CANNOT_APPROVE_STEP_WAITS(
            role=(locked.awaiting_role or "").replace("_", " ")
        ),
    )
    override = _require_decision_comment(actor, approval, comment)
    if approval.step + 1 < len(approval.chain):
        # Who can decide the later steps may have changed since the request was made: pass over the ones
        # nobody but the requester could decide now, so the request cannot stall on them.
        later, escalations = resolve_chain(approval.chain[approval.step + 1 :], approval.tenant, approval.requester_id)
        approval.chain = approval.chain[: approval.step + 1] + later
        approval.escalations = approval.escalations + escalations
    final = approval.step + 1 >= len(approval.chain)
    if final and approval.kind == ApprovalKind.QUOTA_CHANGE:
        # Locks first (before any audit write) so concurrent approvals queue here in one order.
        quota_path_lock(tenant=approval.tenant, flavor=approval.flavor)
    _step_record(approval, actor=actor, decision=ApprovalDecision.APPROVE, comment=comment)
    if not final:
        approval.step += 1
        approval.save(update_fields=["step", "chain", "escalations", "updated_at"])
        approval_audit(
            approval,
            "approve",
            actor=actor,
            details={"comment": comment, "final": False, "override": override, "chain": approval.chain},
            request=request,
        )
        notify_approvers(approval)
        return approval
    approval.decided_at = timezone.now()
    if approval.kind == ApprovalKind.QUOTA_CHANGE:
        try:
            with transaction.atomic():
                quota_apply(
                    actor=actor,
                    tenant=approval.tenant,
                    flavor=approval.flavor,
                    values=approval.payload,
                    request=request,
                )
        except DomainError as exc:
            approval.status = ApprovalStatus.FAILED
            approval.result_message = tenants_messages.APPROVED_BUT_NO_LONGER_FITS(reason=exc.message)[:500]
        else:
            approval.status = ApprovalStatus.APPROVED
            approval.result_message = tenants_messages.APPLIED()
    else:
        approval_handler(approval.kind).approved(approval, actor)
        approval.status = ApprovalStatus.APPROVED
        approval.result_message = tenants_messages.JOB_QUEUED()
    approval.step = len(approval.chain)
    approval.save()
    verb = "approve" if approval.status == ApprovalStatus.APPROVED else "fail"
    approval_audit(
        approval,
        verb,
        actor=actor,
        details={"comment": comment, "final": True, "result": approval.result_message, "override": override},
        request=request,
    )
    notify_requester(approval, comment=comment)
    return approval


@transaction.atomic
def approval_reject(*, actor: User, approval: Any, comment: str, request: Any = None) -> Any:
    """Refuse the request (any step's approver may). A job waiting for admission fails with the comment."""
    approval = _decision_begin(actor=actor, approval=approval)
    if not comment.strip():
        raise DomainError(tenants_messages.SAY_WHY_YOU_REJECT_REQUEST(), field="comment")
    override = _require_decision_comment(actor, approval, comment)
    _step_record(approval, actor=actor, decision=ApprovalDecision.REJECT, comment=comment)
    approval.status = ApprovalStatus.REJECTED
    approval.decided_at = timezone.now()
    approval.result_message = tenants_messages.REJECTED(user=actor.username)
    approval.save()
    if approval.kind == ApprovalKind.JOB_ADMISSION:
        approval_handler(approval.kind).closed(approval, actor, comment)
    approval_audit(approval, "reject", actor=actor, details={"comment": comment, "override": override}, request=request)
    notify_requester(approval, comment=comment)
    return approval


@transaction.atomic
def approval_request_changes(*, actor: User, approval: Any, comment: str, request: Any = None) -> Any:
    """Send a quota change back to its requester, who may resubmit changed values."""
    approval = _decision_begin(actor=actor, approval=approval)
    if approval.kind != ApprovalKind.QUOTA_CHANGE:
        raise DomainError(tenants_messages.JOB_ADMISSION_CAN_APPROVED_REJECTED())
    if not comment.strip():
        raise DomainError(tenants_messages.SAY_WHICH_CHANGES_YOU_NEED(), field="comment")
    override = _require_decision_comment(actor, approval, comment)
    _step_record(approval, actor=actor, decision=ApprovalDecision.REQUEST_CHANGES, comment=comment)
    approval.status = ApprovalStatus.CHANGES_REQUESTED
    approval.save(update_fields=["status", "updated_at"])
    approval_audit(
        approval, "request_changes", actor=actor, details={"comment": comment, "override": override}, request=request
    )
    notify_requester(approval, comment=comment)
    return approval


@transaction.atomic
def approval_resubmit(
    *, actor: User, approval: Any, values: dict | None = None, comment: str = "", request: Any = None
) -> Any:
    """The requester answers "changes requested" with new values; the chain starts again from its first step."""
    ensure_may_write(actor)
    approval = _lock_approval(approval)
    _require_open(approval, ApprovalStatus.CHANGES_REQUESTED)
    require_permission(actor.pk == approval.requester_id, tenants_messages.ONLY_REQUESTER_MAY_RESUBMIT_REQUEST())
    before = dict(approval.payload)
    if values:
        merged = {**approval.payload, **values}
        approval.payload = quota_values_clean(merged, tenant=approval.tenant, flavor=approval.flavor)
        quota_tree_check(tenant=approval.tenant, flavor=approval.flavor, new=approval.payload)
    ApprovalStep.objects.create(
        request=approval,
        step=approval.step,
        role="requester",
        actor=actor,
        decision=ApprovalDecision.RESUBMIT,
        comment=comment,
    )
    approval.status = ApprovalStatus.PENDING
    approval.step = 0
    approval.chain, approval.escalations = approval_chain_for(approval.kind, approval.tenant, approval.requester)
    approval.expires_at = approval_expires_at()
    approval.save()
    approval_audit(
        approval,
        "resubmit",
        actor=actor,
        details={"before": before, "after": approval.payload, "comment": comment},
        request=request,
    )
    notify_approvers(approval)
    return approval


@transaction.atomic
def approval_cancel(*, actor: User, approval: Any, comment: str = "", request: Any = None) -> Any:
    """The requester (or a system admin) withdraws an open request; a waiting job fails."""
    ensure_may_write(actor)
    approval = _lock_approval(approval)
    _require_open(approval, *OPEN_APPROVAL_STATUSES)
    require_permission(
        allows(actor, Action.APPROVAL_WITHDRAW, approval), tenants_messages.ONLY_REQUESTER_MAY_CANCEL_REQUEST()
    )
    _step_record(approval, actor=actor, decision=ApprovalDecision.CANCEL, comment=comment, role="requester")
    approval.status = ApprovalStatus.CANCELLED
    approval.decided_at = timezone.now()
    approval.save()
    if approval.kind == ApprovalKind.JOB_ADMISSION:
        approval_handler(approval.kind).closed(approval, actor, comment or "approval request cancelled")
    approval_audit(approval, "cancel", actor=actor, details={"comment": comment}, request=request)
    return approval


def approvals_expire(*, now: dt.datetime | None = None) -> int:
    """Expire open requests past ``expires_at`` (the periodic task calls this); returns how many."""
    now = now or timezone.now()
    expired = 0
    due = ApprovalRequest.objects.filter(status__in=OPEN_APPROVAL_STATUSES, expires_at__lte=now).values_list(
        "pk", flat=True
    )
    for pk in list(due):
        with transaction.atomic():
            approval = _lock_approval(ApprovalRequest(pk=pk))
            if approval.status not in OPEN_APPROVAL_STATUSES or approval.expires_at > now:
                continue
            ApprovalStep.objects.create(
                request=approval, step=approval.step, role="system", decision=ApprovalDecision.EXPIRE
            )
            approval.status = ApprovalStatus.EXPIRED
            approval.decided_at = now
            approval.result_message = tenants_messages.NOBODY_DECIDED_TIME()
            approval.save()
            if approval.kind == ApprovalKind.JOB_ADMISSION:
                approval_handler(approval.kind).closed(approval, None, "approval request expired")
            approval_audit(approval, "expire", actor=None, details={})
            notify_requester(approval, comment="")
            expired += 1
    return expired
