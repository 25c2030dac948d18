"""WebSocket routes of the scheduler (browsers and API-token clients; behind the origin check of ``portal.asgi``)."""

from django.urls import path

from scheduler.consumers import JobLogConsumer

websocket_urlpatterns = [
    path("ws/jobs/<int:job_id>/logs/", JobLogConsumer.as_asgi()),
]
