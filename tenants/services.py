"""Writes for tenants, users and memberships. Every state change goes through a function here."""

from __future__ import annotations

from django.db import transaction

from audit.services import audit_record
from portal.api import DomainError
from tenants.models import MAX_TENANT_DEPTH, Membership, MembershipRole, PlatformRole, Tenant, User


@transaction.atomic
def user_create(
    *, actor: User | None, username: str, password: str, email: str = "", platform_role: str = PlatformRole.NONE
) -> User:
    if User.objects.filter(username=username).exists():
        raise DomainError(f"A user named {username!r} already exists; choose another username.", code="duplicate")
    user = User(username=username, email=email, platform_role=platform_role)
    user.set_password(password)
    user.save()
    audit_record(
        action="user.create",
        actor=actor,
        target=f"user:{user.pk}",
        details={"after": {"username": username, "platform_role": platform_role}},
    )
    return user


@transaction.atomic
def tenant_create(
    *, actor: User | None, name: str, slug: str, kind: str, parent: Tenant | None = None, description: str = ""
) -> Tenant:
    depth = 1 if parent is None else parent.depth + 1
    if depth > MAX_TENANT_DEPTH:
        raise DomainError(
            f"Tenant {slug!r} would be at depth {depth}; the tree allows at most {MAX_TENANT_DEPTH} levels.",
            code="tenant_too_deep",
        )
    if Tenant.objects.filter(slug=slug).exists():
        raise DomainError(f"A tenant with slug {slug!r} already exists.", code="duplicate")
    tenant = Tenant.objects.create(name=name, slug=slug, kind=kind, parent=parent, depth=depth, description=description)
    audit_record(
        action="tenant.create",
        actor=actor,
        tenant=tenant,
        target=f"tenant:{tenant.pk}",
        details={"after": {"name": name, "slug": slug, "kind": kind, "parent": parent.slug if parent else None}},
    )
    return tenant


@transaction.atomic
def membership_create(
    *, actor: User | None, user: User, tenant: Tenant, role: str = MembershipRole.MEMBER
) -> Membership:
    if Membership.objects.filter(user=user, tenant=tenant).exists():
        raise DomainError(f"{user.username} is already a member of {tenant.slug}.", code="duplicate")
    membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    audit_record(
        action="membership.create",
        actor=actor,
        tenant=tenant,
        target=f"user:{user.pk}",
        details={"after": {"role": role}},
    )
    return membership
