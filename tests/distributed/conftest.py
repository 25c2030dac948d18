"""The distributed-training tests run a real deployment in processes (tests/resilience/cluster.py)."""

from __future__ import annotations

from tests.resilience.conftest import make_cluster  # noqa: F401  (the fixture, shared)
