"""``GET /api/v1/jobs/{id}/outputs/`` (what each replica left in its ``output_dir``) and
``GET /api/v1/jobs/{id}/outputs/{replica}/`` (the .tar.gz): for whoever may read the job (another tenant: 404)."""

from __future__ import annotations

from django.http import FileResponse
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from kernel.access_rules import Action
from kernel.api import NotFoundError
from scheduler import messages as scheduler_messages
from scheduler.models import JobOutput
from scheduler.selectors import jobs_visible_to

OUTPUT_LIST_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "replica": {"type": "integer"},
            "size_bytes": {"type": "integer"},
            "sha256": {"type": "string"},
            "created_at": {"type": "string", "format": "date-time"},
            "download_url": {"type": "string", "format": "uri"},
        },
    },
}


def _visible_job(request: Request, pk: int):
    job = jobs_visible_to(request.user).filter(pk=pk).first()
    if job is None:
        raise NotFoundError(scheduler_messages.NO_JOB_ID_VISIBLE_YOU(pk=pk))
    return job


class JobOutputListView(APIView):
    policy_actions = {"get": Action.JOB_VIEW}
    policy_hides_objects = True

    @extend_schema(
        operation_id="v1_jobs_outputs_list",
        summary="The outputs a job's replicas left (collected when each ended)",
        # A plain schema, not a serializer component (see spec_schema.ports).
        responses={200: OUTPUT_LIST_SCHEMA},
    )
    def get(self, request: Request, pk: int) -> Response:
        job = _visible_job(request, pk)
        rows = JobOutput.objects.filter(job=job).order_by("replica")
        return Response(
            [
                {
                    "replica": row.replica,
                    "size_bytes": row.size_bytes,
                    "sha256": row.sha256,
                    "created_at": row.created_at,
                    "download_url": reverse("job-output", args=[job.pk, row.replica], request=request),
                }
                for row in rows
            ]
        )


class JobOutputDownloadView(APIView):
    policy_actions = {"get": Action.JOB_VIEW}
    policy_hides_objects = True

    @extend_schema(
        operation_id="v1_jobs_outputs_download",
        summary="Download one replica's output (.tar.gz)",
        responses={200: bytes},
    )
    def get(self, request: Request, pk: int, replica: int) -> FileResponse:
        job = _visible_job(request, pk)
        row = JobOutput.objects.filter(job=job, replica=replica).first()
        if row is None:
            raise NotFoundError(f"Job {pk} has no output of replica {replica} (yet).")
        return FileResponse(
            row.file.open("rb"),
            as_attachment=True,
            filename=f"job-{pk}-replica-{replica}-output.tar.gz",
            content_type="application/gzip",
        )
