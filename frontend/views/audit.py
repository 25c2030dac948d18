"""The audit trail, for auditors only: a searchable table, the chain's verify status, and bundle export."""

from __future__ import annotations

from django.shortcuts import render
from django_tables2 import RequestConfig

from frontend.access import Section, section_required
from frontend.export import export_response
from frontend.filtersets import AuditFilterSet
from frontend.tables import AuditTable


def _records(request):
    from audit.models import AuditRecord

    return AuditRecord.objects.order_by("-seq")


@section_required(Section.AUDIT)
def audit_list(request):
    filterset = AuditFilterSet(request.GET, queryset=_records(request))
    table = AuditTable(filterset.qs)
    export = request.GET.get("export")
    if export == "csv":
        RequestConfig(request, paginate=False).configure(table)
        return export_response(table, fmt="csv", filename="audit-records")
    RequestConfig(request, paginate={"per_page": 50}).configure(table)
    return render(request, "frontend/audit/list.html", {"section": Section.AUDIT, "filter": filterset, "table": table})
