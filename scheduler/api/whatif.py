"""System admins: ``POST /api/v1/whatif/`` (replay the last days under the current and a proposed policy) and
``GET /api/v1/trace-export/`` (the job history as a zip in gpupool's trace format). Both are synchronous; a
what-if of more than ``scheduler.whatif_history.WEB_MAX_JOBS`` jobs is refused (use ``gpupool whatif``)."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.access_rules import Action
from scheduler.sim.traceformat import FORMATS
from scheduler.trace_export import MAX_WINDOW_DAYS, trace_export, window_bounds
from scheduler.whatif_history import WEB_MAX_JOBS, whatif_run


class WhatIfRequestSerializer(serializers.Serializer):
    days = serializers.FloatField(
        min_value=0.001, max_value=MAX_WINDOW_DAYS, default=30, help_text="Replay the jobs of the last N days."
    )
    set = serializers.DictField(
        child=serializers.JSONField(),
        allow_empty=False,
        help_text='Proposed scheduler settings (Policy fields), e.g. {"preemption": false}.',
    )


class TraceExportQuerySerializer(serializers.Serializer):
    since = serializers.DateTimeField(required=False, help_text="Window start (default: `days` before `until`).")
    until = serializers.DateTimeField(required=False, help_text="Window end, exclusive (default: now).")
    days = serializers.FloatField(required=False, min_value=0.001, max_value=MAX_WINDOW_DAYS)
    file_format = serializers.ChoiceField(choices=FORMATS, default="csv", help_text="Format of the files in the zip.")


class WhatIfView(APIView):
    """The last `days` replayed under the policy in force and with `set` changed, side by side."""

    policy_actions = {"post": Action.WHATIF_RUN}

    @extend_schema(
        summary="What-if: replay recent history under a proposed scheduler policy",
        request=WhatIfRequestSerializer,
        responses={200: OpenApiTypes.OBJECT},
        examples=[
            OpenApiExample(
                "Turn preemption off",
                request_only=True,
                value={"days": 30, "set": {"preemption": False, "min_runtime_before_preempt_s": 900}},
            )
        ],
    )
    def post(self, request: Request) -> Response:
        data = WhatIfRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        result = whatif_run(
            actor=request.user,
            changes=data.validated_data["set"],
            days=data.validated_data["days"],
            max_jobs=WEB_MAX_JOBS,
        )
        return Response(result.as_dict())


class TraceExportView(APIView):
    """The jobs submitted in a window, the inventory and the quota tree, as a zip of the trace files."""

    policy_actions = {"get": Action.TRACE_EXPORT}

    @extend_schema(
        summary="Export the job history in gpupool's trace format (zip)",
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATETIME),
            OpenApiParameter("until", OpenApiTypes.DATETIME),
            OpenApiParameter("days", OpenApiTypes.NUMBER),
            OpenApiParameter("file_format", OpenApiTypes.STR, enum=list(FORMATS)),
        ],
        responses={(200, "application/zip"): OpenApiTypes.BINARY},
    )
    def get(self, request: Request) -> HttpResponse:
        query = TraceExportQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        since, until = window_bounds(days=params.get("days"), since=params.get("since"), until=params.get("until"))
        window = trace_export(actor=request.user, since=since, until=until, request=request)
        response = HttpResponse(window.zip_bytes(params["file_format"]), content_type="application/zip")
        name = f"gpupool-trace-{since:%Y%m%d}-{until:%Y%m%d}.zip"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
