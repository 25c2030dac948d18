"""What-if: one workload replayed under the policy in force and under a proposed change, side by side.

``compare(workload, current, changes)`` runs both (the same simulator, config and jobs; only the ``Policy``
differs) and returns the honest figures of docs/scheduler-overload.md for each — completion time and total
time queued (mean, p95, p99), time to first start, share of jobs within their guarantee, starved share,
preemptions — per tenant too, and the GPU allocation over time for a chart. ``gpupool whatif`` and the
console's what-if page show it. Pure Python, no Django.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from html import escape

from scheduler.core.types import Policy

from .metrics import per_tenant, summarize
from .policies import SimPolicy, parse_settings
from .simulator import SimConfig, SimResult, simulate
from .workload import Workload


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    label: str
    unit: str  # "s", "share", "count" or "gpu_hours"
    lower_is_better: bool


# The figures a what-if compares, in the order they are shown.
METRICS = (
    Metric("jct_avg_s", "completion time, mean", "s", True),
    Metric("jct_p95_s", "completion time, p95", "s", True),
    Metric("jct_p99_s", "completion time, p99", "s", True),
    Metric("queued_avg_s", "total time queued, mean", "s", True),
    Metric("queued_p95_s", "total time queued, p95", "s", True),
    Metric("queued_p99_s", "total time queued, p99", "s", True),
    Metric("queue_delay_avg_s", "time to first start, mean", "s", True),
    Metric("within_guarantee", "jobs within their guarantee", "share", False),
    Metric("within_guarantee_alone", "jobs within their guarantee, each judged alone", "share", False),
    Metric("starved_while_borrowed", "starved while others borrowed", "share", True),
    Metric("starved_while_borrowed_beyond_tol", "starved beyond the tolerance", "share", True),
    Metric("preemptions", "preemptions", "count", True),
    Metric("preemptions_per_job_max", "preemptions of one job, most", "count", True),
    Metric("preempted_3plus", "jobs preempted 3 times or more", "count", True),
    Metric("lost_gpu_hours", "GPU-hours of work lost to stops", "gpu_hours", True),
    Metric("gpu_allocation_window", "GPUs allocated (submission window)", "share", False),
    Metric("finished", "jobs finished", "count", False),
    Metric("never_started", "jobs never started", "count", True),
)
TENANT_METRICS = (
    Metric("jct_avg_s", "completion time, mean", "s", True),
    Metric("jct_p95_s", "completion time, p95", "s", True),
    Metric("queued_avg_s", "total time queued, mean", "s", True),
    Metric("queued_p99_s", "total time queued, p99", "s", True),
    Metric("within_guarantee", "jobs within their guarantee", "share", False),
    Metric("within_guarantee_alone", "jobs within their guarantee, each judged alone", "share", False),
    Metric("preemptions", "preemptions", "count", True),
)


@dataclass(frozen=True, slots=True)
class Side:
    """One replay: its policy, the run's figures (``metrics.summarize``) and one row per tenant."""

    name: str
    policy: Policy
    summary: dict
    tenants: list[dict]
    result: SimResult = field(repr=False)


@dataclass(frozen=True, slots=True)
class WhatIf:
    workload: str
    jobs: int
    gpus: int
    changes: dict[str, object]
    current: Side
    proposed: Side

    def rows(self) -> list[dict]:
        """Per metric: key, label, unit, current value, proposed value, change and whether it is better."""
        return [_row(m, self.current.summary.get(m.key), self.proposed.summary.get(m.key)) for m in METRICS]

    def tenant_rows(self) -> list[dict]:
        """Per tenant and metric (``TENANT_METRICS``): the same as ``rows``, with the tenant."""
        now = {row["tenant"]: row for row in self.current.tenants}
        then = {row["tenant"]: row for row in self.proposed.tenants}
        out = []
        for tenant in sorted(set(now) | set(then)):
            for metric in TENANT_METRICS:
                row = _row(metric, now.get(tenant, {}).get(metric.key), then.get(tenant, {}).get(metric.key))
                out.append({"tenant": tenant, **row})
        return out

    def as_dict(self) -> dict:
        """JSON-ready: the inputs, both sides' figures, the side-by-side rows and the hourly allocation."""
        return {
            "workload": self.workload,
            "jobs": self.jobs,
            "gpus": self.gpus,
            "changes": {k: _plain(v) for k, v in self.changes.items()},
            "current_policy": {k: _plain(v) for k, v in _fields(self.current.policy).items()},
            "proposed_policy": {k: _plain(v) for k, v in _fields(self.proposed.policy).items()},
            "metrics": [_clean(r) for r in self.rows()],
            "tenants": [_clean(r) for r in self.tenant_rows()],
            "allocated_share_hourly": {
                "current": allocation_series(self.current.result),
                "proposed": allocation_series(self.proposed.result),
            },
        }


def _fields(policy: Policy) -> dict[str, object]:
    return {name: getattr(policy, name) for name in policy.__dataclass_fields__}


def _plain(value: object) -> object:
    return value.value if isinstance(value, Enum) else value


