"""A throwaway ``gpupool demo`` on a free port with its own SQLite file, plus headless Debian chromium.

Used by the browser tests and by ``python -m portal.screenshots``: the demo is the real stack (ASGI server
with WebSockets, in-process Celery, scheduler, simulated node agents), only with a fresh database.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from portal.demo_login import DEMO_PASSWORD

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class DemoFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveDemo:
    """``start()`` runs the demo and waits until it answers; ``stop()`` ends its whole process group."""

    def __init__(self, *, agents: int = 1, startup_timeout_s: float = 120) -> None:
        self.agents = agents
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.data_dir = Path(tempfile.mkdtemp(prefix="gpupool-live-"))
        self.log_path = self.data_dir / "demo.log"
        self.process: subprocess.Popen | None = None

    def url(self, path: str) -> str:
        return self.base_url + path

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_DATABASE_URL", "GPUPOOL_REDIS_URL")}
        env.update(GPUPOOL_DATA_DIR=str(self.data_dir), GPUPOOL_DEMO_AGENTS=str(self.agents), PYTHONUNBUFFERED="1")
        return env

    def python(self, code: str) -> str:
        """Run ``code`` in a Django shell on the demo's database (to add data a page cannot, e.g. users)."""
        result = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code],
            cwd=ROOT,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise DemoFailed(f"demo shell failed:\n{result.stderr[-2000:]}")
        return result.stdout

    def start(self) -> LiveDemo:
        env = self._env()
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "demo", "--port", str(self.port)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise DemoFailed(f"gpupool demo exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url("/accounts/login/"), timeout=5) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise DemoFailed(f"gpupool demo did not answer within {self.startup_timeout_s} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def login(page, username: str) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(DEMO_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/accounts/login/" not in url)
