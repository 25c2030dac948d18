"""The tenant tree as filters: a tenant's subtree in one query (the tree is at most MAX_TENANT_DEPTH deep) and
its chain of ancestors. Selectors and the access policy both stand on these."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Q

from kernel.filters import MAX_ID
from tenants.models import MAX_TENANT_DEPTH, Tenant

__all__ = ["ancestors_and_self", "parse_id", "subtree_q"]


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


def ancestors_and_self(tenant: Tenant) -> list[Tenant]:
    """``tenant`` and its ancestors, nearest first (at most MAX_TENANT_DEPTH rows)."""
    chain = []
    node: Tenant | None = tenant
    while node is not None:
        chain.append(node)
        node = node.parent
    return chain
