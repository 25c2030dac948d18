"""The tenant tree: create, update (rename, move under another parent, archive) and delete tenants, with
the sibling-name and cycle checks.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.db.models import F, ProtectedError

from audit.services import audit_record
from kernel.access_rules import Action
from kernel.api import ConflictError, DomainError
from tenants import messages as tenants_messages
from tenants.access import reaches_all
from tenants.models import MAX_TENANT_DEPTH, Tenant, TenantKind, User
from tenants.permissions import can_admin_strict_ancestor, can_admin_tenant
from tenants.selectors import tenant_subtree_height, tenant_subtree_ids
from tenants.services.guards import UNSET, ensure_may_write, require_permission

# --- tenants ----------------------------------------------------------------------------------------------


def _lock_tenant_tree() -> None:
    """Serialise structural changes to the tenant tree (moves, creates) so two concurrent moves cannot
    together build a cycle. SQLite runs write transactions one at a time already."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [0x6770_7465_6E74])  # "gptent"


def _tenant_snapshot(tenant: Tenant) -> dict:
    return {
        "name": tenant.name,
        "slug": tenant.slug,
        "kind": tenant.kind,
        "parent": tenant.parent.slug if tenant.parent_id else None,
        "depth": tenant.depth,
        "description": tenant.description,
    }


def _check_sibling_name(*, name: str, parent: Tenant | None, exclude_pk: int | None = None) -> None:
    # The database constraint does not cover roots (NULL parents are distinct), so check here for all.
    siblings = Tenant.objects.filter(parent=parent, name__iexact=name)
    if exclude_pk is not None:
        siblings = siblings.exclude(pk=exclude_pk)
    if siblings.exists():
        if parent:
            raise DomainError(
                tenants_messages.TENANT_NAMED_ALREADY_EXISTS_UNDER(name=name, parent=parent.slug),
                code="duplicate",
                field="name",
            )
        raise DomainError(tenants_messages.TENANT_NAMED_ALREADY_EXISTS_TOP(name=name), code="duplicate", field="name")


@transaction.atomic
def tenant_create(
    *,
    actor: User | None,
    name: str,
    slug: str,
    kind: str = TenantKind.TEAM,
    parent: Tenant | None = None,
    description: str = "",
    request: Any = None,
) -> Tenant:
    """Create a tenant. Top-level tenants: system admins; children: system admins and tenant admins of the
    parent (or above)."""
    ensure_may_write(actor)
    if actor is not None:
        if parent is None:
            require_permission(
                reaches_all(actor, Action.TENANT_CREATE), tenants_messages.ONLY_SYSTEM_ADMIN_MAY_CREATE()
            )
        else:
            require_permission(
                can_admin_tenant(actor, parent), tenants_messages.ONLY_TENANT_ADMIN_MAY_ADD_TENANTS(tenant=parent.slug)
            )
    if kind not in TenantKind.values:
        raise DomainError(tenants_messages.UNKNOWN_TENANT_KIND(value=kind), field="kind")
    _lock_tenant_tree()
    depth = 1 if parent is None else parent.depth + 1
    if depth > MAX_TENANT_DEPTH:
        raise DomainError(
            tenants_messages.TENANT_WOULD_DEPTH_TREE_ALLOWS(tenant=slug, depth=depth, max=MAX_TENANT_DEPTH),
            code="tenant_too_deep",
            field="parent",
        )
    if Tenant.objects.filter(slug=slug).exists():
        raise DomainError(tenants_messages.TENANT_SLUG_ALREADY_EXISTS(tenant=slug), code="duplicate", field="slug")
    _check_sibling_name(name=name, parent=parent)
    tenant = Tenant.objects.create(name=name, slug=slug, kind=kind, parent=parent, depth=depth, description=description)
    audit_record(
        action="tenant.create",
        actor=actor,
        tenant=tenant,
        target=f"tenant:{tenant.pk}",
        details={"after": _tenant_snapshot(tenant)},
        request=request,
    )
    return tenant


