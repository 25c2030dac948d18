"""The node lease, the requeue grace and the agents' fence, computed in one place so that they agree.

A node is ``not_ready`` once its lease (``GPUPOOL_LEASE_MISSES`` heartbeats of ``GPUPOOL_HEARTBEAT_INTERVAL_S``)
runs out, and its jobs are requeued ``GPUPOOL_NODE_LOST_GRACE_S`` later (``services.lease.lease_check``). An agent that
is alive but cut off fences itself (``nodeagent.fencing``): after ``fence_after_s`` without the portal's answer it
stops its workloads, giving each ``GPUPOOL_FENCE_GRACE_S`` to checkpoint. The portal sends both figures in its
``config`` frame and picks ``fence_after_s`` as late as still lets the stops end :data:`FENCE_MARGIN_S` before
the requeue, so a job never runs in two places and a short outage of the portal stops nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.checks import Warning

#: Seconds between the end of the fenced stops and the portal's requeue: a recorded heartbeat is rounded down to
#: the second, the agent acts in steps of up to a second, and a killed process takes a moment to go.
FENCE_MARGIN_S = 10


@dataclass(frozen=True)
class LeaseTiming:
    heartbeat_interval_s: int
    lease_s: int
    grace_s: int
    #: Seconds without the portal's answer after which an agent stops its workloads; 0: agents do not fence.
    fence_after_s: int
    fence_grace_s: int

    @property
    def requeue_after_s(self) -> int:
        """Seconds from a node's last heartbeat to the requeue of its jobs (at the earliest)."""
        return self.lease_s + self.grace_s

    @property
    def fence_in_time(self) -> bool:
        """True when fenced workloads have stopped before their jobs are requeued (or fencing is off)."""
        return not self.fence_after_s or (
            self.fence_after_s + self.fence_grace_s + FENCE_MARGIN_S <= self.requeue_after_s
        )


def lease_timing() -> LeaseTiming:
    lease_s = settings.GPUPOOL_HEARTBEAT_INTERVAL_S * settings.GPUPOOL_LEASE_MISSES
    grace_s = settings.GPUPOOL_NODE_LOST_GRACE_S
    fence_grace_s = settings.GPUPOOL_FENCE_GRACE_S
    fence_after_s = 0
    if settings.GPUPOOL_FENCING:
        # As late as is safe, but not before the lease: a grace too short to fence in time still fences early.
        fence_after_s = max(lease_s, lease_s + grace_s - fence_grace_s - FENCE_MARGIN_S)
    return LeaseTiming(
        heartbeat_interval_s=settings.GPUPOOL_HEARTBEAT_INTERVAL_S,
        lease_s=lease_s,
        grace_s=grace_s,
        fence_after_s=fence_after_s,
        fence_grace_s=fence_grace_s,
    )


def check_fence_timing(app_configs, **kwargs) -> list[Warning]:
    """A system check (registered in ``apps.py``): warn when the grace period is too short for a cut-off agent to
    stop its jobs before they move."""
    timing = lease_timing()
    if timing.fence_in_time:
        return []
    needed = timing.fence_grace_s + FENCE_MARGIN_S
    return [
        Warning(
            f"GPUPOOL_NODE_LOST_GRACE_S ({timing.grace_s} s) is too short for fencing: agents cut off from the portal "
            f"stop their workloads {timing.fence_after_s} s after the last answer and give them "
            f"{timing.fence_grace_s} s, but their jobs are requeued {timing.requeue_after_s} s after the last "
            "heartbeat, so a job may run in two places for a while.",
            hint=f"Set GPUPOOL_NODE_LOST_GRACE_S to {needed} s or more, or lower GPUPOOL_FENCE_GRACE_S.",
            id="fleet.W001",
        )
    ]
