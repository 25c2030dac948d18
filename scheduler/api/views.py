"""The scheduler's REST API: jobs (submit, list, detail, cancel), devices (read) and flavors (read; create);
nodes are the fleet's (``scheduler.fleet.api.views.NodeViewSet``). Views validate the shape and call one service."""

from __future__ import annotations

from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from kernel.access_rules import Action
from kernel.api import DomainError
from scheduler import idempotency, selectors
from scheduler import messages as scheduler_messages
from scheduler.api import serializers as s
from scheduler.api.spec_schema import JOB_SPEC_EXAMPLE, JobSpec
from scheduler.filtersets import DeviceFilterSet, JobFilterSet
from scheduler.fleet.services.nodes import flavor_create
from scheduler.models import Job
from scheduler.services.arrays import array_task, job_array_cancel
from scheduler.services.jobs import job_cancel
from scheduler.services.scaling import inference_load_report, job_scale

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
IDEMPOTENT_REPLAYED_HEADER = "Idempotent-Replayed"
SUBMIT_RESULT = PolymorphicProxySerializer(
    component_name="JobSubmitResult",
    serializers=[s.JobDetailSerializer, s.JobArraySerializer],
    resource_type_field_name=None,
)


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Jobs of the tenants you can see. ``POST /jobs/`` submits a JSON job spec (see the README)."""

    filterset_class = JobFilterSet
    policy_actions = {
        "list": Action.JOB_VIEW,
        "retrieve": Action.JOB_VIEW,
        "create": Action.JOB_SUBMIT,
        "array_cancel": Action.JOB_MANAGE,
        "array_detail": Action.JOB_VIEW,
        "array_task": Action.JOB_VIEW,
        "cancel": Action.JOB_MANAGE,
        "scale": Action.JOB_MANAGE,
        "load": Action.JOB_MANAGE,
    }
    policy_body_object = ("create",)  # the tenant named in the spec
    policy_hides_objects = True
    ordering_fields = ["id", "submitted_at", "started_at", "finished_at", "priority_class", "state", "name"]
    search_fields = ["name", "submitter__username", "tenant__slug"]

    def get_queryset(self):
        return selectors.jobs_visible_to(self.request.user)

    def get_serializer_class(self):
        return s.JobDetailSerializer if self.action == "retrieve" else s.JobSerializer

    def get_object(self):
        job = selectors.job_get_visible(user=self.request.user, pk=self.kwargs["pk"])
        self.check_object_permissions(self.request, job)
        return job

    @extend_schema(
        summary="Submit a job, or an array of N independent jobs",
        description=(
            'The body is a job spec (see the README). With `"array": {"count": N}` (1..10,000) it creates N '
            "independent jobs of that spec in one transaction; job i gets `GPUPOOL_ARRAY_INDEX=i` (and "
            "`GPUPOOL_ARRAY_ID`, `GPUPOOL_ARRAY_COUNT`) in its env, and the answer is the array, not a job. "
            "List an array's jobs with `GET /jobs/?array=<array_id>`, cancel them with "
            "`POST /jobs/arrays/<array_id>/cancel/`."
        ),
        request=JobSpec,
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_KEY_HEADER,
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": idempotency.MAX_IDEMPOTENCY_KEY_LENGTH,
                    "pattern": "^[!-~]+$",
                },
                OpenApiParameter.HEADER,
                required=False,
                description=(
                    "Makes a retried submit safe: the first submit with a key creates the job (201); a later one "
                    "with the same key and the same spec creates nothing and answers that job or array (200, "
                    f"`{IDEMPOTENT_REPLAYED_HEADER}: true`); the same key with another spec is refused (422 "
                    "`idempotency_key_reused`). 1-128 printable ASCII characters, e.g. a UUID; per submitter."
                ),
            )
        ],
        responses={
            201: SUBMIT_RESULT,
            200: OpenApiResponse(
                SUBMIT_RESULT,
                description="A replay: an earlier submit with the same Idempotency-Key created this job or array.",
            ),
            404: OpenApiResponse(description="The spec names a tenant that does not exist or is not visible to you."),
            422: OpenApiResponse(
                description="The Idempotency-Key was used before for a different spec (`idempotency_key_reused`)."
            ),
        },
        examples=[
            OpenApiExample("One job", request_only=True, value=JOB_SPEC_EXAMPLE),
            OpenApiExample(
                "An array of 1,000 jobs",
                request_only=True,
                value={
                    "name": "sweep",
                    "tenant": "acme-vision",
                    "resources": {"flavors": ["nvidia-h100-80g"], "millis": 100, "memory_mib": 4096},
                    "command": ["python", "sweep.py"],
                    "array": {"count": 1000},
                },
            ),
            OpenApiExample(
                "The array created (an array of 3 shown)",
                response_only=True,
                status_codes=["201"],
                value={
                    "array_id": "0b7c6a9e-2f0e-4c55-9d7b-3f1f7c1f2a10",
                    "count": 3,
                    "tenant": "acme-vision",
                    "name": "sweep",
                    "state": "queued",
                    "first_job_id": 4101,
                    "last_job_id": 4103,
                    "job_ids": [4101, 4102, 4103],
                    "jobs_url": "https://pool.example.com/api/v1/jobs/?array=0b7c6a9e-2f0e-4c55-9d7b-3f1f7c1f2a10",
                    "cancel_url": (
                        "https://pool.example.com/api/v1/jobs/arrays/0b7c6a9e-2f0e-4c55-9d7b-3f1f7c1f2a10/cancel/"
                    ),
                },
            ),
        ],
    )
    def create(self, request: Request) -> Response:
        outcome = idempotency.job_submit_request(
            actor=request.user,
            spec=request.data,
            idempotency_key=request.headers.get(IDEMPOTENCY_KEY_HEADER),
            request=request,
        )
        if outcome.array is not None:
            body = s.JobArraySerializer(outcome.array, context={"request": request}).data
        else:
            # A new job comes with its events loaded: serialized as written, nothing read back.
            body = s.JobDetailSerializer(outcome.job).data
        if outcome.replayed:
            return Response(body, status=status.HTTP_200_OK, headers={IDEMPOTENT_REPLAYED_HEADER: "true"})
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Cancel the tasks of an array that have not ended (all, or some indices)",
        request=s.JobCancelSerializer,
        responses={200: s.JobArrayCancelledSerializer},
    )
    @action(
        detail=False,
        methods=["post"],
        url_path=r"arrays/(?P<array_id>[0-9a-fA-F-]{36})/cancel",
        url_name="array-cancel",
    )
    def array_cancel(self, request: Request, array_id: str) -> Response:
        array_uuid = selectors.job_array_get_visible(user=request.user, array_id=array_id)
        data = s.JobCancelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        result = job_array_cancel(
            array_id=array_uuid,
            actor=request.user,
            reason=data.validated_data["reason"],
            indices=data.validated_data["indices"],
            request=request,
        )
        return Response(s.JobArrayCancelledSerializer(result).data)

    @extend_schema(summary="An array: every task counted by state", responses={200: s.JobArraySerializer})
    @action(
        detail=False,
        methods=["get"],
        url_path=r"arrays/(?P<array_id>[0-9a-fA-F-]{36})",
        url_name="array-detail",
    )
    def array_detail(self, request: Request, array_id: str) -> Response:
        array = selectors.job_array_record_visible(user=request.user, array_id=array_id)
        return Response(s.JobArraySerializer(selectors.array_state(array), context={"request": request}).data)

    @extend_schema(
        summary="Task <index> of an array as a job (made a job now if it was still waiting)",
        responses={200: s.JobDetailSerializer},
    )
    @action(
        detail=False,
        methods=["get"],
        url_path=r"arrays/(?P<array_id>[0-9a-fA-F-]{36})/tasks/(?P<index>[0-9]{1,9})",
        url_name="array-task",
    )
    def array_task(self, request: Request, array_id: str, index: str) -> Response:
        array = selectors.job_array_record_visible(user=request.user, array_id=array_id)
        return _job_detail(request, array_task(array=array, index=int(index)))

    @extend_schema(request=s.JobCancelSerializer, responses={200: s.JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        data = s.JobCancelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if data.validated_data["indices"] is not None:
            raise DomainError(scheduler_messages.INDICES_ONLY_ARRAY_CANCEL(), code="invalid_indices", field="indices")
        job_cancel(job=job, actor=request.user, reason=data.validated_data["reason"], request=request)
        return _job_detail(request, job)

    @extend_schema(request=s.JobScaleSerializer, responses={200: s.JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def scale(self, request: Request, pk: str) -> Response:
        """Inference: set the replicas wanted now (within min_replicas..max_replicas)."""
        job = self.get_object()
        data = s.JobScaleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job_scale(job=job, replicas=data.validated_data["replicas"], actor=request.user, request=request)
        return _job_detail(request, job)

    @extend_schema(request=s.JobLoadSerializer, responses={200: s.JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def load(self, request: Request, pk: str) -> Response:
        """Inference: report the load per replica; the service scales to keep it near the target."""
        job = self.get_object()
        data = s.JobLoadSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        inference_load_report(job=job, load=data.validated_data["load"], actor=request.user, request=request)
        return _job_detail(request, job)


def _job_detail(request: Request, job: Job) -> Response:
    """The job as its caller now sees it, after an action changed it."""
    return Response(s.JobDetailSerializer(selectors.job_get_visible(user=request.user, pk=job.pk)).data)


class DeviceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = s.DeviceSerializer
    filterset_class = DeviceFilterSet
    policy_actions = {"list": Action.NODE_VIEW, "retrieve": Action.NODE_VIEW}

    def get_queryset(self):
        return selectors.devices_visible_to(self.request.user)

    def list(self, request: Request, *args, **kwargs) -> Response:
        # One read of the latest telemetry for the page's nodes (gpupool-cli top polls this).
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        live = selectors.latest_telemetry({device.node_id for device in page})
        serializer = self.get_serializer(page, many=True, context={**self.get_serializer_context(), "live": live})
        return self.get_paginated_response(serializer.data)

    def retrieve(self, request: Request, *args, **kwargs) -> Response:
        device = self.get_object()
        live = selectors.latest_telemetry({device.node_id})
        return Response(self.get_serializer(device, context={**self.get_serializer_context(), "live": live}).data)


class FlavorViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Resource flavors. System admins create them."""

    serializer_class = s.FlavorSerializer
    policy_actions = {"list": Action.FLAVOR_VIEW, "retrieve": Action.FLAVOR_VIEW, "create": Action.FLAVOR_CREATE}

    def get_queryset(self):
        return selectors.flavors_visible_to(self.request.user)

    @extend_schema(request=s.FlavorCreateSerializer, responses={201: s.FlavorSerializer})
    def create(self, request: Request) -> Response:
        data = s.FlavorCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        flavor = flavor_create(actor=request.user, **data.validated_data)
        return Response(s.FlavorSerializer(flavor).data, status=status.HTTP_201_CREATED)
