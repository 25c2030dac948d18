"""The console's charts in chromium (issue 20, item 7): they open with the stored hour of minute rollups before
the socket has said anything, in English and in Chinese, then go live; the fleet heatmap; the node page's cards
as small multiples that keep the page short."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.frontend.browser.conftest import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# An hour of minute rollups for every card of the demo, stored as the agent sockets store them.
STORE_AN_HOUR = """
from django.utils import timezone
from scheduler.models import Device
from tests.fleet.rollup_data import write_minutes
write_minutes(Device.objects.all(), now=timezone.now(), minutes_back=60,
              utilisation=lambda device, ago: float((ago * 7 + device.index * 13) % 100))
"""
TELEMETRY_SOCKET = re.compile(r"/ws/telemetry/$")
# At least 55 of the hour's 60 minutes (the first may fall off the window while the page loads), as the pattern
# of a data-* count: the page's CSP has no 'unsafe-eval', so waits are on attributes, not script predicates.
MOST_OF_AN_HOUR = 55
AT_LEAST_55 = re.compile(r"^(5[5-9]|[6-9]\d|\d{3,})$")
AT_LEAST_1 = re.compile(r"^[1-9]\d*$")
AT_LEAST_2 = re.compile(r"^([2-9]|\d{2,})$")


@pytest.fixture(scope="module")
def stored_hour(live_demo):
    live_demo.python(STORE_AN_HOUR)


def switch_language(page, live_demo, language: str) -> None:
    page.context.add_cookies([{"name": "django_language", "value": language, "url": live_demo.base_url}])


def silence_live_telemetry(page) -> None:
    """The page's telemetry socket opens to a stand-in that never sends: what the charts draw is the history."""
    page.route_web_socket(TELEMETRY_SOCKET, lambda socket: None)


def count(locator, attribute: str) -> int:
    return int(locator.get_attribute(attribute) or 0)


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_overview_chart_shows_the_stored_hour_before_any_live_update(page, live_demo, stored_hour, language):
    silence_live_telemetry(page)
    login(page, "admin")
    switch_language(page, live_demo, language)
    page.goto("/console/overview/")
    chart = page.locator("[data-flavor-chart]")
    expect(chart).to_have_attribute("data-history-points", AT_LEAST_55)
    assert count(chart, "data-live-points") == 0
    assert count(chart, "data-points") >= MOST_OF_AN_HOUR
    assert chart.locator("canvas").count() == 1
    heading = "各规格利用率" if language == "zh-hans" else "Utilisation by flavor"
    assert page.get_by_role("heading", name=heading).is_visible()
    # The fleet heatmap: a square per card, each saying what it shows, rows opening their nodes.
    cells = page.locator("[data-heatmap] [data-heat-uuid]")
    assert cells.count() >= 4
    label = cells.first.get_attribute("aria-label")
    assert ("号卡" in label) if language == "zh-hans" else (", card 0:" in label)
    assert page.locator("[data-heatmap] a.heat-row").first.get_attribute("href").startswith("/console/nodes/")
    shot(page, f"overview-history-{language}")


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_charts_go_live_after_the_stored_hour(page, live_demo, stored_hour, language):
    login(page, "admin")
    switch_language(page, live_demo, language)
    page.goto("/console/overview/")
    chart = page.locator("[data-flavor-chart]")
    expect(chart).to_have_attribute("data-history-points", AT_LEAST_55)
    expect(chart).to_have_attribute("data-live-points", AT_LEAST_2)
    # The heatmap follows the same socket.
    expect(page.locator("[data-heatmap]")).to_have_attribute("data-live-updates", AT_LEAST_1)


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_node_page_shows_its_cards_small_with_their_hour(page, live_demo, stored_hour, language):
    silence_live_telemetry(page)
    login(page, "admin")
    switch_language(page, live_demo, language)
    page.goto("/console/nodes/")
    # sim-00 by name: another test of the same live demo enrols a node with no cards that sorts first.
    page.locator("table.data tbody a", has_text="sim-00").first.click()
    page.wait_for_url(re.compile(r"/console/nodes/\d+/$"))
    panels = page.locator("[data-testid='card-panel']")
    cards = panels.count()
    assert cards >= 4
    for chart in page.locator("[data-device-chart]").all():
        expect(chart).to_have_attribute("data-history-points", AT_LEAST_55)
    # Small multiples: the cards sit side by side, and the page stays about a screen and a half tall.
    tops = {round(panel.bounding_box()["y"]) for panel in panels.all()}
    assert len(tops) <= (cards + 2) // 3
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 1500, f"the node page is {height} px tall"
    shot(page, f"node-small-multiples-{language}")
