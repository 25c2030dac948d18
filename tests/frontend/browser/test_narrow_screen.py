"""On a phone (390 px wide) the pages people open there never scroll sideways: the job page with its long
command, the overview, and an audit record with its hashes and change table. And the demo shows a living pool at
first login: jobs from the last hour, their output, and usage in the report."""

from __future__ import annotations

import pytest

from tests.frontend.browser.conftest import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def phone(browser, live_demo, request):
    context = browser.new_context(viewport=PHONE, base_url=live_demo.base_url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    shot(page, request.node.name)
    context.close()


def assert_no_sideways_scroll(page) -> None:
    widths = page.evaluate(
        "() => ({scroll: document.scrollingElement.scrollWidth, client: document.scrollingElement.clientWidth})"
    )
    assert widths["scroll"] <= widths["client"], f"{page.url} scrolls sideways: {widths}"


def test_a_finished_job_of_the_demo_history_fits_a_phone(phone):
    login(phone, "bob")
    phone.goto("/console/jobs/?state=finished")
    assert_no_sideways_scroll(phone)
    phone.get_by_role("link", name="resnet50-train", exact=True).click()
    phone.wait_for_url("**/console/jobs/*/")
    assert phone.get_by_test_id("job-state").inner_text() == "succeeded"
    command = phone.get_by_test_id("job-command").inner_text()
    assert command.startswith("python3 -c 'import time;")  # shown with its quotes
    phone.get_by_test_id("job-log").get_by_text("epoch 30 of 30").wait_for()  # its output is kept
    assert_no_sideways_scroll(phone)


def test_the_overview_fits_a_phone(phone):
    login(phone, "admin")
    phone.wait_for_url("**/console/overview/")
    for _attempt in range(10):  # the demo's agents say hello within a second or two of starting
        if phone.get_by_test_id("overcommit-warning").count() == 0:
            break
        phone.wait_for_timeout(1_000)
        phone.reload()
    assert phone.get_by_test_id("overcommit-warning").count() == 0  # the demo's guarantees fit its pool
    assert_no_sideways_scroll(phone)


def test_an_audit_record_fits_a_phone_and_reads_as_tables(phone):
    login(phone, "auditor")
    phone.goto("/console/audit/?action=quota.update")
    assert_no_sideways_scroll(phone)
    phone.locator("table.data tbody tr td a").first.click()
    phone.wait_for_url("**/console/audit/*/")
    change = phone.get_by_test_id("audit-change")
    assert change.locator("tr[data-changed]").count() >= 1
    assert "{'" not in phone.locator("main").inner_text()
    assert_no_sideways_scroll(phone)


def test_the_usage_report_has_the_last_hour_at_first_login(page):
    login(page, "admin")
    page.goto("/console/reports/")
    body = page.locator("main").inner_text()
    for tenant in ("acme-vision", "acme-nlp", "acme-research"):
        assert tenant in body
