"""Jobs: a filterable list, the submit form (fields or pasted JSON), the job page, cancel."""

from __future__ import annotations

import json
import shlex

from django.contrib import messages
from django.db.models import Count
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_POST
from django_tables2 import RequestConfig

from frontend.access import Section, action_required, declares_action, section_required
from frontend.admin_forms import tenant_path_labels
from frontend.export import export_response
from frontend.filtersets import JobFilterSet
from frontend.forms import CancelForm, JobJsonForm, JobSubmitForm
from frontend.service_text import localize
from frontend.summaries import job_chart_devices
from frontend.tables import JobTable
from kernel.access_rules import Action
from kernel.api import DomainError, NotFoundError
from scheduler import launch, serving
from scheduler import logs as scheduler_logs
from scheduler import selectors as scheduler_selectors
from scheduler.jobspec import EXAMPLE_COMMAND
from scheduler.models import FINAL_JOB_STATES, JobState
from scheduler.scheduling_policy import policy_from_settings
from scheduler.services import jobs as job_services
from tenants import selectors as tenant_selectors
from tenants.access import may, reaches_all, restrict
from tenants.models import Tenant
from tenants.permissions import can_manage_job, is_auditor, is_system_admin


def submittable_tenants(user) -> list[Tenant]:
    """Tenants ``user`` may submit work to (members and tenant admins, inherited down the tree)."""
    return list(restrict(Tenant.objects.all(), user, Action.JOB_SUBMIT).order_by("slug"))


@section_required(Section.JOBS)
def job_list(request):
    """The queue view (like squeue): filters in the query string, so a filtered view is a link to share."""
    jobs = scheduler_selectors.job_queue_rows(request.user).order_by("-submitted_at", "-id")
    visible = list(tenant_selectors.tenants_visible_to(request.user))
    labels = tenant_path_labels(visible)
    tenants = sorted(((t.slug, labels[t.pk]) for t in visible), key=lambda choice: choice[1].lower())
    filterset = JobFilterSet(request.GET, queryset=jobs, request=request, tenants=tenants)
    can_submit = bool(submittable_tenants(request.user))
    # Members and tenant admins cancel their jobs, system admins any; viewers see no checkboxes.
    selectable = may(request.user, Action.JOB_MANAGE)
    positions = scheduler_selectors.queue_positions()
    table = JobTable(filterset.qs, positions=positions, selectable=selectable)
    if request.GET.get("export") == "csv":
        RequestConfig(request, paginate=False).configure(table)
        return export_response(table, fmt="csv", filename="jobs")
    RequestConfig(request, paginate={"per_page": 50}).configure(table)
    context = {
        "section": Section.JOBS,
        "filter": filterset,
        "table": table,
        "can_submit": can_submit,
        "selectable": selectable,
        "column_choices": table.column_choices(),
        "return_query": request.GET.urlencode(),
    }
    return render(request, "frontend/jobs/list.html", context)


# One request cancels at most this many jobs (a page shows 50); more are refused with a message, not a timeout.
BULK_CANCEL_MAX = 200


def _job_id(value: str) -> int | None:
    """A job id from a form value; None for anything else (letters, '²', a number past the id column)."""
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else None


