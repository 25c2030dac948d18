"""WebSocket routes of the portal itself."""

from django.urls import path

from portal.consumers import EchoConsumer

websocket_urlpatterns = [
    path("ws/echo/", EchoConsumer.as_asgi()),
]
