"""The browser fixtures of tests/frontend/browser (a live ``gpupool demo`` and headless chromium), for this
package: one more demo, started only when these tests run."""

from tests.frontend.browser.conftest import browser, live_demo, page  # noqa: F401
