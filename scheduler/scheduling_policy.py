"""The scheduling policy in force: the engine's ``Policy`` with ``GPUPOOL_SCHEDULER_POLICY``'s overrides.

Its own module so that whoever only needs to know the policy (the selectors ordering a queue, the console, the
what-if replay) does not import the snapshot builder with it.
"""

from __future__ import annotations

from django.conf import settings

from scheduler.core import types as core


def policy_from_settings() -> core.Policy:
    """The Policy; ``GPUPOOL_SCHEDULER_POLICY`` (a dict of Policy fields) overrides the defaults."""
    overrides = dict(getattr(settings, "GPUPOOL_SCHEDULER_POLICY", {}) or {})
    return core.Policy(**overrides)
