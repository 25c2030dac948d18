from django.urls import path

from kernel.access_rules import Action
from scheduler.fleet.api import views

urlpatterns = [
    path("agents/bootstrap-tokens/", views.BootstrapTokenCreateView.as_view(), name="agent-bootstrap-token-create"),
    path("agents/register/", views.RegisterView.as_view(), name="agent-register"),
    path("agents/outputs/<int:job_id>/<int:replica>/", views.OutputUploadView.as_view(), name="agent-output-upload"),
    # The older paths of the one Node API (``/api/v1/nodes/``), kept for clients written against them.
    path(
        "agents/nodes/",
        views.NodeViewSet.as_view({"get": "list"}, policy_actions={"list": Action.FLEET_VIEW}),
        name="agent-node-list",
    ),
    path("agents/nodes/<int:pk>/revoke/", views.NodeViewSet.as_view({"post": "revoke"}), name="agent-node-revoke"),
    path("agents/devices/<int:pk>/rehome/", views.DeviceRehomeView.as_view(), name="agent-device-rehome"),
    path("telemetry/history/", views.TelemetryHistoryView.as_view(), name="telemetry-history"),
]
