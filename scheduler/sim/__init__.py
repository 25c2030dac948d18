"""Trace-driven simulator for the scheduling engine (pure Python, no Django).

``simulate(workload, policy, config)`` replays a ``Workload`` (from ``loaders``) through
``scheduler.core.plan`` in simulated time; ``metrics.summarize`` turns the result into the benchmark figures.
Command line: ``python -m scheduler.sim --trace philly --policy gpupool --days 7``, or on any trace in gpupool's
format (``traceformat``): ``python -m scheduler.sim --trace-file jobs.csv --cluster-file cluster.csv``.
Observers (``SimObserver``, e.g. ``records.JobTimeline``) see every start and stop of a job.
"""

from .policies import POLICIES, SimPolicy
from .simulator import SimConfig, SimObserver, SimResult, Simulator, StopReason, simulate
from .workload import SimJob, Workload

__all__ = [
    "POLICIES",
    "SimConfig",
    "SimJob",
    "SimObserver",
    "SimPolicy",
    "SimResult",
    "Simulator",
    "StopReason",
    "Workload",
    "simulate",
]
