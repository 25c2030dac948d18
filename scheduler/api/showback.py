"""What a tenant uses: ``GET /api/v1/tenants/{id}/quota-usage/`` (its quota and use now, per flavor) and
``GET /api/v1/usage/`` (showback: device-hours and cost over a range, as JSON, CSV or XLSX).

Both read the scheduler's allocations, so they are the scheduler's endpoints, though their URLs sit beside
the tenants' (and keep the paths and shapes they always had).
"""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.access_rules import Action
from kernel.filters import MAX_ID
from scheduler.quota_usage import quota_usage
from scheduler.showback import PERIODS, report_csv, report_xlsx, usage_report
from tenants import selectors as tenant_selectors

ERROR = OpenApiResponse(description='Error: {"code": "...", "detail": "..."}')
ERRORS = {400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR}
XLSX_CONTENT_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


class QuotaUsageSerializer(serializers.Serializer):
    flavor = serializers.CharField()
    guaranteed = serializers.IntegerField()
    limit = serializers.IntegerField(allow_null=True)
    lending_limit = serializers.IntegerField(allow_null=True)
    in_use = serializers.IntegerField()
    borrowed = serializers.IntegerField()
    lent = serializers.IntegerField()
    available_to_borrow = serializers.IntegerField()
    guaranteed_memory_mib = serializers.IntegerField()
    memory_in_use_mib = serializers.IntegerField()
    running_jobs = serializers.IntegerField()
    max_running_jobs = serializers.IntegerField(allow_null=True)


class UsageQuerySerializer(serializers.Serializer):
    start = serializers.DateTimeField(help_text="from (inclusive)")
    end = serializers.DateTimeField(help_text="to (exclusive)")
    period = serializers.ChoiceField(choices=list(PERIODS), default="day")
    tenant = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID, help_text="subtree of this id")
    export = serializers.ChoiceField(choices=["json", "csv", "xlsx"], default="json")
    detail = serializers.BooleanField(default=False, help_text="CSV: one row per user and job")

    def validate(self, attrs: dict) -> dict:
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": ["'end' must be after 'start'."]})
        if (attrs["end"] - attrs["start"]).days > 400:
            raise serializers.ValidationError({"end": ["A report covers at most 400 days."]})
        return attrs


class UsageRowSerializer(serializers.Serializer):
    period_start = serializers.DateField()
    tenant = serializers.CharField()
    flavor = serializers.CharField()
    user = serializers.CharField()
    job_id = serializers.IntegerField()
    device_hours = serializers.DecimalField(max_digits=20, decimal_places=4)
    cost = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True)


class TenantUsageSerializer(serializers.Serializer):
    period_start = serializers.DateField()
    tenant = serializers.CharField()
    parent = serializers.CharField(allow_null=True)
    flavor = serializers.CharField()
    own_device_hours = serializers.DecimalField(max_digits=20, decimal_places=4)
    subtree_device_hours = serializers.DecimalField(max_digits=20, decimal_places=4)
    subtree_cost = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True)


class UsageReportSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    period = serializers.CharField()
    currency = serializers.CharField()
    tenants = TenantUsageSerializer(many=True)
    rows = UsageRowSerializer(many=True)


class TenantQuotaUsageView(APIView):
    policy_actions = {"get": Action.QUOTA_VIEW}
    policy_hides_objects = True

    @extend_schema(
        summary="Quota and current use of a tenant, per flavor (millis; 1000 = one card)",
        responses={200: QuotaUsageSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request, pk: str) -> Response:
        tenant = tenant_selectors.tenant_get_visible(user=request.user, pk=pk)
        usage = quota_usage(tenant)
        return Response([{"flavor": name, **values} for name, values in usage.items()])


class UsageReportView(APIView):
    """Showback: device-hours per tenant (rolled up the tree), flavor, user and job, for the tenants you see."""

    policy_actions = {"get": Action.USAGE_VIEW}
    policy_hides_objects = True  # the tenant of ?tenant=

    @extend_schema(
        summary="Usage report (device-hours, cost) as JSON, CSV or XLSX",
        parameters=[UsageQuerySerializer],
        responses={200: UsageReportSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response | HttpResponse:
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        visible = list(tenant_selectors.tenants_usage_visible_to(request.user).values_list("pk", flat=True))
        tenant_ids = visible
        if params.get("tenant"):
            root = tenant_selectors.tenant_get_visible(user=request.user, pk=params["tenant"])
            tenant_ids = [pk for pk in tenant_selectors.tenant_subtree_ids(root) if pk in set(visible)]
        report = usage_report(start=params["start"], end=params["end"], period=params["period"], tenant_ids=tenant_ids)
        stem = f"gpupool-usage-{params['start']:%Y%m%d}-{params['end']:%Y%m%d}"
        if params["export"] == "csv":
            response = HttpResponse(
                report_csv(report, kind="detail" if params["detail"] else "tenants"),
                content_type="text/csv; charset=utf-8",
            )
            response["Content-Disposition"] = f'attachment; filename="{stem}.csv"'
            return response
        if params["export"] == "xlsx":
            response = HttpResponse(report_xlsx(report), content_type=XLSX_CONTENT_TYPE)
            response["Content-Disposition"] = f'attachment; filename="{stem}.xlsx"'
            return response
        return Response(UsageReportSerializer(report).data)
