"""Root-level URLs of the fleet (outside /api/v1/): the Prometheus endpoint."""

from django.urls import path

from scheduler.fleet import metrics

urlpatterns = [
    path("metrics", metrics.metrics_view, name="metrics"),
]
