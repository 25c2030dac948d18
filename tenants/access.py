"""The access policy applied: ``allows(user, action, obj)`` and ``restrict(queryset, user, action)``.

The rules themselves are the table in ``kernel.access_rules`` (who, what, which objects, which token scope); this
module only evaluates it for accounts, objects and querysets, the way NetBox's ``RestrictedQuerySet`` does.
Every entry point asks these two functions (or the predicates in ``tenants.permissions`` built on them): API
permission classes and selectors, console sections, WebSocket consumers, services, tasks and commands.

Tenant roles are inherited down the tree: the strongest role held on a tenant or any ancestor applies.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model, Q, QuerySet

from kernel.access_rules import (
    NO_ACCOUNT_ACTIONS,
    PLATFORM_ROLES,
    TENANT_ROLES,
    TOKEN_SCOPE,
    TOKEN_SCOPE_RANK,
    Action,
    Principal,
    Scope,
    rules_for,
)
from tenants.models import Membership, MembershipRole, PlatformRole, Tenant
from tenants.tree import ancestors_and_self, subtree_q

__all__ = [
    "Action",
    "allows",
    "is_active_account",
    "may",
    "platform_role_of",
    "principals_of",
    "reaches_all",
    "restrict",
    "tenant_role",
    "token_allows",
]

# Higher number = more rights; picks the strongest inherited role.
_ROLE_RANK = {MembershipRole.VIEWER: 1, MembershipRole.MEMBER: 2, MembershipRole.TENANT_ADMIN: 3}

#: How each model reaches its tenant ("" = it is one) and which field names its owner. A model in neither
#: table has no tenant and no owner: only rules of scope ``all`` reach it.
TENANT_PATH: dict[str, str] = {
    "tenants.tenant": "",
    "tenants.membership": "tenant__",
    "tenants.quota": "tenant__",
    "tenants.approvalrequest": "tenant__",
    "tenants.user": "memberships__tenant__",
    "scheduler.job": "tenant__",
}
OWNER_FIELD: dict[str, str] = {
    "tenants.user": "pk",
    "tenants.apitoken": "user_id",
    "tenants.approvalrequest": "requester_id",
    "scheduler.job": "submitter_id",
}


def is_active_account(user: Any) -> bool:
    return bool(user is not None and getattr(user, "is_authenticated", False) and user.is_active)


def platform_role_of(user: Any) -> str:
    return user.platform_role if is_active_account(user) else PlatformRole.NONE


def _held_roles(user: Any) -> list[tuple[int, str]]:
    """(tenant id, role) of every membership of ``user``."""
    return list(Membership.objects.filter(user=user).values_list("tenant_id", "role"))


def principals_of(user: Any) -> frozenset[str]:
    """The principals of the table ``user`` acts as: any_user, its platform role, every tenant role it holds
    somewhere. Empty for anonymous or deactivated accounts."""
    if not is_active_account(user):
        return frozenset()
    found = {Principal.ANY_USER.value}
    if user.platform_role:
        found.add(user.platform_role)
    found.update(role for _tenant_id, role in _held_roles(user))
    return frozenset(found)


def may(user: Any, action: Action, *, principals: frozenset[str] | None = None) -> bool:
    """Whether ``user`` may take ``action`` on *some* object (the API's 403 before any object is read, and the
    console's sections). ``principals`` passes ``principals_of(user)`` when already known."""
    if action in NO_ACCOUNT_ACTIONS:
        return True
    held = principals_of(user) if principals is None else principals
    return any(rule.principal in held for rule in rules_for(action))


def reaches_all(user: Any, action: Action) -> bool:
    """Whether a rule of scope ``all`` gives ``user`` ``action`` on every object (no narrowing needed)."""
    if not is_active_account(user):
        return False
    for rule in rules_for(action):
        if rule.scope != Scope.ALL:
            continue
        if rule.principal == Principal.ANY_USER or rule.principal == user.platform_role:
            return True
    return False


def token_allows(token: Any, action: Action) -> bool:
    """Whether an API token's scope covers ``action`` (``None``: a session, no token limit)."""
    if token is None:
        return True
    return TOKEN_SCOPE_RANK[token.scope] >= TOKEN_SCOPE_RANK[TOKEN_SCOPE[action]]


def tenant_role(user: Any, tenant: Tenant | None) -> str | None:
    """The strongest membership role ``user`` holds on ``tenant`` or any ancestor, or None."""
    if tenant is None or not is_active_account(user):
        return None
    ids = [node.pk for node in ancestors_and_self(tenant)]
    best = None
    for role in Membership.objects.filter(user=user, tenant_id__in=ids).values_list("role", flat=True):
        if best is None or _ROLE_RANK[role] > _ROLE_RANK[best]:
            best = role
    return best


def _label(obj: Any) -> str:
    return obj._meta.label_lower if isinstance(obj, Model) else ""


def _tenant_of(obj: Any) -> Tenant | None:
    if isinstance(obj, Tenant):
        return obj
    return getattr(obj, "tenant", None) if _label(obj) in TENANT_PATH else None


def _owned_by(obj: Any, user: Any) -> bool:
    field = OWNER_FIELD.get(_label(obj))
    return field is not None and getattr(obj, field) == user.pk


def allows(user: Any, action: Action, obj: Any = None, *, token: Any = None) -> bool:
    """Whether ``user`` (through ``token`` when given) may take ``action`` on ``obj``; without ``obj``, on some
    object (like ``may``)."""
    if action in NO_ACCOUNT_ACTIONS:
        return True
    if not is_active_account(user) or not token_allows(token, action):
        return False
    if obj is None:
        return may(user, action)
    if TENANT_PATH.get(_label(obj), "").count("__") > 1:
        # Reached through a many-valued relation (an account's tenants are its memberships'): ask the database.
        return restrict(type(obj).objects.filter(pk=obj.pk), user, action).exists()
    tenant = _tenant_of(obj)
    role_here: str | None = None
    role_above: str | None = None
    looked_up = False
    for rule in rules_for(action):
        if rule.principal in PLATFORM_ROLES:
            if user.platform_role == rule.principal:
                return True
            continue
        if rule.principal == Principal.ANY_USER:
            if rule.scope == Scope.ALL or (rule.scope == Scope.OWN and _owned_by(obj, user)):
                return True
            continue
        if tenant is None:
            continue
        if not looked_up:
            role_here = tenant_role(user, tenant)
            role_above = tenant_role(user, tenant.parent) if tenant.parent_id else None
            looked_up = True
        if rule.scope == Scope.BELOW:
            if role_above == rule.principal:
                return True
        elif role_here == rule.principal and (rule.scope != Scope.OWN or _owned_by(obj, user)):
            return True
    return False


def restrict(queryset: QuerySet, user: Any, action: Action) -> QuerySet:
    """``queryset`` narrowed to the objects ``user`` may take ``action`` on (NetBox's ``restrict``). What is
    left out is *missing* to the caller: get it from here and answer 404 for "not yours" as for "no such"."""
    if action in NO_ACCOUNT_ACTIONS:
        return queryset.all()
    if not is_active_account(user):
        return queryset.none()
    label = queryset.model._meta.label_lower
    tenant_path = TENANT_PATH.get(label)
    owner_field = OWNER_FIELD.get(label)
    roots: dict[str, list[int]] | None = None
    condition: Q | None = None
    for rule in rules_for(action):
        part: Q | None = None
        if rule.principal in PLATFORM_ROLES:
            if user.platform_role == rule.principal:
                return queryset.all()
            continue
        if rule.principal == Principal.ANY_USER:
            if rule.scope == Scope.ALL:
                return queryset.all()
            if rule.scope == Scope.OWN and owner_field is not None:
                part = Q(**{owner_field: user.pk})
        elif rule.principal in TENANT_ROLES and tenant_path is not None:
            if roots is None:
                roots = {}
                for tenant_id, role in _held_roles(user):
                    roots.setdefault(role, []).append(tenant_id)
            held = roots.get(rule.principal, [])
            if not held:
                continue
            if rule.scope == Scope.BELOW:
                part = subtree_q(held, prefix=f"{tenant_path}parent__")
            else:
                part = subtree_q(held, prefix=tenant_path)
                if rule.scope == Scope.OWN:
                    part &= Q(**{owner_field: user.pk}) if owner_field else Q(pk__in=[])
        if part is not None:
            condition = part if condition is None else condition | part
    if condition is None:
        return queryset.none()
    narrowed = queryset.filter(condition)
    # An account reaches its tenants through several memberships: one row per account.
    return narrowed.distinct() if label == "tenants.user" else narrowed
