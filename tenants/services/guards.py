"""What every tenants service checks before it writes: that the actor may write at all (``ensure_may_write``)
and that the policy allows this change (``require_permission``); and ``UNSET``, the "argument not given"
default of the update services.
"""

from __future__ import annotations

from typing import Any

from kernel.api import PermissionDeniedError
from tenants import messages as tenants_messages
from tenants.models import User
from tenants.permissions import is_auditor

# Marks "argument not given" where None is a meaningful value (e.g. parent=None moves a tenant to the top).
UNSET: Any = object()


def ensure_may_write(actor: User | None) -> None:
    """Auditors change nothing (separation of duties); inactive accounts neither."""
    if actor is None:
        return
    if not actor.is_active:
        raise PermissionDeniedError(tenants_messages.ACCOUNT_DEACTIVATED())
    if is_auditor(actor):
        raise PermissionDeniedError(tenants_messages.AUDITORS_READ_ONLY_ACCESS_ASK())


def require_permission(allowed: bool, message: str) -> None:
    """Refuse with ``message`` (a 403 that says who may do it) unless ``allowed``."""
    if not allowed:
        raise PermissionDeniedError(message)
