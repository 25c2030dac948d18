"""``GET /api/v1/serving/auth/{job}/{name}/``: the serving proxy's access check (Caddy's ``forward_auth``).

Caddy sends the caller's cookie or bearer token here before each request to a job's endpoint
(``scheduler.serving``): 200 lets the request through (``X-Gpupool-User`` names the caller to the job), 401 asks for
credentials, 404 answers "no such endpoint" for a job the caller may not use as for one that does not exist.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.access_rules import Action
from kernel.api import NotFoundError
from scheduler.launch import named_ports_of
from scheduler.models import Job
from tenants.access import restrict


class ServingAuthView(APIView):
    policy_actions = {"get": Action.JOB_SERVE}
    policy_hides_objects = True

    @extend_schema(
        summary="May the caller use this job's endpoint? (the serving proxy asks)",
        responses={200: None, 401: None, 404: None},
    )
    def get(self, request: Request, pk: int, name: str) -> Response:
        job = restrict(Job.objects.only("pk", "spec", "tenant_id"), request.user, Action.JOB_SERVE).filter(pk=pk)
        job = job.first()
        if job is None or name not in named_ports_of(job):
            raise NotFoundError(f"No endpoint {name!r} of job {pk} is open to you.")
        return Response(status=200, headers={"X-Gpupool-User": request.user.get_username()})
