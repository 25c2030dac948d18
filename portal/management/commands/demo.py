"""``gpupool demo``: everything in one process tree — migrate, demo data, ASGI server, Celery worker and
beat, simulated node agents — and a clean stop on Ctrl-C.

In embedded mode (SQLite, in-process broker and channel layer) all of it is one process. With
GPUPOOL_DATABASE_URL and GPUPOOL_REDIS_URL set, the worker and beat are processes of their own and the web
tier runs several uvicorn processes (``--workers``), as in production (docs/production.md)."""

from __future__ import annotations

import signal
import subprocess
import sys

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from portal import demo, embedded, server


class Command(BaseCommand):
    help = "Run gpupool in one process tree with demo data and simulated nodes (stop with Ctrl-C)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--agents", type=int, default=settings.GPUPOOL_DEMO_AGENTS, help="number of simulated node agents to start"
        )
        parser.add_argument("--no-migrate", action="store_true")
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="web processes: 1 in embedded mode; with PostgreSQL and Redis GPUPOOL_WEB_WORKERS, else one per "
            "CPU (at least 2)",
        )

    def handle(
        self, *args, host: str, port: int, agents: int, no_migrate: bool, workers: int | None, **options
    ) -> None:
        workers = server.default_web_workers() if workers is None else workers
        try:
            server.check_web_workers(workers)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        if not no_migrate:
            call_command("migrate", interactive=False, verbosity=0)
        created = demo.load_demo_data(agents=agents)
        self.stdout.write("demo data " + ("loaded" if created else "already present"))

        children: list[subprocess.Popen] = []
        if settings.EMBEDDED_MODE:
            embedded.start_worker()
            embedded.start_beat()
        else:
            # With Redis the worker and beat are real separate processes, as in production.
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "portal",
                        "worker",
                        "--loglevel",
                        "WARNING",
                        "--concurrency",
                        "2",
                    ]
                )
            )
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "portal",
                        "beat",
                        "--loglevel",
                        "WARNING",
                        "--schedule",
                        str(settings.DATA_DIR / "celerybeat-schedule"),
                    ]
                )
            )

        url = f"http://{host}:{port}/"
        children.extend(demo.start_demo_agents(server_url=url, count=agents))
        self.stdout.write(self.style.SUCCESS(f"gpupool is running at {url}"))
        self.stdout.write(f"mode: {'embedded (SQLite, in-process broker)' if settings.EMBEDDED_MODE else 'redis'}")
        self.stdout.write(f"web processes: {workers}")
        if agents:
            from nodeagent.demo import demo_sandbox_mode, describe_sandbox_mode

            self.stdout.write(f"workload sandbox: {describe_sandbox_mode(demo_sandbox_mode())}")
        self.stdout.write(f"demo logins (password for all: {demo.DEMO_PASSWORD}):")
        for login in demo.DEMO_LOGINS:
            self.stdout.write(f"  {login.username:<10} {login.role}")
        self.stdout.write(
            f"audit trust root (pin it for `python -m audit.bundle_verifier --trust-root`): {_trust_root()}"
        )
        self.stdout.write("press Ctrl-C to stop")
        self.stdout.flush()
        try:
            server.serve(host=host, port=port, workers=workers)
        finally:
            self._stop(children)
            self.stdout.write("gpupool stopped")

    def _stop(self, children: list[subprocess.Popen]) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        embedded.stop()


def _trust_root() -> str:
    """The audit trail's trust-root fingerprint (made by the witness at first contact), or why there is none."""
    from audit.exports import trust_root

    try:
        return trust_root()
    except Exception as exc:
        return f"unavailable ({exc})"
