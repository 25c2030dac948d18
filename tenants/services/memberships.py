"""Who belongs to which tenant, in which role."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from audit.services import audit_record
from kernel.api import DomainError
from tenants import messages as tenants_messages
from tenants.models import Membership, MembershipRole, Tenant, User
from tenants.permissions import can_manage_memberships
from tenants.services.guards import ensure_may_write, require_permission

# --- memberships ------------------------------------------------------------------------------------------


def cannot_add_member() -> DomainError:
    """The one answer for "no such user" and "this user cannot be a tenant member" (no enumeration): it names
    no account, so the answer is the same whichever was asked for."""
    return DomainError(
        tenants_messages.USER_CANNOT_ADDED_ACCOUNT_NOT(),
        code="cannot_add_member",
        field="user",
    )


def _check_membership_role(role: str) -> None:
    if role not in MembershipRole.values:
        raise DomainError(
            tenants_messages.UNKNOWN_ROLE_USE_ONE(
                value=role, choices=", ".join(repr(v) for v in MembershipRole.values)
            ),
            field="role",
        )


@transaction.atomic
def membership_create(
    *, actor: User | None, user: User, tenant: Tenant, role: str = MembershipRole.MEMBER, request: Any = None
) -> Membership:
    """Add ``user`` to ``tenant``. Security admins may do it anywhere, tenant admins within their subtree.
    Auditors hold no tenant roles: an auditor who could run jobs would audit themselves."""
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            can_manage_memberships(actor, tenant), tenants_messages.ONLY_TENANT_ADMIN_MAY_ADD(tenant=tenant.slug)
        )
    _check_membership_role(role)
    if user.platform_role or not user.is_active:
        # Platform accounts hold no tenant roles (separation of duties). Said exactly as for a username that
        # does not exist, so that a tenant admin cannot learn which accounts exist or hold platform roles.
        raise cannot_add_member()
    if Membership.objects.filter(user=user, tenant=tenant).exists():
        raise DomainError(tenants_messages.ALREADY_MEMBER(user=user.username, tenant=tenant.slug), code="duplicate")
    membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    audit_record(
        action="membership.create",
        actor=actor,
        tenant=tenant,
        target=f"user:{user.pk}",
        details={"after": {"user": user.username, "tenant": tenant.slug, "role": role}},
        request=request,
    )
    return membership


@transaction.atomic
def membership_update(*, actor: User | None, membership: Membership, role: str, request: Any = None) -> Membership:
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            can_manage_memberships(actor, membership.tenant),
            tenants_messages.ONLY_TENANT_ADMIN_MAY_CHANGE(tenant=membership.tenant.slug),
        )
    _check_membership_role(role)
    membership = (
        Membership.objects.select_for_update(of=("self",), no_key=True)
        .select_related("user", "tenant")
        .get(pk=membership.pk)
    )
    before = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(
        action="membership.role.change",
        actor=actor,
        tenant=membership.tenant,
        target=f"user:{membership.user_id}",
        details={"before": {"role": before}, "after": {"role": role}},
        request=request,
    )
    return membership


@transaction.atomic
def membership_delete(*, actor: User | None, membership: Membership, request: Any = None) -> None:
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            can_manage_memberships(actor, membership.tenant),
            tenants_messages.ONLY_TENANT_ADMIN_MAY_REMOVE(tenant=membership.tenant.slug),
        )
    audit_record(
        action="membership.delete",
        actor=actor,
        tenant=membership.tenant,
        target=f"user:{membership.user_id}",
        details={
            "before": {"user": membership.user.username, "tenant": membership.tenant.slug, "role": membership.role}
        },
        request=request,
    )
    membership.delete()
