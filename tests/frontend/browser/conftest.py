"""Browser tests: headless Debian chromium driven by Playwright against a live ``gpupool demo``.

The demo (``portal.livedemo``) runs as a subprocess on a free port with its own SQLite file in a temporary
folder (embedded mode: in-process Celery, in-memory Channels layer, simulated node agents), so WebSockets, the
scheduler and the agents are the real ones — pytest-django's live_server has no WebSockets. One demo serves
the whole browser session; each test gets a fresh browser context (its own cookies). Screenshots land in
``test-artifacts/browser/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.demo import DEMO_NODES
from portal.livedemo import CHROMIUM, ROOT, DemoFailed, LiveDemo, launch_chromium
from portal.livedemo import login as login
from tests.conftest import skip_or_fail

ARTIFACTS = ROOT / "test-artifacts" / "browser"


# Package scope: a live sync_playwright keeps an event loop running in the main thread, which would break
# every later test that calls asyncio.run() (nodeagent, channels).
@pytest.fixture(scope="package")
def live_demo() -> Iterator[LiveDemo]:
    if not Path(CHROMIUM).exists():
        skip_or_fail(f"{CHROMIUM} is missing (make test installs it as root on Debian)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        skip_or_fail("the playwright package is not installed (pip install -e '.[test]')")
    demo = LiveDemo(agents=len(DEMO_NODES))  # the demo's whole fleet, as `make demo` starts it
    try:
        demo.start()
    except DemoFailed as exc:
        pytest.fail(str(exc))
    try:
        yield demo
    finally:
        demo.stop()


# Package scope: a live sync_playwright keeps an event loop running in the main thread, which would break
# every later test that calls asyncio.run() (nodeagent, channels).
@pytest.fixture(scope="package")
def browser(live_demo):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        yield browser
        browser.close()


def new_page(browser, live_demo):
    context = browser.new_context(viewport={"width": 1366, "height": 860}, base_url=live_demo.base_url)
    context.set_default_timeout(15_000)
    return context.new_page()


@pytest.fixture
def page(browser, live_demo, request):
    page = new_page(browser, live_demo)
    yield page
    shot(page, request.node.name)
    page.context.close()


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
