"""Deprecated import path, kept only while the scheduler's services move into their package: every name here
is the access policy's (``tenants.policy``, ``tenants.permissions``); import from there."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from portal.policy import Action
from tenants.permissions import can_manage_job, can_submit_work, is_system_admin
from tenants.policy import reaches_all
from tenants.selectors import tenant_ids_visible_to

__all__ = ["can_manage_job", "can_submit_work", "is_system_admin", "sees_all_tenants", "visible_tenant_ids"]


def sees_all_tenants(user: Any) -> bool:
    return reaches_all(user, Action.TENANT_VIEW)


def visible_tenant_ids(user: Any) -> QuerySet:
    return tenant_ids_visible_to(user)
