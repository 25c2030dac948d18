"""The jobs queue view in a real browser, in English and in Chinese: a member ticks two jobs and cancels them in
one go, hides a column and finds it still hidden after a reload, saves the filtered view under a name and comes
back to it through the saved link."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from tests.frontend.browser.conftest import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WORDS = {
    "en": {"cancelled": "Cancelled 2 jobs", "elapsed": "Elapsed", "columns": "Columns"},
    "zh-hans": {"cancelled": "已取消 2 个作业", "elapsed": "已运行", "columns": "列"},
}


def submit_json(page, name: str) -> None:
    """Submit through the pasted-JSON form (its field names are the same in every language), starting from the
    example spec the form offers (a tenant and a flavor of the demo)."""
    page.goto("/console/jobs/submit/")
    field = page.locator("textarea[name='j-spec_json']")
    spec = json.loads(field.input_value())
    spec.update(name=name, priority_class="low", command=["sleep", "3600"])
    field.fill(json.dumps(spec))
    page.locator("button[name='submit_json']").click()
    page.wait_for_url(re.compile(r"/console/jobs/\d+/$"))


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_bulk_cancel_column_choice_and_saved_filters(page, language):
    words = WORDS[language]
    login(page, "carol")
    page.goto("/console/jobs/")
    if language != "en":
        with page.expect_navigation():
            page.locator("#language-select").select_option(language)
    assert page.locator("html").get_attribute("lang") == ("zh-Hans" if language == "zh-hans" else "en")
    prefix = f"bulk-{uuid.uuid4().hex[:8]}"
    submit_json(page, f"{prefix}-a")
    submit_json(page, f"{prefix}-b")

    # The two jobs, found by a search; the header box ticks both.
    page.goto(f"/console/jobs/?q={prefix}")
    rows = page.locator("table[data-queue-table] tbody tr[data-job-id]")
    assert rows.count() == 2
    page.locator("[data-select-all]").check()
    assert page.locator("[data-job-select]:checked").count() == 2
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_navigation():
        page.locator("[data-bulk-cancel]").click()
    assert words["cancelled"] in page.locator(".messages").inner_text()
    assert page.url.endswith(f"/console/jobs/?q={prefix}")
    states = page.locator("td[data-col='state']").evaluate_all("cells => cells.map(c => c.innerHTML.trim())")
    assert page.locator("td[data-col='state'] .badge.cancelled").count() == 2, states
    assert page.locator("[data-job-select]").count() == 0  # nothing left to act on

    # Hide the elapsed column; it stays hidden after a reload.
    picker = page.locator("[data-column-picker]")
    picker.locator("summary").click()
    assert picker.locator("summary").inner_text() == words["columns"]
    toggle = picker.locator("[data-col-toggle='elapsed']")
    assert picker.locator("label:has([data-col-toggle='elapsed'])").inner_text().strip() == words["elapsed"]
    assert page.locator("th[data-col='elapsed']").is_visible()
    toggle.uncheck()
    assert page.locator("th[data-col='elapsed']").is_hidden()
    assert page.locator("td[data-col='elapsed']").first.is_hidden()
    page.reload()
    assert page.locator("th[data-col='elapsed']").is_hidden()
    assert page.locator("th[data-col='reason']").is_visible()
    assert not page.locator("[data-col-toggle='elapsed']").is_checked()

    # Save this filtered view, leave it, and come back through the saved link.
    saved = page.locator("[data-saved-filters]")
    saved.locator("summary").click()
    saved.locator("[data-saved-filter-name]").fill("my bulk jobs")
    saved.locator("[data-saved-filter-save]").click()
    page.goto("/console/jobs/")
    page.locator("[data-saved-filters] summary").click()
    page.locator("[data-saved-filters] a", has_text="my bulk jobs").click()
    page.wait_for_url(re.compile(rf"/console/jobs/\?q={prefix}$"))
    assert rows.count() == 2
    assert page.locator("th[data-col='elapsed']").is_hidden()
    shot(page, f"jobs-queue-{language}")
