"""A quota change goes through the whole approval chain in the browser: a team's tenant admin asks, the
department's tenant admin approves, the system admin approves last, and the new quota shows on the tenant."""

from __future__ import annotations

import pytest

from tests.frontend.browser.conftest import login, new_page, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ADD_TEAM_ADMIN = """
from portal.demo import DEMO_PASSWORD
from tenants.models import Tenant, User
from tenants.services.identity import user_create
from tenants.services.memberships import membership_create
if not User.objects.filter(username="dora").exists():
    dora = user_create(actor=None, username="dora", password=DEMO_PASSWORD)
    membership_create(actor=None, user=dora, tenant=Tenant.objects.get(slug="acme-vision"), role="tenant_admin")
print(Tenant.objects.get(slug="acme-vision").pk)
"""


def decide(page, approval_url: str, decision: str, comment: str = "") -> None:
    page.goto(approval_url)
    if comment:
        page.get_by_label("Comment").fill(comment)
    page.get_by_role("button", name=decision, exact=True).click()
    page.get_by_text("Decision recorded.").wait_for()


def test_quota_request_is_approved_by_both_approvers(browser, live_demo):
    vision_id = int(live_demo.python(ADD_TEAM_ADMIN).strip().splitlines()[-1])
    dora = new_page(browser, live_demo)
    login(dora, "dora")
    dora.goto(f"/console/tenants/{vision_id}/")
    dora.get_by_test_id("quota-flavors").get_by_role("link", name="nvidia-h100-80g").click()
    dora.wait_for_url("**flavor=nvidia-h100-80g*")
    dora.get_by_label("Guaranteed (cards)").fill("5")
    dora.get_by_label("Limit incl. borrowing (cards, empty = no limit)").fill("8")
    dora.get_by_label("Reason").fill("second training project")
    dora.get_by_role("button", name="Send for approval").click()
    dora.wait_for_url("**/console/approvals/*/")
    approval_url = dora.url
    assert dora.get_by_test_id("approval-status").inner_text() == "pending"

    alice = new_page(browser, live_demo)
    login(alice, "alice")
    alice.goto("/console/approvals/")
    alice.locator(f"a[href='{approval_url.removeprefix(live_demo.base_url)}']").first.wait_for()
    decide(alice, approval_url, "Approve", "ok from research")

    admin = new_page(browser, live_demo)
    login(admin, "admin")
    decide(admin, approval_url, "Approve")
    assert admin.get_by_test_id("approval-status").inner_text() == "approved"
    shot(admin, "approval-approved")

    dora.goto(f"/console/tenants/{vision_id}/")
    row = dora.get_by_test_id("quota-table").locator("tr", has_text="nvidia-h100-80g")
    cells = row.locator("td").all_inner_texts()
    assert cells[0] == "5" and cells[4] == "8", cells  # guaranteed 5 cards, limit 8
    shot(dora, "quota-after-approval")
    for page in (dora, alice, admin):
        page.context.close()
