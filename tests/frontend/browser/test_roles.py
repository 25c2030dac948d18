"""Each demo role logs in and sees exactly its part of the console."""

from __future__ import annotations

import pytest

from tests.frontend.browser.conftest import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def nav_labels(page) -> list[str]:
    return [text.strip() for text in page.locator("header nav a").all_inner_texts()]


def test_system_admin_sees_the_pool_and_live_chart(page):
    login(page, "admin")
    page.wait_for_url("**/console/overview/")
    assert {"Overview", "Nodes"} <= set(nav_labels(page))
    assert "Audit" not in nav_labels(page)
    page.locator("[data-live-status][data-state='open']").first.wait_for()
    shot(page, "admin-overview")


def test_auditor_reads_and_changes_nothing(page):
    # The auditor reads what the API lets them read (tenants, jobs, usage, the overview) and starts on the
    # audit trail; the nodes and the approvals are not theirs, and nothing offers a change.
    login(page, "auditor")
    page.wait_for_url("**/console/audit/")
    labels = nav_labels(page)
    # ...and the platform's alerts, read-only (acknowledging is the system and security admins').
    assert labels[-2:] == ["Audit", "Alerts"] and {"Overview", "Jobs", "Reports"} <= set(labels), labels
    assert "Nodes" not in labels and "Approvals" not in labels
    assert page.goto("/console/nodes/").status == 404
    page.goto("/console/jobs/")
    assert page.get_by_role("link", name="Submit a job").count() == 0
    assert page.get_by_role("button", name="Cancel selected").count() == 0


def test_member_sees_no_nodes(page):
    login(page, "bob")
    assert "Nodes" not in nav_labels(page)
    assert page.goto("/console/nodes/").status == 404


def test_dark_mode_toggle_is_remembered(page):
    login(page, "admin")
    toggle = page.locator("[data-theme-toggle]")
    before = page.evaluate("document.documentElement.getAttribute('data-theme')")
    toggle.click()
    after = page.evaluate("document.documentElement.getAttribute('data-theme')")
    assert after in ("dark", "light") and after != before
    page.reload()
    assert page.evaluate("document.documentElement.getAttribute('data-theme')") == after


def test_language_switch_to_simplified_chinese(page):
    login(page, "admin")
    # Choosing a language submits the form (set_language) and reloads the same page.
    with page.expect_navigation():
        page.locator("#language-select").select_option("zh-hans")
    assert page.locator("html").get_attribute("lang") == "zh-Hans"
    assert page.get_by_role("heading", name="资源池概览").is_visible()
    with page.expect_navigation():
        page.locator("#language-select").select_option("en")
    assert page.locator("html").get_attribute("lang") == "en"


def test_keyboard_users_skip_to_the_content(page):
    login(page, "admin")
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.textContent.trim()")
    assert focused == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
