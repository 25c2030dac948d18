"""Browser tests: headless Debian chromium driven by Playwright against a live ``gpupool demo``.

The demo runs as a subprocess on a free port with its own SQLite file in a temporary folder (embedded mode:
in-process Celery, in-memory Channels layer, simulated node agents), so WebSockets, the scheduler and the
agents are the real ones — pytest-django's live_server has no WebSockets. One demo serves the whole browser
session; each test gets a fresh browser context (its own cookies).
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
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveDemo:
    def __init__(self, base_url: str, data_dir: Path, log_path: Path) -> None:
        self.base_url = base_url
        self.data_dir = data_dir
        self.log_path = log_path

    def url(self, path: str) -> str:
        return self.base_url + path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def live_demo() -> Iterator[LiveDemo]:
    if not Path(CHROMIUM).exists():
        skip_or_fail(f"{CHROMIUM} is missing (make test installs it as root on Debian)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        skip_or_fail("the playwright package is not installed (pip install -e '.[test]')")
    port = free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="gpupool-browser-"))
    log_path = data_dir / "demo.log"
    env = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_DATABASE_URL", "GPUPOOL_REDIS_URL")}
    env.update(
        GPUPOOL_DATA_DIR=str(data_dir),
        GPUPOOL_DEMO_AGENTS=env.get("GPUPOOL_BROWSER_DEMO_AGENTS", "1"),
        PYTHONUNBUFFERED="1",
    )
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    demo = LiveDemo(f"http://127.0.0.1:{port}", data_dir, log_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"gpupool demo exited with {process.returncode}:\n{demo.log_tail()}")
            try:
                with urllib.request.urlopen(demo.url("/accounts/login/"), timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"gpupool demo did not answer within 120 s:\n{demo.log_tail()}")
            time.sleep(0.5)
        yield demo
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="session")
def browser(live_demo):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_demo, request):
    context = browser.new_context(viewport={"width": 1366, "height": 860}, base_url=live_demo.base_url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()


def login(page, username: str) -> None:
    from portal.demo import DEMO_PASSWORD

    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(DEMO_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/accounts/login/" not in url)


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
