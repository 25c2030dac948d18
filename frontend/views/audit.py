"""The audit trail, for auditors only: a searchable table, one record with its opened details, the chain's
verification (run on demand, result kept in the trail itself) and the export bundle."""

from __future__ import annotations

import datetime

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST
from django_tables2 import RequestConfig

from audit import selectors as audit_selectors
from audit import transparency
from audit.exports import build_bundle
from audit.models import AuditRecord
from audit.services import record_details, witness_genesis
from audit.trail_verifier import verify_trail
from audit.witness import WitnessError
from frontend.access import Section, action_required, section_required
from frontend.admin_forms import tenant_choices
from frontend.audit_details import audit_details
from frontend.export import export_response
from frontend.filtersets import AuditFilterSet
from frontend.forms import AuditExportForm
from frontend.service_text import localize
from frontend.tables import AuditTable
from kernel.access_rules import Action
from kernel.api import DomainError
from tenants import selectors as tenant_selectors
from tenants.models import Tenant


def _records(request):
    return audit_selectors.records_for(request.user).defer("ciphertext")


def _tenant_choices(request) -> list[tuple[str, str]]:
    """(id, "ACME / Research (acme-research)") of every tenant the auditor may pick, by name."""
    return tenant_choices(list(tenant_selectors.tenants_visible_to(request.user)))


def last_verification(user) -> AuditRecord | None:
    """The latest ``audit.verify`` run (every run is itself an audit record)."""
    return audit_selectors.records_for(user, action="audit.verify").defer("ciphertext").first()


def _trust_root() -> tuple[str, str, str]:
    """(fingerprint, witness key, error) of this log's trust root, from the witness (never from the database)."""
    try:
        genesis = witness_genesis()
    except WitnessError as exc:
        return "", "", str(exc)
    return transparency.trust_root_fingerprint(genesis), genesis["statement"]["witness_key"], ""


@section_required(Section.AUDIT)
def audit_list(request):
    filterset = AuditFilterSet(request.GET, queryset=_records(request), tenants=_tenant_choices(request))
    table = AuditTable(filterset.qs)
    if request.GET.get("export") == "csv":
        RequestConfig(request, paginate=False).configure(table)
        return export_response(table, fmt="csv", filename="audit-records")
    RequestConfig(request, paginate={"per_page": 50}).configure(table)
    verification = last_verification(request.user)
    trust_root, witness_key, trust_root_error = _trust_root()
    context = {
        "trust_root": trust_root,
        "witness_key": witness_key,
        "trust_root_error": trust_root_error,
        "section": Section.AUDIT,
        "filter": filterset,
        "table": table,
        "verification": verification,
        "verification_details": record_details(verification) if verification else None,
        "export_form": AuditExportForm(
            initial={"start": (timezone.now() - datetime.timedelta(days=7)).date()}, tenants=_tenant_choices(request)
        ),
    }
    return render(request, "frontend/audit/list.html", context)


@section_required(Section.AUDIT)
def audit_detail(request, pk: int):
    record = audit_selectors.records_for(request.user).filter(pk=pk).first()
    if record is None:
        raise Http404
    details = record_details(record)
    context = {
        "section": Section.AUDIT,
        "record": record,
        "details": audit_details(details),
        "tenant": Tenant.objects.filter(pk=record.tenant_id).first() if record.tenant_id else None,
    }
    return render(request, "frontend/audit/detail.html", context)


@require_POST
@section_required(Section.AUDIT)
@action_required(Action.AUDIT_VERIFY)
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
            % {"n": len(report.findings), "first": _("; ").join(localize(f.message) for f in report.findings[:3])},
        )
    return redirect("frontend:audit")


@require_POST
@section_required(Section.AUDIT)
@action_required(Action.AUDIT_EXPORT)
def audit_export(request):
    """A signed bundle (records JSONL + CSV, manifest, checkpoints, public key) that ``python -m audit.bundle_verifier``
    checks offline. POST because it is itself an audited action."""
    form = AuditExportForm(request.POST, tenants=_tenant_choices(request))
    if not form.is_valid():
        messages.error(request, " ".join(" ".join(errors) for errors in form.errors.values()))
        return redirect("frontend:audit")
    start, end = form.range()
    try:
        body, manifest = build_bundle(actor=request.user, start=start, end=end, tenant_id=form.cleaned_data["tenant"])
    except DomainError as exc:
        messages.error(request, localize(exc.message))
        return redirect("frontend:audit")
    response = HttpResponse(body, content_type="application/zip")
    stamp = manifest["created_at"][:19].replace(":", "").replace("-", "")
    response["Content-Disposition"] = f'attachment; filename="gpupool-audit-{stamp}.zip"'
    return response
