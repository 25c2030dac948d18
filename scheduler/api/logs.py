"""``GET /api/v1/jobs/{id}/logs/``: a job's output by byte offset, while it runs and after (``scheduler.logs``).

JSON by default; ``?format=text`` answers ``text/plain`` of the same slice (with ``download=1`` as an attachment),
its ``next_offset``, ``complete`` and ``truncated_before`` in ``X-Log-*`` headers.
"""

from __future__ import annotations

import json

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.access_rules import Action
from scheduler import logs


class PlainTextRenderer(BaseRenderer):
    """``?format=text``: the log's text as it is; an error as its JSON."""

    media_type = "text/plain"
    format = "text"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        if isinstance(data, str):
            return data.encode("utf-8")
        return json.dumps(data, ensure_ascii=False).encode("utf-8")


class JobLogQuerySerializer(serializers.Serializer):
    replica = serializers.IntegerField(min_value=0, default=0, help_text="Which replica's log (0 = the first).")
    offset = serializers.IntegerField(
        min_value=0, max_value=2**63 - 1, default=0, help_text="Byte offset to read from: 0, or a `next_offset`."
    )
    limit_bytes = serializers.IntegerField(
        min_value=16,
        max_value=logs.MAX_SLICE_BYTES,
        required=False,
        help_text=f"The most bytes of text to return (default {logs.DEFAULT_SLICE_BYTES}; with format=text, "
        f"{logs.MAX_SLICE_BYTES}).",
    )
    download = serializers.BooleanField(default=False, help_text="With format=text: as a file to save.")

    def validate_replica(self, value: int) -> int:
        count = logs.replica_count(self.context["job"])
        if value >= count:
            raise serializers.ValidationError(
                f"this job has {count} replica(s): ask for replica 0 to {count - 1}.", code="invalid_replica"
            )
        return value


class JobLogSliceSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    replica = serializers.IntegerField()
    offset = serializers.IntegerField(help_text="The offset asked for.")
    next_offset = serializers.IntegerField(help_text="Where to read on (the same offset when there is no more yet).")
    text = serializers.CharField(help_text="UTF-8 text of the log from `offset` (or from `truncated_before`).")
    complete = serializers.BooleanField(help_text="True when the job has finished and no more output will come.")
    truncated_before = serializers.IntegerField(help_text="The first offset still kept; 0 when nothing was cut.")


class JobLogView(APIView):
    """A job's output, for whoever may see the job."""

    renderer_classes = [JSONRenderer, PlainTextRenderer]
    policy_actions = {"get": Action.JOB_VIEW}
    policy_hides_objects = True

    def finalize_response(self, request: Request, response: Response, *args, **kwargs) -> Response:
        """Errors are the API's JSON ``{"code", "detail"}`` whatever format the text was asked in."""
        response = super().finalize_response(request, response, *args, **kwargs)
        if response.status_code >= 400 and isinstance(response.accepted_renderer, PlainTextRenderer):
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = JSONRenderer.media_type
        return response

    @extend_schema(
        operation_id="jobs_logs_retrieve",
        summary="A job's output (live while it runs), read by byte offset",
        description=(
            "Text of one replica's log from `offset`. Read on with `offset=next_offset` until `complete`; a "
            "follower asks again every few seconds (or follows `ws/jobs/{id}/logs/`). Each replica keeps its newest "
            "`GPUPOOL_JOB_LOG_MAX_BYTES` (8 MiB) and finished jobs' logs are kept "
            "`GPUPOOL_JOB_LOG_RETENTION_DAYS` (30). `format=text` answers text/plain (with `download=1` as a file)."
        ),
        parameters=[
            JobLogQuerySerializer,
            OpenApiParameter("format", str, enum=["json", "text"], description="json (default) or text."),
        ],
        responses={(200, "application/json"): JobLogSliceSerializer, (200, "text/plain"): OpenApiTypes.STR},
        examples=[
            OpenApiExample(
                "Output so far",
                response_only=True,
                value={
                    "job": 42,
                    "replica": 0,
                    "offset": 0,
                    "next_offset": 27,
                    "text": "epoch 1 loss 0.91\nepoch 2 ",
                    "complete": False,
                    "truncated_before": 0,
                },
            )
        ],
    )
    def get(self, request: Request, pk: int) -> Response:
        job = logs.job_get_readable(user=request.user, pk=pk)
        query = JobLogQuerySerializer(data=request.query_params, context={"job": job})
        query.is_valid(raise_exception=True)
        as_text = request.accepted_renderer.format == "text"
        default_limit = logs.MAX_SLICE_BYTES if as_text else logs.DEFAULT_SLICE_BYTES
        piece = logs.job_log_slice(
            job=job,
            replica=query.validated_data["replica"],
            offset=query.validated_data["offset"],
            limit_bytes=query.validated_data.get("limit_bytes", default_limit),
        )
        if not as_text:
            return Response(piece.as_dict())
        response = Response(piece.text, content_type="text/plain; charset=utf-8")
        response["X-Log-Next-Offset"] = str(piece.next_offset)
        response["X-Log-Complete"] = "true" if piece.complete else "false"
        response["X-Log-Truncated-Before"] = str(piece.truncated_before)
        if query.validated_data["download"]:
            name = f"job-{job.pk}-replica-{piece.replica}.log"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