@require_POST
@section_required(Section.JOBS)
@action_required(Action.JOB_MANAGE)
def job_bulk_cancel(request):
    """Cancel the jobs ticked in the list, each through ``job_cancel`` (its permission check, its audit record,
    its own transaction): one job that cannot be cancelled does not stop the others. A job the user cannot see
    is reported like a job that does not exist."""
    back = reverse("frontend:job-list")
    query = QueryDict(request.POST.get("return_query", "")).urlencode()
    if query:
        back = f"{back}?{query}"
    wanted = list(dict.fromkeys(request.POST.getlist("select")))
    if not wanted:
        messages.warning(request, _("Select the jobs to cancel first."))
        return redirect(back)
    if len(wanted) > BULK_CANCEL_MAX:
        messages.error(request, _("Select at most %(max)s jobs at a time.") % {"max": BULK_CANCEL_MAX})
        return redirect(back)
    ids = [pk for pk in map(_job_id, wanted) if pk is not None]
    found = {job.pk: job for job in scheduler_selectors.jobs_visible_to(request.user).filter(pk__in=ids)}
    cancelled: list[int] = []
    refused: list[str] = []
    for value in wanted:
        job = found.get(_job_id(value))
        if job is None:
            refused.append(_("%(id)s (no such job)") % {"id": value[:20]})
            continue
        if job.state in FINAL_JOB_STATES:
            refused.append(_("%(id)s (already %(state)s)") % {"id": job.pk, "state": job.get_state_display()})
            continue
        if not can_manage_job(request.user, job):
            refused.append(_("%(id)s (you may not cancel it)") % {"id": job.pk})
            continue
        try:
            job_services.job_cancel(job=job, actor=request.user, request=request)
        except DomainError as exc:
            refused.append(f"{job.pk} ({localize(exc.message)})")
        else:
            cancelled.append(job.pk)
    if cancelled:
        count = len(cancelled)
        messages.success(
            request,
            ngettext("Cancelled %(count)d job: %(ids)s.", "Cancelled %(count)d jobs: %(ids)s.", count)
            % {"count": count, "ids": ", ".join(str(pk) for pk in cancelled)},
        )
    if refused:
        count = len(refused)
        messages.error(
            request,
            ngettext(
                "%(count)d job could not be cancelled: %(details)s.",
                "%(count)d jobs could not be cancelled: %(details)s.",
                count,
            )
            % {"count": count, "details": "; ".join(refused)},
        )
    return redirect(back)


def _attach_domain_error(form, exc: DomainError) -> None:
    """Show a service's error next to the field it names when the form has that field."""
    field = (exc.field or "").split(".")[-1].split("[")[0]
    aliases = {"flavors": "flavor", "memory_mib": "memory_gib"}
    field = aliases.get(field, field)
    form.add_error(field if field in form.fields else None, localize(exc.message))


@section_required(Section.JOBS)
@declares_action(Action.JOB_SUBMIT)
def job_submit(request):
    tenants = submittable_tenants(request.user)
    if not tenants:
        # The policy's job.submit: members and tenant admins submit; viewers and
        # platform accounts (which hold no tenant role) do not. Say why, as the API's 403 does.
        context = {
            "section": Section.JOBS,
            "is_system_admin": is_system_admin(request.user),
            "is_auditor": is_auditor(request.user),
        }
        return render(request, "frontend/jobs/cannot_submit.html", context, status=403)
    # Flavors with the most cards first: the default choice is one the pool can run.
    flavor_rows = scheduler_selectors.flavors_visible_to(request.user).annotate(cards=Count("devices"))
    flavor_rows = sorted(flavor_rows, key=lambda f: (-f.cards, f.name))
    flavors = [f.name for f in flavor_rows]
    flavor_labels = {
        f.name: _("%(name)s (%(cards)s cards in the pool)") % {"name": f.name, "cards": f.cards} for f in flavor_rows
    }
    choices = [(t.slug, f"{t.name} ({t.slug})") for t in tenants]
    form = JobSubmitForm(tenants=choices, flavors=flavors, flavor_labels=flavor_labels, prefix="f")
    json_form = JobJsonForm(prefix="j", initial={"spec_json": _example_spec(tenants[0].slug, flavors)})
    if request.method == "POST":
        use_json = "submit_json" in request.POST
        bound = (
            JobJsonForm(request.POST, prefix="j")
            if use_json
            else JobSubmitForm(request.POST, tenants=choices, flavors=flavors, flavor_labels=flavor_labels, prefix="f")
        )
        if use_json:
            json_form = bound
        else:
            form = bound
        if bound.is_valid():
            spec = bound.cleaned_data["spec_json"] if use_json else bound.spec()
            try:
                job = job_services.job_submit(actor=request.user, spec=spec, request=request)
            except DomainError as exc:
                _attach_domain_error(bound, exc)
            else:
                messages.success(request, _("Job %(id)s submitted.") % {"id": job.pk})
                return redirect("frontend:job-detail", pk=job.pk)
    context = {"section": Section.JOBS, "form": form, "json_form": json_form}
    return render(request, "frontend/jobs/submit.html", context)


