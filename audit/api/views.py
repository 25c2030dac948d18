"""/api/v1/audit/: search and read records, verification status, signed export bundles. Auditors only."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.api.serializers import AuditRecordSerializer, ExportQuerySerializer, VerificationSerializer
from audit.exports import build_bundle
from audit.filtersets import AuditRecordFilterSet
from audit.models import AuditRecord
from audit.permissions import AuditTrailPermission
from audit.selectors import readable, records_for
from audit.services import audit_record
from audit.trail_verifier import verify_trail
from kernel.access_rules import Action

# Signed in first (an anonymous probe is a 401, not an audited refusal), then the audited policy check.
AUDITOR_ONLY = [APIView.permission_classes[0], AuditTrailPermission, *APIView.permission_classes[1:]]


class AuditRecordListView(generics.ListAPIView):
    """Search audit records (newest first). Filters: created_after, created_before, actor, actor_id, tenant,
    action (prefix), outcome, stream, target, request_id, q (free text, as the console's search box). Every
    search is itself audited."""

    permission_classes = AUDITOR_ONLY
    policy_actions = {"get": Action.AUDIT_VIEW}
    serializer_class = AuditRecordSerializer
    filterset_class = AuditRecordFilterSet
    queryset = AuditRecord.objects.none()

    def get_queryset(self):
        return records_for(self.request.user)

    def list(self, request: Request, *args, **kwargs) -> Response:
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        rows = page if page is not None else list(queryset)
        audit_record(
            action="audit.search",
            actor=request.user,
            target="audit:records",
            details={"filters": {k: v for k, v in request.query_params.items()}, "returned": len(rows)},
            request=request,
        )
        data = self.get_serializer(readable(list(rows)), many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)


class AuditRecordDetailView(generics.RetrieveAPIView):
    permission_classes = AUDITOR_ONLY
    policy_actions = {"get": Action.AUDIT_VIEW}
    serializer_class = AuditRecordSerializer
    queryset = AuditRecord.objects.none()

    def get_queryset(self):
        return records_for(self.request.user)

    def retrieve(self, request: Request, *args, **kwargs) -> Response:
        record = self.get_object()
        audit_record(action="audit.read", actor=request.user, target=f"audit:{record.pk}", request=request)
        return Response(self.get_serializer(readable([record])[0]).data)


class AuditVerifyView(APIView):
    """Verify the whole trail now (chains, seals, checkpoints, witness). The run is audited; a failure also
    records ``audit.tamper_detected`` and raises an alert."""

    permission_classes = AUDITOR_ONLY
    policy_actions = {"get": Action.AUDIT_VERIFY}

    @extend_schema(responses=VerificationSerializer)
    def get(self, request: Request) -> Response:
        report = verify_trail(actor=request.user)
        return Response(VerificationSerializer(report.as_dict()).data)


class AuditExportView(APIView):
    """Download a signed bundle of the records in [start, end) (optionally one tenant's stream); check it
    offline with ``python -m audit.bundle_verifier bundle.zip``. Exports are audited."""

    permission_classes = AUDITOR_ONLY
    policy_actions = {"get": Action.AUDIT_EXPORT}

    @extend_schema(parameters=[ExportQuerySerializer], responses={200: OpenApiResponse(description="zip bundle")})
    def get(self, request: Request) -> HttpResponse:
        query = ExportQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        body, manifest = build_bundle(
            actor=request.user,
            start=query.validated_data["start"],
            end=query.validated_data["end"],
            tenant_id=query.validated_data["tenant"],
        )
        response = HttpResponse(body, content_type="application/zip")
        stamp = manifest["created_at"][:19].replace(":", "").replace("-", "")
        response["Content-Disposition"] = f'attachment; filename="gpupool-audit-{stamp}.zip"'
        response["X-Audit-Signing-Key"] = manifest["signing_key_id"]
        response["X-Audit-Trust-Root"] = manifest["trust_root"]
        return response
