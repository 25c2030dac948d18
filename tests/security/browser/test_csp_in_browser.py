"""The console under its Content-Security-Policy in a real browser: every page a role can open, with htmx, the
live WebSocket and the uPlot charts running, raises no CSP violation (nothing inline was blocked) and no
script error. tests/frontend/test_csp_ready.py checks the HTML; this checks what the browser actually enforces.
"""

from __future__ import annotations

import pytest

from tests.frontend.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WATCH = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  const where = `${event.sourceFile}:${event.lineNumber}`;
  window.__cspViolations.push(`${event.violatedDirective} blocked ${event.blockedURI || "inline"} at ${where}`);
});
"""

PAGES = {
    "admin": ["/console/overview/", "/console/nodes/", "/console/tenants/", "/console/jobs/", "/console/reports/"],
    "alice": ["/console/jobs/", "/console/jobs/submit/", "/console/tenants/", "/console/approvals/"],
    "auditor": ["/console/audit/"],
}


@pytest.mark.parametrize("username", list(PAGES))
def test_console_pages_raise_no_csp_violation(page, username):
    page.add_init_script(WATCH)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    def on_console(message) -> None:
        if "Content Security Policy" in message.text:
            errors.append(message.text)

    page.on("console", on_console)
    login(page, username)
    for url in PAGES[username]:
        response = page.goto(url)
        assert response.status == 200, url
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_load_state("networkidle")
        if url == "/console/overview/":
            page.locator("[data-live-status][data-state='open']").first.wait_for()  # the live socket is up
        violations = page.evaluate("window.__cspViolations")
        assert violations == [] and errors == [], (url, violations, errors)
    # A node page with its live per-card charts.
    if username == "admin":
        page.goto("/console/nodes/")
        page.locator("table a[href*='/console/nodes/']").first.click()
        page.wait_for_load_state("networkidle")
        assert page.evaluate("window.__cspViolations") == [] and errors == []