@transaction.atomic
def tenant_update(
    *,
    actor: User | None,
    tenant: Tenant,
    name: str = UNSET,
    kind: str = UNSET,
    description: str = UNSET,
    parent: Tenant | None = UNSET,
    request: Any = None,
) -> Tenant:
    """Rename, re-describe or move a tenant. A move keeps the tree a tree (no cycles) and within
    MAX_TENANT_DEPTH levels for the whole moved subtree; it needs admin rights above the tenant and on the
    new parent."""
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            can_admin_tenant(actor, tenant), tenants_messages.ONLY_TENANT_ADMIN_MAY_CHANGE_2(tenant=tenant.slug)
        )
    _lock_tenant_tree()
    tenant = Tenant.objects.select_for_update(of=("self",), no_key=True).select_related("parent").get(pk=tenant.pk)
    before = _tenant_snapshot(tenant)
    moving = parent is not UNSET and (parent.pk if parent else None) != tenant.parent_id
    if moving:
        if actor is not None:
            require_permission(
                can_admin_strict_ancestor(actor, tenant),
                tenants_messages.MOVING_NEEDS_TENANT_ADMIN_RIGHTS(tenant=tenant.slug),
            )
            if parent is None:
                require_permission(
                    reaches_all(actor, Action.TENANT_MOVE), tenants_messages.ONLY_SYSTEM_ADMIN_MAY_MOVE()
                )
            else:
                require_permission(
                    can_admin_tenant(actor, parent), tenants_messages.YOU_NOT_TENANT_ADMIN(tenant=parent.slug)
                )
        if parent is not None and parent.pk in tenant_subtree_ids(tenant):
            raise DomainError(
                tenants_messages.CANNOT_MOVE_UNDER_INSIDE_SUBTREE(tenant=tenant.slug, parent=parent.slug),
                code="tenant_cycle",
                field="parent",
            )
        new_depth = 1 if parent is None else parent.depth + 1
        height = tenant_subtree_height(tenant)
        if new_depth + height - 1 > MAX_TENANT_DEPTH:
            raise DomainError(
                tenants_messages.CANNOT_MOVE_UNDER_SUBTREE_LEVEL(
                    tenant=tenant.slug,
                    parent=parent.slug,
                    height=height,
                    depth=new_depth + height - 1,
                    max=MAX_TENANT_DEPTH,
                )
                if parent
                else tenants_messages.CANNOT_MOVE_UNDER_TOP_LEVEL(
                    tenant=tenant.slug, height=height, depth=new_depth + height - 1, max=MAX_TENANT_DEPTH
                ),
                code="tenant_too_deep",
                field="parent",
            )
    new_name = tenant.name if name is UNSET else name
    new_parent = parent if moving else tenant.parent
    if moving or new_name.lower() != tenant.name.lower():
        _check_sibling_name(name=new_name, parent=new_parent, exclude_pk=tenant.pk)
    if kind is not UNSET:
        if kind not in TenantKind.values:
            raise DomainError(tenants_messages.UNKNOWN_TENANT_KIND(value=kind), field="kind")
        tenant.kind = kind
    if description is not UNSET:
        tenant.description = description
    tenant.name = new_name
    if moving:
        delta = (1 if parent is None else parent.depth + 1) - tenant.depth
        subtree = tenant_subtree_ids(tenant)
        tenant.parent = parent
        tenant.depth += delta
        if delta:
            Tenant.objects.filter(pk__in=[pk for pk in subtree if pk != tenant.pk]).update(depth=F("depth") + delta)
    tenant.save()
    audit_record(
        action="tenant.move" if moving else "tenant.update",
        actor=actor,
        tenant=tenant,
        target=f"tenant:{tenant.pk}",
        details={"before": before, "after": _tenant_snapshot(tenant)},
        request=request,
    )
    return tenant


@transaction.atomic
def tenant_delete(*, actor: User | None, tenant: Tenant, request: Any = None) -> None:
    """Delete an empty tenant (no child tenants, no jobs or quotas that refer to it)."""
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            can_admin_strict_ancestor(actor, tenant),
            tenants_messages.DELETING_NEEDS_TENANT_ADMIN_RIGHTS(tenant=tenant.slug),
        )
    if tenant.children.exists():
        raise ConflictError(
            tenants_messages.TENANT_CHILD_TENANTS_MOVE_DELETE(tenant=tenant.slug), code="tenant_not_empty"
        )
    if tenant.memberships.exists():
        raise ConflictError(
            tenants_messages.TENANT_STILL_MEMBERS_REMOVE_THEIR(tenant=tenant.slug), code="tenant_not_empty"
        )
    before = _tenant_snapshot(tenant)
    pk = tenant.pk
    audit_record(
        action="tenant.delete",
        actor=actor,
        tenant=tenant,
        target=f"tenant:{pk}",
        details={"before": before},
        request=request,
    )
    try:
        with transaction.atomic():
            tenant.delete()
    except ProtectedError:
        raise ConflictError(
            tenants_messages.TENANT_STILL_JOBS_QUOTAS_OTHER(tenant=tenant.slug),
            code="tenant_not_empty",
        ) from None
