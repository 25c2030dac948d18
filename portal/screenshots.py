"""Screenshots of every console page for the README: ``python -m portal.screenshots [OUTPUT_DIR]``.

Starts a throwaway demo (``portal.livedemo``), submits a couple of jobs as the demo member ``bob``, lets the
simulated node run them for a few seconds so the live charts have data, and photographs each page as the role
that uses it. Writes ``docs/screenshots/*.png`` by default. Needs Debian's chromium and the playwright package.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from nodeagent.demo import DEMO_NODES
from portal.livedemo import ROOT, LiveDemo, launch_chromium, login

DEFAULT_OUTPUT = ROOT / "docs" / "screenshots"
LOOP = "python3 -c \"import time; [print('epoch', i, flush=True) or time.sleep(1) for i in range(3600)]\""


ADD_TEAM_ADMIN = """
from portal.demo_login import DEMO_PASSWORD
from tenants.models import Tenant
from tenants.services.identity import user_create
from tenants.services.memberships import membership_create
dora = user_create(actor=None, username="dora", password=DEMO_PASSWORD)
membership_create(actor=None, user=dora, tenant=Tenant.objects.get(slug="acme-vision"), role="tenant_admin")
"""


def submit_job(page, *, name: str, cards: int | None = None, fraction: str | None = None) -> str:
    page.goto("/console/jobs/submit/")
    page.get_by_label("Name").fill(name)
    if fraction:
        page.get_by_label("a fraction of one card").check()
        page.get_by_label("Share of one card").select_option(fraction)
        page.get_by_label("Device memory (GiB, for a fraction)").fill("16")
    else:
        page.get_by_label("Cards per replica").fill(str(cards or 1))
    page.get_by_label("Command").fill(LOOP)
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r"/console/jobs/\d+/$"))
    return page.url


def take(page, output: Path, name: str, *, full_page: bool = False) -> None:
    path = output / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def take_element(locator, output: Path, name: str) -> None:
    """Just one part of a page (the heatmap, the output panel), for a page of the docs that explains it."""
    path = output / f"{name}.png"
    locator.screenshot(path=str(path))
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def wait_points(page, selector: str, points: int, timeout_ms: int = 30_000) -> None:
    page.wait_for_function(
        f"() => [...document.querySelectorAll({selector!r})].some(e => Number(e.dataset.points || 0) >= {points})",
        timeout=timeout_ms,
    )


def main(argv: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    output = Path(argv[0]) if argv else DEFAULT_OUTPUT
    output.mkdir(parents=True, exist_ok=True)
    demo = LiveDemo(agents=len(DEMO_NODES)).start()
    try:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)

            def page_for(username: str | None, **context_options):
                context_options.setdefault("viewport", {"width": 1366, "height": 860})
                context = browser.new_context(base_url=demo.base_url, **context_options)
                context.set_default_timeout(60_000)
                page = context.new_page()
                if username:
                    login(page, username)
                return page

            anonymous = page_for(None)
            anonymous.goto("/accounts/login/")
            take(anonymous, output, "login")

            bob = page_for("bob")
            take_submit = submit_job(bob, name="resnet50-train", cards=2)
            submit_job(bob, name="bert-finetune", fraction="500")
            submit_job(bob, name="notebook", fraction="300")
            bob.goto(take_submit)
            bob.locator("[data-testid='job-state']", has_text="running").wait_for()
            wait_points(bob, "[data-device-chart]", 12)
            take(bob, output, "job", full_page=True)
            # The output panel follows the job's log as it runs.
            bob.get_by_test_id("job-log").get_by_text("epoch 8").wait_for()
            take_element(bob.get_by_test_id("job-log-panel"), output, "job-log")
            # Two jobs too big for the cards free now wait in the queue, with a reason and a position.
            waiting = submit_job(bob, name="llama-pretrain", cards=8)
            submit_job(bob, name="llama-eval", cards=8)
            bob.goto(waiting)
            bob.get_by_test_id("queue-position").wait_for()
            bob.goto("/console/jobs/")
            take(bob, output, "jobs")
            bob.goto("/console/jobs/submit/")
            take(bob, output, "submit", full_page=True)
            # An API token made on the account page, used once (its "last used" filled in), the secret not shown.
            bob.goto("/console/account/tokens/")
            bob.get_by_label("Name").fill("laptop CLI")
            bob.get_by_role("button", name="Create token").click()
            secret = bob.get_by_test_id("token-secret").input_value()
            bob.request.get("/api/v1/me/", headers={"Authorization": f"Bearer {secret}"})
            bob.goto("/console/account/tokens/")
            take(bob, output, "tokens")

            phone = page_for("bob", viewport={"width": 390, "height": 844})
            phone.goto(take_submit)
            phone.get_by_test_id("job-log").get_by_text("epoch 3").wait_for()
            take(phone, output, "job-phone")

            admin = page_for("admin")
            admin.goto("/console/overview/")
            wait_points(admin, "[data-flavor-chart]", 8)
            take(admin, output, "overview", full_page=True)
            take_element(admin.get_by_test_id("fleet-heatmap"), output, "heatmap")
            admin.goto("/console/nodes/")
            take(admin, output, "nodes")
            admin.get_by_role("link", name="sim-00").click()
            wait_points(admin, "[data-device-chart]", 8)
            take(admin, output, "node")
            admin.goto("/console/reports/")
            take(admin, output, "reports", full_page=True)

            alice = page_for("alice")
            alice.goto("/console/tenants/")
            take(alice, output, "tenants")
            alice.get_by_role("link", name="Vision").click()
            take(alice, output, "tenant-quotas", full_page=True)

            # A quota request from a team admin waits in alice's inbox (she administers the parent tenant).
            demo.python(ADD_TEAM_ADMIN)
            dora = page_for("dora")
            dora.goto(f"{alice.url}?flavor=nvidia-h100-80g")
            dora.get_by_label("Guaranteed (cards)").fill("5")
            dora.get_by_label("Limit incl. borrowing (cards, empty = no limit)").fill("8")
            dora.get_by_label("Reason").fill("Second vision model needs two more cards through Q3.")
            dora.get_by_role("button", name="Send for approval").click()
            dora.wait_for_url("**/console/approvals/*/")
            alice.goto("/console/approvals/")
            take(alice, output, "approvals")
            alice.goto(dora.url)
            take(alice, output, "approval")

            security = page_for("security")
            security.goto("/console/users/")
            take(security, output, "users")

            auditor = page_for("auditor")
            auditor.goto("/console/audit/")
            auditor.get_by_role("button", name="Verify the chain now").click()
            auditor.wait_for_url("**/console/audit/")
            take(auditor, output, "audit")
            auditor.goto("/console/audit/?action=quota.update")
            auditor.locator("table.data tbody tr td a").first.click()
            auditor.wait_for_url("**/console/audit/*/")
            take(auditor, output, "audit-record", full_page=True)

            dark = page_for("admin", color_scheme="dark")
            dark.goto("/console/overview/")
            with dark.expect_navigation():
                dark.locator("#language-select").select_option("zh-hans")
            wait_points(dark, "[data-flavor-chart]", 5)
            take(dark, output, "overview-dark-zh")
            browser.close()
    finally:
        demo.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
