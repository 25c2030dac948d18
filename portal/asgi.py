"""ASGI entry point: HTTP through Django, WebSockets through Channels.

Each app lists its WebSocket routes in ``<app>/routing.py`` as ``websocket_urlpatterns``; they are collected
here, so adding a consumer never means editing this file.
"""

from __future__ import annotations

import importlib
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

WEBSOCKET_ROUTING_MODULES = ["portal.routing", "scheduler.routing", "scheduler.fleet.routing", "frontend.routing"]


def collect_websocket_urlpatterns(attribute: str = "websocket_urlpatterns") -> list:
    patterns: list = []
    for module_name in WEBSOCKET_ROUTING_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        patterns.extend(getattr(module, attribute, []))
    return patterns


def route_agents_around_origin_check(agent_patterns: list, browser_app):
    """Sockets of node agents (``agent_websocket_urlpatterns``) bypass the origin check: agents are not
    browsers, send no Origin and no cookie, and authenticate with their node credential in the consumer."""
    agent_app = URLRouter(agent_patterns)
    agent_paths = {"/" + str(pattern.pattern) for pattern in agent_patterns}

    async def app(scope, receive, send):
        if scope.get("path") in agent_paths:
            return await agent_app(scope, receive, send)
        return await browser_app(scope, receive, send)

    return app


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Browser sockets carry the session cookie; the origin check stops cross-site socket hijacking.
        # Agent sockets authenticate with their node credential inside their consumer.
        "websocket": route_agents_around_origin_check(
            collect_websocket_urlpatterns("agent_websocket_urlpatterns"),
            AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(collect_websocket_urlpatterns()))),
        ),
    }
)
