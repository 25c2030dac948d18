"""Per-job and per-tenant results of a replay, as rows and CSV files.

``JobTimeline`` is a ``SimObserver``: pass it to ``simulate(..., observers=[timeline])`` and it records each
job's every run (start, stop, why it stopped, the nodes). ``job_rows`` joins that with the job's totals from
the ``SimResult``; ``tenant_rows`` is ``metrics.per_tenant``. Pure Python, no Django.
"""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .metrics import per_tenant
from .simulator import SimResult, StopReason

JOB_CSV_COLUMNS = (
    "job_id",
    "tenant",
    "gpus",
    "duration_s",
    "submit_s",
    "first_start_s",
    "finish_s",
    "completion_s",
    "queued_s",
    "run_s",
    "starts",
    "preemptions",
    "failures",
    "starved_s",
    "starved_alone_s",
    "nodes",
    "runs",
)
TENANT_CSV_COLUMNS = (
    "tenant",
    "jobs",
    "finished",
    "never_started",
    "guarantee_gpus",
    "within_guarantee",
    "within_guarantee_alone",
    "starved_s",
    "longest_starved_s",
    "queued_avg_s",
    "queued_p95_s",
    "queued_p99_s",
    "jct_avg_s",
    "jct_p95_s",
    "jct_p99_s",
    "preemptions",
    "preemptions_max",
    "gpu_hours",
)


@dataclass(slots=True)
class Run:
    """One stay of a job on its devices."""

    start_s: float
    nodes: tuple[str, ...]
    flavor: str
    stop_s: float | None = None
    reason: StopReason | None = None

    def text(self) -> str:
        """``start-stop@node+node:reason`` (times in s), the form of the per-job CSV's ``runs`` column."""
        return f"{_fmt(self.start_s)}-{_fmt(self.stop_s)}@{'+'.join(self.nodes)}:{self.reason or ''}"


class JobTimeline:
    """Records every run of every job (a ``SimObserver``)."""

    def __init__(self) -> None:
        self.runs: dict[str, list[Run]] = defaultdict(list)

    def job_started(self, job_id: str, t: float, *, nodes: tuple[str, ...], flavor: str) -> None:
        self.runs[job_id].append(Run(start_s=t, nodes=nodes, flavor=flavor))

    def job_stopped(self, job_id: str, t: float, *, reason: StopReason) -> None:
        run = self.runs[job_id][-1]
        run.stop_s, run.reason = t, reason


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3f}"


def job_rows(result: SimResult, timeline: JobTimeline) -> list[dict[str, Any]]:
    """One row per job: submit, first start, finish, completion time (finish - submit), total time queued,
    time on devices, starts, preemptions, failures, time starved, the nodes it ran on and every run
    (``runs``: ``start-stop@nodes:reason`` separated by ``;``)."""
    rows = []
    for job in result.jobs:
        runs = timeline.runs.get(job.job_id, [])
        nodes = sorted({n for run in runs for n in run.nodes})
        rows.append(
            {
                "job_id": job.job_id,
                "tenant": job.tenant,
                "gpus": job.gpus,
                "duration_s": job.duration_s,
                "submit_s": job.submit_s,
                "first_start_s": job.first_start_s,
                "finish_s": job.finish_s,
                "completion_s": None if job.finish_s is None else job.finish_s - job.submit_s,
                "queued_s": job.queued_s,
                "run_s": sum((run.stop_s if run.stop_s is not None else result.end_s) - run.start_s for run in runs),
                "starts": job.starts,
                "preemptions": job.preemptions,
                "failures": job.failures,
                "starved_s": job.starved_s,
                "starved_alone_s": job.starved_alone_s,
                "nodes": "|".join(nodes),
                "runs": ";".join(run.text() for run in runs),
            }
        )
    return rows


def tenant_rows(result: SimResult) -> list[dict[str, Any]]:
    """One row per tenant (``metrics.per_tenant``)."""
    return per_tenant(result)


def write_csv(path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    """Rows as CSV with ``columns`` in that order. Numbers keep at most 3 decimals; None and NaN are empty."""
    file = Path(path)
    with file.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv_cell(row.get(c)) for c in columns])
    return file


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return str(int(value)) if value.is_integer() else repr(round(value, 3))
    return str(value)
