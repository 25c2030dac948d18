"""Helpers every tenants service uses: the write guard, the permission check, the tenant-tree lock and the
before/after snapshots written to the audit trail.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from portal.api import PermissionDeniedError
from tenants.models import Tenant, User
from tenants.permissions import is_auditor

# Marks "argument not given" where None is a meaningful value (e.g. parent=None moves a tenant to the top).
UNSET: Any = object()


def _ensure_may_write(actor: User | None) -> None:
    """Auditors change nothing (separation of duties); inactive accounts neither."""
    if actor is None:
        return
    if not actor.is_active:
        raise PermissionDeniedError("This account is deactivated.")
    if is_auditor(actor):
        raise PermissionDeniedError("Auditors have read-only access; ask a system or security admin.")


def _require(allowed: bool, message: str) -> None:
    if not allowed:
        raise PermissionDeniedError(message)


def _lock_tenant_tree() -> None:
    """Serialise structural changes to the tenant tree (moves, creates) so two concurrent moves cannot
    together build a cycle. SQLite runs write transactions one at a time already."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [0x6770_7465_6E74])  # "gptent"


def _user_snapshot(user: User) -> dict:
    return {
        "username": user.username,
        "email": user.email,
        "platform_role": user.platform_role,
        "is_active": user.is_active,
        "first_name": user.first_name,
        "last_name": user.last_name,
    }


def _tenant_snapshot(tenant: Tenant) -> dict:
    return {
        "name": tenant.name,
        "slug": tenant.slug,
        "kind": tenant.kind,
        "parent": tenant.parent.slug if tenant.parent_id else None,
        "depth": tenant.depth,
        "description": tenant.description,
    }
