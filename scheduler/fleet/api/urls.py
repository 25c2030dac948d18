from django.urls import path

from scheduler.fleet.api import views

urlpatterns = [
    path("agents/bootstrap-tokens/", views.BootstrapTokenCreateView.as_view(), name="agent-bootstrap-token-create"),
    path("agents/register/", views.RegisterView.as_view(), name="agent-register"),
    path("agents/outputs/<int:job_id>/<int:replica>/", views.OutputUploadView.as_view(), name="agent-output-upload"),
    path("agents/nodes/", views.FleetNodeListView.as_view(), name="agent-node-list"),
    path("agents/nodes/<int:pk>/revoke/", views.NodeRevokeView.as_view(), name="agent-node-revoke"),
    path("agents/devices/<int:pk>/rehome/", views.DeviceRehomeView.as_view(), name="agent-device-rehome"),
    path("telemetry/history/", views.TelemetryHistoryView.as_view(), name="telemetry-history"),
]
