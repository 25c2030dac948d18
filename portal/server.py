"""The web tier: the ASGI application (HTTP through Django, WebSockets through Channels) served by uvicorn in
one or several processes, or by daphne in one.

Why several processes: Django runs a sync view on the process's one thread-sensitive executor, so a process
serves one API request at a time however many clients wait; while that request waits on PostgreSQL, nothing
else of the API moves. N uvicorn worker processes share one listening socket (the kernel hands each new
connection to whichever process accepts first) and serve N requests at once. Several processes need what
every process can reach — PostgreSQL and the Redis channel layer and broker; embedded mode (SQLite, the
in-process broker and channel layer) therefore runs exactly one.
"""

from __future__ import annotations

import os
import signal
from typing import Literal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from kernel.env import env_int

ASGI_APP = "portal.asgi:application"
#: The largest WebSocket message accepted, as daphne (autobahn) enforced it: an agent frame over 1 MiB is
#: refused by the server before any consumer code sees it (tests/security/test_load_smoke.py).
WS_MAX_MESSAGE_BYTES = 1024 * 1024
Server = Literal["uvicorn", "daphne"]


def default_web_workers() -> int:
    """``GPUPOOL_WEB_WORKERS``, else 1 in embedded mode and one per CPU (at least 2) with Redis."""
    if settings.EMBEDDED_MODE:
        return env_int("GPUPOOL_WEB_WORKERS", 1)
    return env_int("GPUPOOL_WEB_WORKERS", max(2, os.cpu_count() or 1))


def check_web_workers(workers: int, *, server: Server = "uvicorn") -> None:
    """Refuse a process count the configuration cannot serve, saying what to change."""
    if workers < 1:
        raise ImproperlyConfigured(f"--workers {workers}: give at least 1 web process.")
    if workers == 1:
        return
    if server == "daphne":
        raise ImproperlyConfigured(
            f"--workers {workers}: daphne serves from one process; use --server uvicorn for several."
        )
    if settings.EMBEDDED_MODE:
        raise ImproperlyConfigured(
            f"--workers {workers}: embedded mode (no GPUPOOL_REDIS_URL) runs in one process, because its broker "
            "and channel layer live in that process's memory. Set GPUPOOL_REDIS_URL (and GPUPOOL_DATABASE_URL to "
            "PostgreSQL) to run several web processes."
        )
    if not settings.IS_POSTGRES:
        raise ImproperlyConfigured(
            f"--workers {workers}: several web processes need PostgreSQL (SQLite takes one writer at a time); "
            "set GPUPOOL_DATABASE_URL=postgres://…"
        )


def serve(
    *,
    host: str,
    port: int,
    workers: int,
    server: Server = "uvicorn",
    log_level: str = "warning",
    access_log: bool = False,
) -> None:
    """Serve the ASGI application until SIGINT/SIGTERM; returns when every web process has stopped.

    With ``workers`` > 1 this process is uvicorn's supervisor: it binds the socket, starts the worker
    processes (each imports ``portal.asgi`` afresh, so no database connection crosses a fork), restarts one
    that dies, and on SIGTERM stops them all, letting each finish its open requests.
    """
    check_web_workers(workers, server=server)
    if server == "daphne":
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server as DaphneServer

        from portal.asgi import application

        # Twisted's handlers stop the reactor on SIGINT and SIGTERM; run() then returns here.
        DaphneServer(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=True,
            verbosity=0,
        ).run()
        return

    import uvicorn

    # A single uvicorn process re-raises SIGINT/SIGTERM after its graceful shutdown; turning them into an
    # exception caught here makes a stop by signal a normal return (exit status 0, callers' ``finally`` runs).
    # With several workers uvicorn's supervisor takes the signals itself and returns once they have exited.
    previous = {signum: signal.signal(signum, _raise_stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        _run_uvicorn(uvicorn, host=host, port=port, workers=workers, log_level=log_level, access_log=access_log)
    except _StopRequested:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _StopRequested(Exception):
    pass


def _raise_stop(signum: int, _frame: object) -> None:
    raise _StopRequested(signum)


def _run_uvicorn(uvicorn, *, host: str, port: int, workers: int, log_level: str, access_log: bool) -> None:
    uvicorn.run(
        ASGI_APP,
        host=host,
        port=port,
        workers=workers,
        # Channels' ProtocolTypeRouter has no lifespan route; "off" spares a warning per process.
        lifespan="off",
        log_level=log_level,
        access_log=access_log,
        ws_max_size=WS_MAX_MESSAGE_BYTES,
        # As with daphne: the client address is the peer's. Whether X-Forwarded-For is believed is the
        # application's decision (GPUPOOL_AUDIT_TRUST_FORWARDED_FOR), and HTTPS behind a proxy is Django's
        # SECURE_PROXY_SSL_HEADER; uvicorn rewriting both for any local peer would bypass them.
        proxy_headers=False,
        server_header=False,
        # Requests in flight get this long to finish on SIGTERM before their connections are closed.
        timeout_graceful_shutdown=10,
    )
