"""Trace-driven simulator for the scheduling engine (pure Python, no Django).

``simulate(workload, policy, config)`` replays a ``Workload`` (from ``loaders``) through
``scheduler.core.plan`` in simulated time; ``metrics.summarize`` turns the result into the benchmark figures.
Command line: ``python -m scheduler.sim --trace philly --policy gpupool --days 7``.
"""

from .policies import POLICIES, SimPolicy
from .simulator import SimConfig, SimResult, Simulator, simulate
from .workload import SimJob, Workload

__all__ = ["POLICIES", "SimConfig", "SimJob", "SimPolicy", "SimResult", "Simulator", "Workload", "simulate"]
