"""What-if on this pool's own history: the last ``days`` replayed under the policy in force
(``GPUPOOL_SCHEDULER_POLICY``) and under it with proposed settings changed, side by side
(``scheduler.sim.whatif.compare``).

Synchronous: the web (``POST /api/v1/whatif/``, the console's what-if page) refuses a window of more than
``WEB_MAX_JOBS`` jobs so a request ends in seconds, not minutes; ``gpupool whatif`` has no such bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kernel.access_rules import Action
from kernel.api import DomainError, PermissionDeniedError
from kernel.cadence import CYCLE_INTERVAL_S
from scheduler import messages as scheduler_messages
from scheduler.scheduling_policy import policy_from_settings
from scheduler.sim.policies import parse_settings
from scheduler.sim.simulator import SimConfig
from scheduler.sim.whatif import WhatIf, compare
from scheduler.trace_export import trace_window, window_bounds
from tenants.access import allows

WEB_MAX_JOBS = 5000


def replay_config() -> SimConfig:
    """The replay's clock: cycles as often as the real loop runs them (``GPUPOOL_CYCLE_INTERVAL_S``)."""
    return SimConfig(cycle_interval_s=float(CYCLE_INTERVAL_S))


def whatif_run(
    *,
    actor: Any | None,
    changes: Mapping[str, object],
    days: float | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    max_jobs: int | None,
) -> WhatIf:
    """Replay the window under the current policy and with ``changes`` (``Policy`` field → value or text).

    Refuses (``DomainError``, a 400 in the API) an unknown setting or a bad value — the message lists the
    valid names —, no change at all, an empty window, and more than ``max_jobs`` jobs (None: no bound; the web
    passes ``WEB_MAX_JOBS``).
    """
    if actor is not None and not allows(actor, Action.WHATIF_RUN):
        raise PermissionDeniedError(scheduler_messages.ONLY_SYSTEM_ADMIN_MAY_RUN())
    if not changes:
        raise DomainError(scheduler_messages.SAY_WHAT_CHANGE_PREEMPTION_FALSE(), code="no_change", field="set")
    try:
        parse_settings(changes)
    except ValueError as exc:
        raise DomainError(str(exc), code="invalid_setting", field="set") from None
    since, until = window_bounds(days=days, since=since, until=until)
    window = trace_window(since=since, until=until)
    if not window.jobs:
        raise DomainError(
            scheduler_messages.NO_JOB_RAN_BETWEEN_CHOOSE(
                since=format(since, "%Y-%m-%d %H:%M"), until=format(until, "%Y-%m-%d %H:%M")
            ),
            code="empty_window",
            field="days",
        )
    if max_jobs is not None and len(window.jobs) > max_jobs:
        raise DomainError(
            scheduler_messages.WINDOW_HOLDS_JOBS_MORE_WEB(
                jobs=format(len(window.jobs), ","), cap=format(max_jobs, ",")
            ),
            code="window_too_large",
            field="days",
        )
    return compare(window.workload(), policy_from_settings(), changes, replay_config())
