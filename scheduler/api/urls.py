"""/api/v1/ routes of the scheduler: jobs (and their logs), nodes, devices, flavors, quota use and showback."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduler.api import logs, outputs, serving_auth, showback, views, whatif
from scheduler.fleet.api import views as fleet_views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("nodes", fleet_views.NodeViewSet, basename="node")
router.register("devices", views.DeviceViewSet, basename="device")
router.register("flavors", views.FlavorViewSet, basename="flavor")

urlpatterns = [
    path("jobs/<int:pk>/logs/", logs.JobLogView.as_view(), name="job-logs"),
    path("jobs/<int:pk>/outputs/", outputs.JobOutputListView.as_view(), name="job-outputs"),
    path("jobs/<int:pk>/outputs/<int:replica>/", outputs.JobOutputDownloadView.as_view(), name="job-output"),
    path("serving/auth/<int:pk>/<str:name>/", serving_auth.ServingAuthView.as_view(), name="serving-auth"),
    path("whatif/", whatif.WhatIfView.as_view(), name="whatif"),
    path("tenants/<str:pk>/quota-usage/", showback.TenantQuotaUsageView.as_view(), name="tenant-quota-usage"),
    path("usage/", showback.UsageReportView.as_view(), name="usage-report"),
    path("trace-export/", whatif.TraceExportView.as_view(), name="trace-export"),
    *router.urls,
]
