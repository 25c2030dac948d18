"""Reads for tenants, users, memberships and tokens: querysets already limited to what the caller may see.

Objects outside what a caller may see are *missing* to that caller: the ``*_get_visible`` helpers raise the
same ``NotFoundError`` for "does not exist" and "not yours", so the API answers 404 and leaks nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Q, QuerySet

from portal.api import NotFoundError
from tenants.models import MAX_TENANT_DEPTH, ApiToken, Membership, Tenant, User
from tenants.permissions import is_security_admin, sees_all_tenants

# The largest id a BIGINT (and SQLite's INTEGER) holds; larger numbers in a URL are simply "not found".
MAX_ID = 2**63 - 1


def parse_id(pk: Any) -> int | None:
    """``pk`` as an id, or None when it cannot be one (not a number, out of range)."""
    try:
        value = int(pk)
    except (TypeError, ValueError):
        return None
    return value if 1 <= value <= MAX_ID else None


def subtree_q(root_ids: Iterable[int], *, prefix: str = "") -> Q:
    """A filter matching the tenants in the subtrees of ``root_ids`` (the roots included).

    The tree is at most MAX_TENANT_DEPTH deep, so a fixed chain of parent joins replaces a recursive query.
    ``prefix`` lets other models filter through their tenant FK (``prefix="tenant__"``).
    """
    ids = [value for value in (parse_id(pk) for pk in root_ids) if value is not None]
    condition = Q(**{f"{prefix}pk__in": ids})
    path = "parent"
    for _ in range(MAX_TENANT_DEPTH - 1):
        condition |= Q(**{f"{prefix}{path}__in": ids})
        path += "__parent"
    return condition


def member_root_ids(user: Any) -> list[int]:
    if not getattr(user, "is_authenticated", False):
        return []
    return list(Membership.objects.filter(user=user).values_list("tenant_id", flat=True))


def tenants_visible_to(user: Any) -> QuerySet[Tenant]:
    """Platform roles see every tenant (the auditor read-only); everybody else the subtrees of the tenants
    they are members of."""
    queryset = Tenant.objects.select_related("parent")
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return queryset.none()
    if sees_all_tenants(user):
        return queryset.all()
    return queryset.filter(subtree_q(member_root_ids(user))).distinct()


def tenant_ids_visible_to(user: Any) -> QuerySet:
    return tenants_visible_to(user).values("pk")


def tenant_subtree(tenant: Tenant) -> QuerySet[Tenant]:
    return Tenant.objects.filter(subtree_q([tenant.pk])).select_related("parent")


def tenant_subtree_ids(tenant: Tenant) -> list[int]:
    return list(Tenant.objects.filter(subtree_q([tenant.pk])).values_list("pk", flat=True))


def tenant_subtree_height(tenant: Tenant) -> int:
    """Levels in the subtree of ``tenant``, itself included (1 for a leaf)."""
    deepest = Tenant.objects.filter(subtree_q([tenant.pk])).order_by("-depth").values_list("depth", flat=True)[:1]
    return (deepest[0] if deepest else tenant.depth) - tenant.depth + 1


def tenant_get_visible(*, user: Any, pk: Any) -> Tenant:
    try:
        return tenants_visible_to(user).get(pk=parse_id(pk))
    except Tenant.DoesNotExist:
        raise NotFoundError(f"No tenant with id {pk} is visible to you.") from None


def memberships_visible_to(user: Any) -> QuerySet[Membership]:
    queryset = Membership.objects.select_related("user", "tenant")
    return queryset.filter(tenant__in=tenant_ids_visible_to(user))


def users_visible_to(user: Any) -> QuerySet[User]:
    """Platform roles see every account; others see themselves and the members of the tenants they see."""
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return User.objects.none()
    if sees_all_tenants(user):
        return User.objects.all().order_by("username")
    return (
        User.objects.filter(Q(pk=user.pk) | Q(memberships__tenant__in=tenant_ids_visible_to(user)))
        .distinct()
        .order_by("username")
    )


def user_get_visible(*, user: Any, pk: Any) -> User:
    try:
        return users_visible_to(user).get(pk=parse_id(pk))
    except User.DoesNotExist:
        raise NotFoundError(f"No user with id {pk} is visible to you.") from None


def tokens_visible_to(user: Any) -> QuerySet[ApiToken]:
    """Everyone sees their own tokens; security admins see all (to revoke a leaked one)."""
    queryset = ApiToken.objects.select_related("user")
    if not getattr(user, "is_authenticated", False):
        return queryset.none()
    if is_security_admin(user):
        return queryset.all()
    return queryset.filter(user=user)


def token_get_visible(*, user: Any, pk: Any) -> ApiToken:
    try:
        return tokens_visible_to(user).get(pk=parse_id(pk))
    except ApiToken.DoesNotExist:
        raise NotFoundError(f"No API token with id {pk} is visible to you.") from None
