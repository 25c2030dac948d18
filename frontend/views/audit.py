"""The audit trail, for auditors only: a searchable table, one record with its opened details, the chain's
verification (run on demand, result kept in the trail itself) and the export bundle."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST
from django_tables2 import RequestConfig

from audit.models import AuditRecord
from audit.services import record_details
from audit.verification import verify_trail
from frontend.access import Section, section_required
from frontend.export import export_response
from frontend.filtersets import AuditFilterSet
from frontend.tables import AuditTable


def _records():
    return AuditRecord.objects.defer("ciphertext").order_by("-id")


def last_verification() -> AuditRecord | None:
    """The latest ``audit.verify`` run (every run is itself an audit record)."""
    return AuditRecord.objects.defer("ciphertext").filter(action="audit.verify").order_by("-id").first()


@section_required(Section.AUDIT)
def audit_list(request):
    filterset = AuditFilterSet(request.GET, queryset=_records())
    table = AuditTable(filterset.qs)
    if request.GET.get("export") == "csv":
        RequestConfig(request, paginate=False).configure(table)
        return export_response(table, fmt="csv", filename="audit-records")
    RequestConfig(request, paginate={"per_page": 50}).configure(table)
    verification = last_verification()
    context = {
        "section": Section.AUDIT,
        "filter": filterset,
        "table": table,
        "verification": verification,
        "verification_details": record_details(verification) if verification else None,
    }
    return render(request, "frontend/audit/list.html", context)


@section_required(Section.AUDIT)
def audit_detail(request, pk: int):
    record = AuditRecord.objects.filter(pk=pk).first()
    if record is None:
        raise Http404
    context = {"section": Section.AUDIT, "record": record, "details": record_details(record)}
    return render(request, "frontend/audit/detail.html", context)


@require_POST
@section_required(Section.AUDIT)
def audit_verify(request):
    report = verify_trail(actor=request.user)
    if report.ok:
        messages.success(
            request,
            _("The audit trail verifies: %(records)s records in %(streams)s streams, %(checkpoints)s checkpoints.")
            % {"records": report.records, "streams": report.streams, "checkpoints": report.checkpoints},
        )
    else:
        messages.error(
            request,
            _("Verification found %(n)s problem(s): %(first)s")
            % {"n": len(report.findings), "first": "; ".join(f.message for f in report.findings[:3])},
        )
    return redirect("frontend:audit")
