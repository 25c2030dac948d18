"""What happens to the object of an approval request when it is decided, registered by the app that owns the
kind of request. The tenants app owns the inbox and the chains but not jobs: the scheduler registers the
``job_admission`` handler when it loads (``scheduler.apps``), so this app never imports the scheduler and the
import graph runs one way (scheduler → tenants)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ApprovalHandler:
    """``approved(approval, actor)`` on the final approval; ``closed(approval, actor, comment)`` when it is
    rejected, cancelled or expires (``actor`` None: the system)."""

    approved: Callable[[Any, Any], None]
    closed: Callable[[Any, Any, str], None]


_HANDLERS: dict[str, ApprovalHandler] = {}


def register_approval_handler(kind: str, handler: ApprovalHandler) -> None:
    _HANDLERS[kind] = handler


def approval_handler(kind: str) -> ApprovalHandler:
    try:
        return _HANDLERS[kind]
    except KeyError:
        raise LookupError(f"no approval handler is registered for {kind!r} requests (is its app installed?)") from None