def _example_spec(tenant: str, flavors: list[str]) -> str:
    example = {
        "name": "my-training",
        "tenant": tenant,
        "priority_class": "normal",
        "replicas": 1,
        "resources": {"flavors": flavors[:1] or ["nvidia-h100-80g"], "gpus": 1},
        "command": shlex.split(EXAMPLE_COMMAND),
    }
    return json.dumps(example, indent=2)


def _job_or_404(request, pk):
    try:
        return scheduler_selectors.job_get_visible(user=request.user, pk=pk)
    except NotFoundError:
        raise Http404 from None


@section_required(Section.JOBS)
def job_detail(request, pk: int):
    job = _job_or_404(request, pk)
    events = list(job.events.all())
    active = [a for a in job.allocations.all() if a.ended_at is None]
    # Tenant users get their devices' telemetry by tenant; a system admin watches the nodes themselves.
    subscribe = sorted({a.node_id for a in active}) if reaches_all(request.user, Action.TELEMETRY_VIEW) else []
    log_tail = next((e.details.get("log_tail") for e in reversed(events) if e.details.get("log_tail")), "")
    context = {
        "section": Section.JOBS,
        "job": job,
        "events": events,
        "allocations": active,
        "past_allocations": [a for a in job.allocations.all() if a.ended_at is not None],
        # A serving job's endpoints, the ports its replicas hold, what its replicas left in its output_dir.
        "endpoints": serving.job_endpoints(job),
        "ports": launch.job_ports(job),
        "outputs": list(job.outputs.order_by("replica")),
        "pending_sentence": scheduler_selectors.job_pending_sentence(job),
        "log_tail": log_tail,
        # The output panel (live logs) replaces the final log tail once the agent streams the job's output.
        "has_streamed_log": job.log_chunks.exists(),
        "log_replicas": range(scheduler_logs.replica_count(job)),
        "can_cancel": job.state not in FINAL_JOB_STATES and can_manage_job(request.user, job),
        "cancel_form": CancelForm(),
        "is_live": job.state not in FINAL_JOB_STATES,
        "chart_devices": job_chart_devices(active),
        "subscribe_json": json.dumps([{"subscribe": {"node": n}} for n in subscribe]) if subscribe else "",
        "JobState": JobState,
        # A job preempted this many times is not preempted again (``Policy.max_preemptions_per_job``).
        "churn_ceiling": policy_from_settings().max_preemptions_per_job,
        # A task of an array: the whole array counted by state, the tasks that are not jobs yet included.
        "array": (array := scheduler_selectors.job_array_summary(job)),
        "array_states": [(JobState(state).label, n) for state, n in array.states.items()] if array else [],
    }
    if request.headers.get("HX-Request"):
        rendered_state = request.GET.get("rendered_state")
        if rendered_state and rendered_state != job.state:
            # A new state means new allocations and charts: reload the whole page, not just the fragment.
            return HttpResponse(status=200, headers={"HX-Refresh": "true"})
        # 286 tells htmx to stop polling: a finished job changes no more.
        status = 286 if job.state in FINAL_JOB_STATES else 200
        return render(request, "frontend/jobs/detail_body.html", context, status=status)
    return render(request, "frontend/jobs/detail.html", context)


@require_POST
@section_required(Section.JOBS)
@action_required(Action.JOB_MANAGE)
def job_cancel(request, pk: int):
    job = _job_or_404(request, pk)
    form = CancelForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    try:
        job_services.job_cancel(job=job, actor=request.user, reason=reason, request=request)
    except DomainError as exc:
        messages.error(request, localize(exc.message))
    else:
        messages.success(request, _("Job %(id)s cancelled.") % {"id": job.pk})
    return redirect("frontend:job-detail", pk=job.pk)
