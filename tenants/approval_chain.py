"""Who decides an approval request: the configured chain (``GPUPOOL_APPROVAL_CHAINS``) resolved against the
people who exist, so that every request can finish.

A step whose role nobody but the requester holds (alice, tenant admin of ``acme/research``, asks for her own
department while ``acme`` has no admin) is passed over: the request goes to the next step, and when no step is
left, to the system admins. The passed-over steps are kept on the request (``escalations``) and named when it
is sent; ``chain_plan`` says, for each step, who may decide it. The rule of who holds a role is
``tenants.permissions.holds_approval_role``; this module only asks it.
"""

from __future__ import annotations

from typing import Any

from tenants.models import ApprovalStepRole, MembershipRole, PlatformRole, Tenant, User
from tenants.permissions import ancestors_and_self, holds_approval_role

NO_OTHER_APPROVER = "nobody but the requester holds this role"


def role_holders(role: str, tenant: Tenant) -> list[User]:
    """Active users who hold approver ``role`` for a request about ``tenant``, by username."""
    if role == ApprovalStepRole.SYSTEM_ADMIN:
        users = User.objects.filter(platform_role=PlatformRole.SYSTEM_ADMIN, is_active=True)
    else:
        base = tenant if role == ApprovalStepRole.TENANT_ADMIN else tenant.parent
        if base is None:
            return []
        ids = [node.pk for node in ancestors_and_self(base)]
        users = User.objects.filter(
            is_active=True, memberships__tenant_id__in=ids, memberships__role=MembershipRole.TENANT_ADMIN
        ).distinct()
    # The one rule decides; the query above only narrows the candidates.
    return [user for user in users.order_by("username") if holds_approval_role(user, role, tenant)]


def eligible_approvers(role: str, tenant: Tenant, requester_id: int | None) -> list[User]:
    """Holders of ``role`` other than the requester (nobody decides their own request)."""
    return [user for user in role_holders(role, tenant) if user.pk != requester_id]


def resolve_chain(roles: list[str], tenant: Tenant, requester_id: int | None) -> tuple[list[str], list[dict]]:
    """The steps of ``roles`` someone other than the requester can decide, and the ones passed over.

    When no step is left the system admins decide; when the requester is the only system admin, the system
    admin step stays (nobody else exists to ask) and the caller decides whether that is acceptable.
    """
    effective: list[str] = []
    escalations: list[dict] = []
    for role in roles:
        if eligible_approvers(role, tenant, requester_id):
            effective.append(role)
        else:
            escalations.append({"role": role, "reason": NO_OTHER_APPROVER})
    if not effective:
        effective = [ApprovalStepRole.SYSTEM_ADMIN]
    return effective, escalations


def chain_plan(approval: Any) -> list[dict]:
    """Each step of ``approval.chain`` with its state (done, awaiting, upcoming) and who may decide it."""
    plan = []
    for index, role in enumerate(approval.chain):
        if index < approval.step:
            state = "done"
        elif index == approval.step and approval.awaiting_role is not None:
            state = "awaiting"
        else:
            state = "upcoming"
        approvers = eligible_approvers(role, approval.tenant, approval.requester_id)
        plan.append({"step": index, "role": role, "state": state, "approvers": [user.username for user in approvers]})
    return plan


def decided_by_sentence(approval: Any) -> str:
    """ "Decided by the system admin (root)", for the requester when the request is sent."""
    parts = []
    for step in chain_plan(approval):
        role = ApprovalStepRole(step["role"]).label
        names = ", ".join(step["approvers"]) or "—"
        parts.append(f"{role} ({names})")
    return " → ".join(parts)
