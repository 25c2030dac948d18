"""A member submits a job in the browser, watches it run on a simulated node with a live chart, and an admin
sees the same card busy on the node page."""

from __future__ import annotations

import re

import pytest

from tests.frontend.browser.conftest import login, new_page, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

COMMAND = "python3 -c \"import time; [print('step', i, flush=True) or time.sleep(1) for i in range(600)]\""


def chart_points(page) -> int:
    return int(page.locator("[data-testid='job-chart']").first.get_attribute("data-points") or 0)


def test_member_submits_a_job_and_watches_it_run(page, browser, live_demo):
    login(page, "bob")
    page.goto("/console/jobs/submit/")
    page.get_by_label("Name").fill("browser-train")
    page.get_by_label("Cards per replica").fill("1")
    page.get_by_label("Command").fill(COMMAND)
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r"/console/jobs/\d+/$"))
    job_url = page.url
    # The job page reloads itself when the state changes; the scheduler and the demo agent take a few seconds.
    page.locator("[data-testid='job-state']", has_text="running").wait_for(timeout=60_000)
    page.locator("[data-testid='job-chart']").first.wait_for()
    page.wait_for_function(
        "() => Number(document.querySelector(\"[data-testid='job-chart']\").dataset.points || 0) >= 3",
        timeout=30_000,
    )
    first = chart_points(page)
    page.wait_for_function(
        f"() => Number(document.querySelector(\"[data-testid='job-chart']\").dataset.points || 0) > {first}",
        timeout=15_000,
    )
    latest = page.locator("[data-device-latest]").first.inner_text()
    assert re.match(r"[1-9]\d*% ", latest), latest  # the simulated card is busy with our job
    shot(page, "job-running")

    # An admin sees the job on the node's card, with the card's live chart moving.
    admin = new_page(browser, live_demo)
    login(admin, "admin")
    admin.goto(job_url)
    node_name = admin.locator("table.data tbody tr td").nth(1).inner_text()
    admin.goto("/console/nodes/")
    admin.get_by_role("link", name=node_name).click()
    admin.get_by_role("link", name="browser-train").wait_for()
    admin.wait_for_function(
        "() => [...document.querySelectorAll('[data-device-chart]')].some(e => Number(e.dataset.points || 0) >= 2)",
        timeout=20_000,
    )
    shot(admin, "node-live")
    admin.context.close()

    # The member cancels it.
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel job").click()
    page.locator("[data-testid='job-state']", has_text="cancelled").wait_for()
