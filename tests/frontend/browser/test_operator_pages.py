"""Issue 33, item 5 in chromium against the live demo: adding a node from the console (the enrolment token and
the command line it shows really register a node), and the pool table's "Utilised (live)" staying the pool's
figure for a tenant member while their own chart goes live."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from playwright.sync_api import expect

from portal.livedemo import ROOT
from tests.frontend.browser.conftest import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

AT_LEAST_2 = re.compile(r"^([2-9]|\d{2,})$")
# What the pool's figure is replaced with in the numbers the server sends, so that a repaint is seen.
POOL_FIGURE = "42%"


def test_a_node_is_added_with_the_token_and_command_the_console_shows(page, live_demo, tmp_path):
    login(page, "admin")
    page.goto("/console/nodes/")
    page.get_by_test_id("add-node").click()
    page.wait_for_url(re.compile(r"/console/nodes/enrol/$"))
    page.get_by_label("Node name").fill("gpu-enrolled-01")
    page.get_by_label("Valid for (minutes)").fill("15")
    page.get_by_role("button", name="Create token").click()
    token = page.get_by_test_id("enrol-token").input_value()
    assert token.startswith("gpb_")
    command = page.get_by_test_id("enrol-command").inner_text().strip().splitlines()
    shot(page, "enrol-token")
    register = shlex.split(command[0])
    assert register[:2] == ["gpupool-agent", "register"] and token in register
    assert register[register.index("--server") + 1] == live_demo.base_url
    # Run it as printed (the agent's module is `gpupool-agent`), into a credential file of the test's own.
    credential = tmp_path / "credential.json"
    result = subprocess.run(
        [sys.executable, "-m", "nodeagent", *register[1:], "--credential-file", str(credential)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert credential.exists()
    assert command[1].startswith("gpupool-agent run")
    page.goto("/console/nodes/?q=gpu-enrolled-01")
    expect(page.locator("table.data tbody")).to_contain_text("gpu-enrolled-01")
    # Shown once: the page lists the used token by its prefix, never the secret.
    page.goto("/console/nodes/enrol/")
    assert token not in page.content()
    expect(page.get_by_test_id("enrol-token-table")).to_contain_text("used")


def test_a_members_live_chart_does_not_repaint_the_pools_utilisation(page, live_demo):
    def pool_numbers(route):
        response = route.fetch()
        body = re.sub(r'(data-flavor-util="[^"]+">)[^<]*<', rf"\g<1>{POOL_FIGURE}<", response.text())
        route.fulfill(response=response, body=body)

    page.route(re.compile(r"/console/overview/numbers/"), pool_numbers)
    login(page, "bob")
    page.goto("/console/overview/")
    chart = page.locator("[data-flavor-chart]")
    expect(chart).to_have_attribute("data-live-points", AT_LEAST_2, timeout=30_000)
    # One swap of the numbers after the chart went live (htmx every 5 s): that is when the old code repainted.
    with page.expect_response(re.compile(r"/console/overview/numbers/"), timeout=15_000):
        pass
    with page.expect_response(re.compile(r"/console/overview/numbers/"), timeout=15_000):
        pass
    cells = page.locator("[data-flavor-util]")
    assert cells.count() >= 1
    for cell in cells.all():
        assert cell.inner_text().strip() == POOL_FIGURE
    header = page.get_by_test_id("utilised-header")
    assert "whole pool" in header.inner_text() and "same figure for everyone" in header.get_attribute("title")
    expect(page.get_by_test_id("utilised-help")).to_contain_text("only the cards your tenants hold")
    shot(page, "utilised-for-a-member")
