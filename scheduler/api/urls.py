"""/api/v1/ routes of the scheduler: jobs, nodes, devices, flavors."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduler.api import views, whatif

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("devices", views.DeviceViewSet, basename="device")
router.register("flavors", views.FlavorViewSet, basename="flavor")

urlpatterns = [
    path("whatif/", whatif.WhatIfView.as_view(), name="whatif"),
    path("trace-export/", whatif.TraceExportView.as_view(), name="trace-export"),
    *router.urls,
]
