"""Fencing: an agent cut off from the portal stops its workloads before the portal runs their jobs elsewhere.

The portal requeues the jobs of a node it has not heard a heartbeat from for its lease plus a grace period
(``requeue_after_s``). An agent that is alive but cut off cannot hear that it happened, so without fencing its
workloads would go on beside their new copies. The agent therefore counts the seconds since the portal last
*confirmed* hearing it — its ``heartbeat.ack`` (from older portals: the pong to the WebSocket ping sent right
after a heartbeat), dated by when that heartbeat was sent — and when they reach ``after_s`` it fences: every
workload gets SIGTERM (the checkpoint signal, as for a preemption), SIGKILL ``grace_s`` later, ends ``stopped``
with reason ``fenced``, and nothing runs on the node until the portal confirms again. The portal chooses
``after_s`` so that the stops are over before it requeues (``after_s + grace_s`` plus a margin ≤
``requeue_after_s``) and sends it in its ``config`` frame; the agent's ``--fence-after``/``--fence-grace``
override it.

The settings and the time of the last confirmation are kept in ``fence.json`` in the work dir, so an agent
restarted while the portal is out of reach still fences on time (counting from the confirmation before the
restart) instead of never.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FENCE_FILE = "fence.json"
#: Seconds a fenced workload has to checkpoint when the command line sets a fence time but no grace.
DEFAULT_FENCE_GRACE_S = 10.0
#: The confirmation time in ``fence.json`` is rewritten at most this often. Older is safe: a restarted agent
#: then fences up to this much earlier than it had to, never later.
SAVE_EVERY_S = 5.0


@dataclass(frozen=True)
class FenceSettings:
    """``after_s``: seconds without a confirmation before the agent fences (0: never). ``grace_s``: seconds a
    fenced workload has between SIGTERM and SIGKILL to checkpoint. ``requeue_after_s``: when the portal runs the
    node's jobs elsewhere, counted from its last heartbeat (None: not known)."""

    after_s: float
    grace_s: float
    requeue_after_s: float | None = None

    @property
    def enabled(self) -> bool:
        return self.after_s > 0


class Fence:
    """When the portal last confirmed hearing this agent, and whether the agent is fenced now.

    ``clock`` is the agent's (monotonic) clock; ``wall_clock`` only dates the confirmation in ``fence.json``.
    ``override`` (the command line) wins over what the portal says.
    """

    def __init__(
        self,
        *,
        path: Path,
        clock: Callable[[], float],
        wall_clock: Callable[[], float] = time.time,
        override: FenceSettings | None = None,
    ) -> None:
        self.path = path
        self.clock = clock
        self.wall_clock = wall_clock
        self.override = override
        self.from_portal: FenceSettings | None = None
        self.confirmed_at = clock()
        self.fenced = False
        self._saved_wall = float("-inf")
        self._load()

    @property
    def settings(self) -> FenceSettings | None:
        return self.override or self.from_portal

    def configure(self, *, after_s: float, grace_s: float | None, requeue_after_s: float | None) -> None:
        """The portal's fence settings (its ``config`` frame)."""
        settings = FenceSettings(after_s=after_s, grace_s=grace_s or 0.0, requeue_after_s=requeue_after_s)
        if settings == self.from_portal:
            return
        self.from_portal = settings
        effective = self.settings
        if self.override is not None:
            log.info(
                "agent: fencing as set on the command line (after %.0f s), not the portal's", self.override.after_s
            )
        elif effective is not None and effective.enabled:
            log.info(
                "agent: fencing after %.0f s without the portal (workloads get %.0f s to checkpoint); the portal "
                "moves this node's jobs after %s s",
                effective.after_s,
                effective.grace_s,
                f"{requeue_after_s:.0f}" if requeue_after_s is not None else "?",
            )
            if requeue_after_s is not None and effective.after_s + effective.grace_s >= requeue_after_s:
                log.warning(
                    "agent: the portal's grace period is too short for fencing to finish first: a job cut off "
                    "from the portal may run twice for a while (raise GPUPOOL_NODE_LOST_GRACE_S)"
                )
        else:
            log.info("agent: the portal asks for no fencing")
        self._save(force=True)

    def confirm(self, sent_at: float) -> None:
        """The portal answered a ping sent at ``sent_at``: it had everything the agent sent before then."""
        if sent_at <= self.confirmed_at:
            return
        self.confirmed_at = sent_at
        if self.fenced:
            self.fenced = False
            log.warning("agent: the portal answers again; fencing lifted, workloads may start")
        self._save()

    def silent_s(self, now: float) -> float:
        return now - self.confirmed_at

    def due(self, now: float) -> bool:
        """True when the agent should fence now (once per silence)."""
        settings = self.settings
        return settings is not None and settings.enabled and not self.fenced and self.silent_s(now) >= settings.after_s

    def retry_cap_s(self) -> float | None:
        """The longest a reconnect attempt may wait while fencing is armed: a portal back after a short outage is
        reached well before the fence time, whatever the backoff had grown to."""
        settings = self.settings
        if settings is None or not settings.enabled:
            return None
        return max(1.0, settings.after_s / 4)

    # --- fence.json ----------------------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            settings = FenceSettings(**data["settings"]) if data.get("settings") else None
            confirmed_wall = float(data["confirmed_at"])
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("agent: cannot read %s (%s); fencing waits for the portal's settings", self.path, exc)
            return
        self.from_portal = settings
        # The silence began at the last confirmation before this agent started, not at its start.
        self.confirmed_at = self.clock() - max(0.0, self.wall_clock() - confirmed_wall)
        self._saved_wall = confirmed_wall

    def _save(self, *, force: bool = False) -> None:
        wall = self.wall_clock() - max(0.0, self.clock() - self.confirmed_at)
        if not force and wall - self._saved_wall < SAVE_EVERY_S:
            return
        data = {"settings": asdict(self.from_portal) if self.from_portal else None, "confirmed_at": wall}
        temporary = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(data))
            os.replace(temporary, self.path)
        except OSError:
            log.exception("agent: cannot write %s", self.path)
            return
        self._saved_wall = wall