def _clean(row: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def _row(metric: Metric, current: object, proposed: object) -> dict:
    change = better = None
    numbers = isinstance(current, int | float) and isinstance(proposed, int | float)
    if numbers and not (math.isnan(current) or math.isnan(proposed)):
        change = proposed - current
        if change:
            better = (change < 0) == metric.lower_is_better
    return {
        "key": metric.key,
        "label": metric.label,
        "unit": metric.unit,
        "current": current,
        "proposed": proposed,
        "change": change,
        "better": better,
    }


def format_value(unit: str, value: object) -> str:
    """A figure for people: seconds with thousands separators, shares as percentages, "-" when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "share":
        return f"{value:.1%}"
    if unit == "s":
        return f"{value:,.0f} s"
    if unit == "gpu_hours":
        return f"{value:,.1f}"
    return f"{value:,.0f}" if isinstance(value, float) else f"{value:,}"


def format_setting(value: object) -> str:
    """A setting as ``--set`` takes it: ``false``, ``900``, ``fifo``, ``none``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_table(whatif: WhatIf, *, per_tenant: bool = False) -> str:
    """The side-by-side table (``gpupool whatif``): metric, current, proposed, change."""
    rows = whatif.tenant_rows() if per_tenant else whatif.rows()
    head = ["tenant"] if per_tenant else []
    table = [[*head, "metric", "current", "proposed", "change"]]
    for row in rows:
        change = row["change"]
        sign = "+" if isinstance(change, int | float) and change > 0 else ""
        verdict = {True: " (better)", False: " (worse)", None: ""}[row["better"]]
        table.append(
            [
                *([row["tenant"]] if per_tenant else []),
                row["label"],
                format_value(row["unit"], row["current"]),
                format_value(row["unit"], row["proposed"]),
                (sign + format_value(row["unit"], change) + verdict) if change else "=",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    first_numeric = len(head) + 1
    lines = [
        "  ".join(
            c.rjust(w) if i >= first_numeric else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in table
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def compare(
    workload: Workload,
    current: Policy,
    changes: Mapping[str, object],
    config: SimConfig | None = None,
) -> WhatIf:
    """Replay ``workload`` under ``current`` and under ``current`` with ``changes`` (names of ``Policy`` fields
    to values or their text, as ``--set`` takes them; ``ValueError`` for an unknown name or a bad value)."""
    typed = parse_settings(changes)
    proposed = replace(current, **typed)
    sides = []
    for name, policy in (("current", current), ("proposed", proposed)):
        result = simulate(workload, SimPolicy(name, policy), config)
        sides.append(Side(name, policy, summarize(result), per_tenant(result), result))
    return WhatIf(
        workload=workload.name,
        jobs=len(workload.jobs),
        gpus=workload.capacity_millis // 1000,
        changes=typed,
        current=sides[0],
        proposed=sides[1],
    )


def allocation_series(result: SimResult) -> list[float]:
    """Share of the GPUs held in each hour of the replay (the chart's line)."""
    if not result.capacity_millis:
        return []
    return [round(b / result.capacity_millis, 4) for b in result.allocated_bins]


@dataclass(frozen=True, slots=True)
class Chart:
    """Two lines (current, proposed) of the hourly GPU allocation, in a 0..100 x 0..100 box (SVG user units,
    y down) so a template or ``svg`` draws them without script."""

    current: str  # SVG polyline points
    proposed: str
    hours: int


def allocation_chart(whatif: WhatIf) -> Chart:
    now = allocation_series(whatif.current.result)
    then = allocation_series(whatif.proposed.result)
    hours = max(len(now), len(then), 1)

    def points(series: list[float]) -> str:
        if not series:
            return ""
        step = 100 / max(hours - 1, 1)
        coords = [(i * step, 100 - 95 * share) for i, share in enumerate(series)]
        if len(coords) == 1:
            coords.append((100.0, coords[0][1]))
        return " ".join(f"{x:.2f},{y:.2f}" for x, y in coords)

    return Chart(current=points(now), proposed=points(then), hours=hours)


def svg(whatif: WhatIf, *, title: str = "GPUs allocated per hour: current (solid) vs proposed (dashed)") -> str:
    """A standalone SVG of ``allocation_chart`` (for ``gpupool whatif --chart``)."""
    chart = allocation_chart(whatif)
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="-8 -8 116 124" width="720" height="520" '
        'font-family="sans-serif" font-size="3">'
        f"<title>{escape(title)}</title>"
        '<rect x="0" y="0" width="100" height="100" fill="none" stroke="#bbb" stroke-width="0.2"/>'
        '<text x="-1" y="5.5" text-anchor="end">100%</text><text x="-1" y="100" text-anchor="end">0%</text>'
        f'<text x="0" y="105">0 h</text><text x="100" y="105" text-anchor="end">{chart.hours} h</text>'
        f'<polyline points="{chart.current}" fill="none" stroke="#1f6feb" stroke-width="0.5"/>'
        f'<polyline points="{chart.proposed}" fill="none" stroke="#d1242f" stroke-width="0.5" '
        'stroke-dasharray="1.5 1"/>'
        f'<text x="0" y="111">{escape(title)}</text>'
        "</svg>\n"
    )
