"""A member watches a running job's output in the console: it follows live, pauses and follows again, and the
download link saves it."""

from __future__ import annotations

import re

import pytest

from tests.frontend.browser.conftest import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

COMMAND = "python3 -c \"import time; [print('step', i, flush=True) or time.sleep(0.5) for i in range(600)]\""
LOG = "[data-testid='job-log']"


def log_length(page) -> int:
    return len(page.locator(LOG).text_content() or "")


def test_the_output_panel_follows_pauses_and_downloads(page):
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    login(page, "bob")
    page.goto("/console/jobs/submit/")
    page.get_by_label("Name").fill("browser-logs")
    page.get_by_label("Cards per replica").fill("1")
    page.get_by_label("Command").fill(COMMAND)
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r"/console/jobs/\d+/$"))
    page.locator("[data-testid='job-state']", has_text="running").wait_for(timeout=60_000)

    # Lines appear while the job runs, without a reload.
    page.wait_for_function(f'() => document.querySelector("{LOG}").textContent.includes("step 3")', timeout=30_000)
    assert page.locator(LOG).text_content().startswith("step 0\nstep 1\nstep 2\nstep 3\n")
    assert any(re.search(r"/ws/jobs/\d+/logs/\?replica=0&offset=0$", url) for url in sockets), sockets

    page.get_by_role("button", name="Pause").click()
    paused_at = log_length(page)
    page.wait_for_timeout(3_000)  # the job prints six lines meanwhile
    assert log_length(page) == paused_at
    assert "Paused" in page.locator("[data-log-status]").inner_text()

    page.get_by_role("button", name="Follow").click()
    assert log_length(page) > paused_at  # what came while paused is shown at once
    shot(page, "job-log-following")

    with page.expect_download() as download:
        page.get_by_role("link", name="Download").click()
    saved = download.value
    assert re.fullmatch(r"job-\d+-replica-0\.log", saved.suggested_filename)
    assert open(saved.path(), encoding="utf-8").read().startswith("step 0\nstep 1\n")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel job").click()
    page.locator("[data-testid='job-state']", has_text="cancelled").wait_for()
