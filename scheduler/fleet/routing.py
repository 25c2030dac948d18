"""WebSocket routes of the fleet.

``websocket_urlpatterns`` (browsers) sit behind the session and origin checks of ``portal.asgi``;
``agent_websocket_urlpatterns`` skip the origin check: agents are not browsers, send no Origin and carry no
cookie, they authenticate with their node credential inside the consumer.
"""

from django.urls import path

from scheduler.fleet.consumers import AgentConsumer, TelemetryConsumer

websocket_urlpatterns = [
    path("ws/telemetry/", TelemetryConsumer.as_asgi()),
]

agent_websocket_urlpatterns = [
    path("ws/agent/", AgentConsumer.as_asgi()),
]
