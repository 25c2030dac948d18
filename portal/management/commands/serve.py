"""``gpupool serve``: the web tier alone (HTTP API, pages, agent and browser WebSockets) in N processes.

Production runs this beside ``celery -A portal worker``, ``celery -A portal beat`` and the node agents
(docs/production.md). In embedded mode (no Redis) it serves one process and runs the Celery worker and beat as
threads of it, since the in-process broker reaches no other process.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from portal import embedded
from portal import server as web


class Command(BaseCommand):
    help = "Serve gpupool's ASGI application (HTTP and WebSockets) with N web processes (stop with SIGTERM/Ctrl-C)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="web processes (default: GPUPOOL_WEB_WORKERS, else one per CPU and at least 2 with Redis, "
            "1 in embedded mode)",
        )
        parser.add_argument(
            "--server",
            choices=["uvicorn", "daphne"],
            default="uvicorn",
            help="ASGI server: uvicorn (one or several processes) or daphne (one process)",
        )
        parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
        parser.add_argument("--access-log", action="store_true", help="log every request (off by default)")

    def handle(
        self,
        *args,
        host: str,
        port: int,
        workers: int | None,
        server: str,
        log_level: str,
        access_log: bool,
        **options,
    ) -> None:
        if workers is None:
            workers = 1 if server == "daphne" else web.default_web_workers()
        try:
            web.check_web_workers(workers, server=server)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        mode = "embedded (SQLite, in-process broker)" if settings.EMBEDDED_MODE else "redis"
        self.stdout.write(f"gpupool web: {server}, {workers} process(es), http://{host}:{port}/, mode {mode}")
        self.stdout.flush()
        if settings.EMBEDDED_MODE:
            embedded.start_worker()
            embedded.start_beat()
        try:
            web.serve(host=host, port=port, workers=workers, server=server, log_level=log_level, access_log=access_log)
        finally:
            embedded.stop()
        self.stdout.write("gpupool web stopped")
