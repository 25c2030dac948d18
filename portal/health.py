"""``/healthz``: is this process able to serve? Checks the database, Redis (when configured) and that a
Celery worker answers. 200 when all pass, 503 with the failing check named otherwise."""

from __future__ import annotations

import time

from django.conf import settings
from django.db import connection
from django.http import JsonResponse

from portal import embedded
from portal.celery import app as celery_app
from portal.tasks import echo


def _check_database() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"ok": True, "engine": connection.vendor}


def _check_redis() -> dict:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        client.ping()
    finally:
        client.close()
    return {"ok": True}


def _check_celery() -> dict:
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return {"ok": True, "mode": "eager"}
    if settings.EMBEDDED_MODE:
        # The memory broker only reaches a worker in this process: make a real round trip through it.
        if not embedded.worker_is_running():
            return {"ok": False, "mode": "embedded", "error": "no in-process worker running"}
        # The worker thread marks this process as a worker; this wait is not inside a task.
        reply = echo.delay("healthz").get(timeout=5.0, disable_sync_subtasks=False)
        return {"ok": reply["payload"] == "healthz", "mode": "embedded", "workers": [reply["worker"]]}
    replies = celery_app.control.ping(timeout=1.0)
    workers = sorted(name for reply in replies for name in reply)
    if not workers:
        return {"ok": False, "error": "no Celery worker answered a ping within 1 s"}
    return {"ok": True, "workers": workers}


def healthz(request):
    checks: dict[str, dict] = {}
    probes = [("database", _check_database)]
    if settings.REDIS_URL:
        probes.append(("redis", _check_redis))
    probes.append(("celery", _check_celery))
    for name, probe in probes:
        started = time.monotonic()
        try:
            result = probe()
        except Exception as exc:  # a health check reports failures, it does not raise them
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        result["ms"] = round((time.monotonic() - started) * 1000, 1)
        checks[name] = result
    healthy = all(check["ok"] for check in checks.values())
    return JsonResponse(
        {
            "status": "ok" if healthy else "unhealthy",
            "mode": "embedded" if settings.EMBEDDED_MODE else "redis",
            "checks": checks,
        },
        status=200 if healthy else 503,
    )
