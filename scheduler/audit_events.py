"""The audit codes the scheduler app records (jobs, arrays, inference scaling, node status, flavors, trace exports):
``(code, category, description)``, registered from ``SchedulerConfig.ready()``. Never rename a code (exports and
SIEM rules match on them)."""

from __future__ import annotations

EVENTS: list[tuple[str, str, str]] = [
    # Workloads
    ("job.submit", "workload", "A job was submitted"),
    ("job.approve", "workload", "A job waiting for approval was approved"),
    ("job.reject", "workload", "A job waiting for approval was rejected"),
    ("job.cancel", "workload", "A job was cancelled"),
    ("job.preempt", "workload", "A job was preempted (asked to stop and give its cards back, or its node drains)"),
    # Until cancellations and preemptions had codes of their own, they too were recorded as job.transition.
    ("job.transition", "workload", "A job changed state"),
    ("job.output_stored", "workload", "A node agent stored the output a job's replica left"),
    ("job.array.submit", "workload", "A job array was submitted (one record for its N jobs)"),
    ("job.array.cancel", "workload", "The jobs of a job array were cancelled"),
    ("job.scale", "workload", "An inference service changed its replica count"),
    # Nodes and flavors, as a system admin changes them
    ("node.cordon", "fleet", "A node was cordoned"),
    ("node.uncordon", "fleet", "A node was uncordoned"),
    ("node.drain", "fleet", "A node was drained"),
    ("flavor.create", "fleet", "A resource flavor was created"),
    ("flavor.update", "fleet", "A resource flavor was changed"),
    # Reports
    ("trace.export", "scheduler", "Job history was exported as a replay trace"),
]
