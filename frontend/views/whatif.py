"""What-if (system admins): the last days of this pool replayed under the policy in force and a proposed change,
side by side with a chart; and the download of that history in gpupool's trace format. The work is
``scheduler.whatif_history`` / ``scheduler.trace_export``, the same as the API's and the ``gpupool`` commands'."""

from __future__ import annotations

from dataclasses import fields

from django.http import HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext_lazy as _

from frontend.access import Section, action_required, section_required
from frontend.forms import WhatIfForm
from frontend.service_text import localize
from kernel.access_rules import Action
from kernel.api import DomainError
from scheduler.scheduling_policy import policy_from_settings
from scheduler.sim.traceformat import FORMATS
from scheduler.sim.whatif import WhatIf, allocation_chart, format_setting, format_value
from scheduler.trace_export import trace_export, window_bounds
from scheduler.whatif_history import WEB_MAX_JOBS, whatif_run

# The figures' names as people read them (scheduler.sim.whatif.METRICS has the English ones for the terminal).
METRIC_LABELS = {
    "jct_avg_s": _("Completion time, mean"),
    "jct_p95_s": _("Completion time, p95"),
    "jct_p99_s": _("Completion time, p99"),
    "queued_avg_s": _("Total time queued, mean"),
    "queued_p95_s": _("Total time queued, p95"),
    "queued_p99_s": _("Total time queued, p99"),
    "queue_delay_avg_s": _("Time to first start, mean"),
    "within_guarantee": _("Jobs within their guarantee"),
    "within_guarantee_alone": _("Jobs within their guarantee, each judged alone"),
    "starved_while_borrowed": _("Starved while others borrowed"),
    "starved_while_borrowed_beyond_tol": _("Starved beyond the tolerance"),
    "preemptions": _("Preemptions"),
    "preemptions_per_job_max": _("Preemptions of one job, most"),
    "preempted_3plus": _("Jobs preempted 3 times or more"),
    "lost_gpu_hours": _("GPU-hours of work lost to stops"),
    "gpu_allocation_window": _("GPUs allocated (submission window)"),
    "finished": _("Jobs finished"),
    "never_started": _("Jobs never started"),
}


def _display(rows: list[dict]) -> list[dict]:
    """Rows with their label translated and their figures formatted."""
    out = []
    for row in rows:
        change = row["change"]
        sign = "+" if isinstance(change, int | float) and change > 0 else ""
        out.append(
            {
                **row,
                "label": METRIC_LABELS.get(row["key"], row["label"]),
                "current_text": format_value(row["unit"], row["current"]),
                "proposed_text": format_value(row["unit"], row["proposed"]),
                "change_text": sign + format_value(row["unit"], change) if change else "=",
                "verdict": {True: "better", False: "worse", None: ""}[row["better"]],
            }
        )
    return out


def _current_settings() -> list[tuple[str, str]]:
    policy = policy_from_settings()
    return [(f.name, format_setting(getattr(policy, f.name))) for f in fields(policy)]


@section_required(Section.WHATIF)
def whatif_page(request):
    form = WhatIfForm(request.GET if "days" in request.GET else None, initial={"days": 30})
    result: WhatIf | None = None
    if form.is_valid():
        try:
            result = whatif_run(
                actor=request.user,
                changes=form.cleaned_data["settings"],
                days=form.cleaned_data["days"],
                max_jobs=WEB_MAX_JOBS,
            )
        except DomainError as exc:
            form.add_error("settings" if exc.field == "set" else "days", localize(exc.message))
    context = {
        "section": Section.WHATIF,
        "form": form,
        "result": result,
        "current_settings": _current_settings(),
        "max_jobs": WEB_MAX_JOBS,
    }
    if result is not None:
        context |= {
            "rows": _display(result.rows()),
            "tenant_rows": _display(result.tenant_rows()),
            "chart": allocation_chart(result),
            "changes": [(k, format_setting(v)) for k, v in result.changes.items()],
        }
    return render(request, "frontend/whatif/whatif.html", context)


@section_required(Section.WHATIF)
@action_required(Action.TRACE_EXPORT)
def trace_download(request):
    """The last ``days`` (default 30) as a zip of jobs, cluster and tenants files (``?file_format=jsonl``)."""
    file_format = request.GET.get("file_format", "csv")
    try:
        days = float(request.GET.get("days", 30))
    except ValueError:
        days = None
    if file_format not in FORMATS or days is None:
        return HttpResponse(
            _("Give days as a number and file_format as csv or jsonl."),
            status=400,
            content_type="text/plain; charset=utf-8",
        )
    try:
        since, until = window_bounds(days=days)
    except DomainError as exc:
        return HttpResponse(localize(exc.message), status=400, content_type="text/plain; charset=utf-8")
    window = trace_export(actor=request.user, since=since, until=until, request=request)
    response = HttpResponse(window.zip_bytes(file_format), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="gpupool-trace-{since:%Y%m%d}-{until:%Y%m%d}.zip"'
    return response
