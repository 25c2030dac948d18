"""The API root: a map of the v1 API for people browsing it and for clients discovering it."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.access_rules import Action

# name shown in the root → URL name of the list endpoint. Apps add their entries here as they grow.
API_ROOT_LINKS: dict[str, str] = {
    "schema": "api-schema",
    "docs": "api-docs",
    "health": "healthz",
    "audit-records": "auditrecord-list",
    "audit-verify": "audit-verify",
    "audit-export": "audit-export",
    "jobs": "job-list",
    "nodes": "node-list",
    "devices": "device-list",
    "flavors": "flavor-list",
    "agent-nodes": "agent-node-list",
    "metrics": "metrics",
    "me": "me",
    "tenants": "tenant-list",
    "memberships": "membership-list",
    "users": "user-list",
    "tokens": "apitoken-list",
    "quotas": "quota-list",
    "approvals": "approval-list",
    "notifications": "notification-list",
    "flavor_prices": "flavorprice-list",
    "usage": "usage-report",
}


class ApiRootView(APIView):
    policy_actions = {"get": Action.API_INDEX}

    @extend_schema(summary="Map of the v1 API", responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        links = {}
        for label, url_name in API_ROOT_LINKS.items():
            try:
                links[label] = request.build_absolute_uri(reverse(url_name))
            except NoReverseMatch:
                continue
        return Response({"version": "v1", "user": request.user.username, "links": links})


api_root = ApiRootView.as_view()


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """404 for a URL no route matches: the API's ``{"code", "detail"}`` under ``/api/`` (an HTML page there
    broke clients and the schema), the console's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"code": "not_found", "detail": "No such object or endpoint; the API's map is at /api/v1/."}, status=404
        )
    return render(request, "frontend/404.html", status=404)
