"""Issue 20 ("the console's everyday work") in chromium, each item in English and in Simplified Chinese.

The language is chosen as a user chooses it: the header's language menu (Django's set_language, which stores
the ``django_language`` cookie). Every text the tests look for comes from the translation catalogue
(``tr``), and in Chinese a text the catalogue leaves in English fails the test, so an untranslated sentence is
found here as well as in tests/frontend/test_chinese.py. The item 8 queue view is tested with its own page.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import translation
from playwright.sync_api import expect

from tests.frontend.browser.conftest import login, new_page, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LANGUAGES = ["en", "zh-hans"]
PHONE = {"width": 390, "height": 844}
ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
TENANT_IDS = """
import json
from tenants.models import Tenant
print(json.dumps({t.slug: t.pk for t in Tenant.objects.all()}))
"""
ADD_TEAM_ADMIN = """
from portal.demo import DEMO_PASSWORD
from tenants.models import Tenant, User
from tenants.services.identity import user_create
from tenants.services.memberships import membership_create
if not User.objects.filter(username="dora").exists():
    dora = user_create(actor=None, username="dora", password=DEMO_PASSWORD)
    membership_create(actor=None, user=dora, tenant=Tenant.objects.get(slug="acme-vision"), role="tenant_admin")
"""
# What each node holds, summed here from the allocation rows themselves (not through the console's selector).
ALLOCATED_BY_NODE = """
import json
from scheduler.models import Allocation, Node
held = {node.name: 0 for node in Node.objects.all()}
for allocation in Allocation.objects.active().select_related("node"):
    held[allocation.node.name] += allocation.millis
print(json.dumps(held))
"""
RESTORE_ACME_ASCEND = """
from portal.demo import DEMO_QUOTAS
from scheduler.models import ResourceFlavor
from tenants.models import Tenant
from tenants.services import quotas
guaranteed, limit = next((g, l) for slug, f, g, l in DEMO_QUOTAS if (slug, f) == ("acme", "ascend-910b"))
quotas.quota_set(
    actor=None, tenant=Tenant.objects.get(slug="acme"), flavor=ResourceFlavor.objects.get(name="ascend-910b"),
    values={"guaranteed_millis": guaranteed, "limit_millis": limit},
)
"""
JOB_SHARE = (
    "This job holds %(share)s of this card, which other jobs share: its part of the card's work is estimated from "
    "the allocations; the rest is other jobs\u2019 work, not shown in detail."
)
OVERRIDE_REFUSED = "This step waits for a %(role)s; a system admin deciding it instead must say why (comment)."
OVERCOMMITTED = (
    "Overcommitted: %(flavor)s guarantees add up to %(g)s cards, but the pool has %(c)s schedulable cards of it. "
    "Guarantees cannot all be met at once."
)


def tr(language: str, text) -> str:
    """``text`` (a msgid or a lazy label) as the console writes it in ``language``; in Chinese it must be
    translated."""
    with translation.override(language):
        shown = str(translation.gettext(text) if isinstance(text, str) else text)
    if language != "en":
        assert shown != str(text) or not re.search(r"[a-z]{3}", shown), f"untranslated: {text!r}"
    return shown


def tr_head(language: str, msgid: str) -> str:
    """The part of a sentence with placeholders before its first placeholder (what a page shows verbatim)."""
    return tr(language, msgid).split("%(")[0].strip()


def tr_pattern(language: str, msgid: str, **groups: str) -> re.Pattern:
    """A sentence with placeholders as a regular expression, each placeholder matching ``groups[name]``."""
    pattern = re.escape(tr(language, msgid))
    for name, group in groups.items():
        pattern = pattern.replace(re.escape(f"%({name})s"), f"(?:{group})")  # no named groups in JavaScript
    return re.compile(pattern)


def choose_language(page, language: str) -> None:
    """Pick ``language`` in the header's menu, as a user does (the page reloads in it)."""
    if page.locator("html").get_attribute("lang").lower() != language:
        with page.expect_navigation():
            page.locator("#language-select").select_option(language)
    assert page.locator("html").get_attribute("lang").lower() == language


def signed_in(browser, live_demo, username: str, language: str, viewport=None):
    page = new_page(browser, live_demo)
    if viewport:
        page.set_viewport_size(viewport)
    login(page, username)
    choose_language(page, language)
    return page


def no_sideways_scroll(page) -> bool:
    widths = page.evaluate(
        "() => ({scroll: document.scrollingElement.scrollWidth, client: document.scrollingElement.clientWidth})"
    )
    return widths["scroll"] <= widths["client"]


def cards(text: str) -> float:
    return float(text.strip().split()[0])


@pytest.fixture(scope="module")
def tenant_ids(live_demo) -> dict[str, int]:
    return json.loads(live_demo.python(TENANT_IDS).strip().splitlines()[-1])


@pytest.fixture
def pages(request):
    """Pages a test opens itself; photographed and closed at the end."""
    opened = []
    yield opened
    for index, page in enumerate(opened):
        shot(page, f"{request.node.name}-{index}")
        page.context.close()


# --- 1 and 4: approval chains that finish, the prefilled form, changed rows --------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_1_4_a_request_names_who_decides_and_the_system_admin_decides_it(
    browser, live_demo, tenant_ids, pages, language
):
    from tenants.models import ApprovalStatus, ApprovalStepRole

    # alice administers Research; nobody administers ACME above it, so that step is passed over.
    alice = signed_in(browser, live_demo, "alice", language)
    pages.append(alice)
    alice.goto(f"/console/tenants/{tenant_ids['acme-research']}/?flavor=nvidia-a100-40g")
    form = alice.locator("form[action$='/quota-request/']")
    # Prefilled from Research's quota (4 A100 guaranteed, limit 4), not 0 and "no limit".
    assert float(form.get_by_label(tr(language, "Guaranteed (cards)")).input_value()) == 4.0
    assert (
        float(form.get_by_label(tr(language, "Limit incl. borrowing (cards, empty = no limit)")).input_value()) == 4.0
    )
    jobs_field = form.get_by_label(tr(language, "Maximum running jobs (empty = no limit)"))
    wanted = int(jobs_field.input_value() or 40) + 1
    jobs_field.fill(str(wanted))
    form.get_by_label(tr(language, "Reason")).fill(f"browser test {language}")
    form.get_by_role("button", name=tr(language, "Send for approval")).click()
    alice.wait_for_url(re.compile(r"/console/approvals/\d+/$"))
    approval_path = alice.url.removeprefix(live_demo.base_url)

    # Told at once who will decide, and why the department's parent is skipped.
    sent = tr_head(language, "Quota change request %(id)s sent for approval. It will be decided by: %(chain)s.")
    message = alice.get_by_text(sent).first
    expect(message).to_contain_text("admin")
    expect(
        alice.get_by_text(
            tr_head(
                language, "Nobody but you holds the role %(roles)s, so the request goes to the next approver instead."
            )
        )
    ).to_be_visible()
    plan = alice.get_by_test_id("approval-plan").inner_text()
    assert tr(language, ApprovalStepRole.SYSTEM_ADMIN.label) in plan and "admin" in plan.split(":")[-1], plan
    passed_over = alice.get_by_test_id("approval-escalation")
    expect(passed_over).to_contain_text(
        tr_head(language, "Passed over: %(role)s — nobody but the requester holds that role.")
    )
    expect(passed_over).to_contain_text(tr(language, ApprovalStepRole.PARENT_TENANT_ADMIN.label))
    # Only the changed figure was sent, and it is the one marked.
    changed = alice.get_by_test_id("changed-row")
    expect(changed).to_have_count(1)
    expect(changed).to_contain_text(str(wanted))
    assert alice.get_by_test_id("approval-status").inner_text() == tr(language, ApprovalStatus.PENDING.label)

    # The system admin finds it waiting in the inbox and decides it with a comment.
    admin = signed_in(browser, live_demo, "admin", language)
    pages.append(admin)
    admin.goto("/console/approvals/")
    admin.locator(f"a[href='{approval_path}']").first.click()
    admin.get_by_label(tr(language, "Comment")).fill(f"fits ({language})")
    admin.get_by_role("button", name=tr(language, "Approve"), exact=True).click()
    expect(admin.get_by_text(tr(language, "Decision recorded."))).to_be_visible()
    assert admin.get_by_test_id("approval-status").inner_text() == tr(language, ApprovalStatus.APPROVED.label)
    expect(admin.locator("ol.timeline")).to_contain_text(f"fits ({language})")


@pytest.mark.parametrize("language", LANGUAGES)
def test_1_a_system_admin_decides_a_step_waiting_for_someone_else_with_a_comment(
    browser, live_demo, tenant_ids, pages, language
):
    from tenants.models import ApprovalStatus, ApprovalStepRole

    live_demo.python(ADD_TEAM_ADMIN)
    # dora (tenant admin of Vision) asks; the step waits for alice, the admin of Research above it.
    dora = signed_in(browser, live_demo, "dora", language)
    pages.append(dora)
    dora.goto(f"/console/tenants/{tenant_ids['acme-vision']}/?flavor=nvidia-h100-80g")
    form = dora.locator("form[action$='/quota-request/']")
    jobs_field = form.get_by_label(tr(language, "Maximum running jobs (empty = no limit)"))
    jobs_field.fill(str(int(jobs_field.input_value() or 60) + 1))
    form.get_by_role("button", name=tr(language, "Send for approval")).click()
    dora.wait_for_url(re.compile(r"/console/approvals/\d+/$"))
    approval_path = dora.url.removeprefix(live_demo.base_url)
    plan = dora.get_by_test_id("approval-plan").locator("li")
    expect(plan.first).to_contain_text(tr(language, ApprovalStepRole.PARENT_TENANT_ADMIN.label))
    expect(plan.first).to_contain_text("alice")

    admin = signed_in(browser, live_demo, "admin", language)
    pages.append(admin)
    admin.goto("/console/approvals/")
    admin.get_by_test_id("overridable").locator(f"a[href='{approval_path}']").first.click()
    expect(admin.get_by_test_id("override-note")).to_contain_text(
        tr_pattern(
            language,
            "This step waits for a %(role)s. As a system admin you may decide it instead; say why in the comment "
            "(it is audited).",
            role=re.escape(tr(language, ApprovalStepRole.PARENT_TENANT_ADMIN.label)),
        )
    )
    # Without a comment the override is refused, in the page's language.
    admin.get_by_role("button", name=tr(language, "Approve"), exact=True).click()
    parent_admin = re.escape(tr(language, ApprovalStepRole.PARENT_TENANT_ADMIN.label))
    expect(admin.locator(".msg.error")).to_have_text(tr_pattern(language, OVERRIDE_REFUSED, role=parent_admin))
    admin.get_by_label(tr(language, "Comment")).fill(f"alice is away ({language})")
    admin.get_by_role("button", name=tr(language, "Approve"), exact=True).click()
    expect(admin.get_by_text(tr(language, "Decision recorded."))).to_be_visible()
    history = admin.locator("ol.timeline")
    expect(history).to_contain_text(f"alice is away ({language})")
    expect(history).to_contain_text(f"admin ({tr(language, ApprovalStepRole.PARENT_TENANT_ADMIN.label)})")
    # The next step is the system admin's own: no override, no comment needed, and the request is decided.
    expect(admin.get_by_test_id("override-note")).to_have_count(0)
    admin.get_by_role("button", name=tr(language, "Approve"), exact=True).click()
    expect(admin.get_by_test_id("approval-status")).to_have_text(tr(language, ApprovalStatus.APPROVED.label))


# --- 2, 6, 7, 9, 10: a running job: live output, its share of the card, its page on a phone -------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_2_7_9_10_a_running_job_streams_its_output_and_fits_a_phone(browser, live_demo, pages, language):
    bob = signed_in(browser, live_demo, "bob", language)
    pages.append(bob)
    sockets: list[str] = []
    bob.on("websocket", lambda socket: sockets.append(socket.url))
    bob.goto("/console/jobs/submit/")
    command = bob.get_by_label(tr(language, "Command"))
    assert command.get_attribute("placeholder").startswith("python3 -c ")  # the example that runs as it is
    bob.get_by_label(tr(language, "Name")).fill(f"logs-{language}")
    bob.get_by_label(tr(language, "Priority")).select_option("high")
    bob.get_by_label(tr(language, "a fraction of one card")).check()
    bob.get_by_label(tr(language, "Share of one card")).select_option("500")
    bob.get_by_label(tr(language, "Device memory (GiB, for a fraction)")).fill("8")
    command.fill(command.get_attribute("placeholder"))  # the example, as it is
    bob.get_by_role("button", name=tr(language, "Submit"), exact=True).click()
    bob.wait_for_url(re.compile(r"/console/jobs/\d+/$"))
    job_id = int(bob.url.rstrip("/").rsplit("/", 1)[-1])
    bob.locator("[data-testid='job-state'].running").wait_for(timeout=60_000)

    # 2: lines appear while the job runs, from the socket, and the API returns them as text too.
    log = bob.get_by_test_id("job-log")
    expect(log).to_contain_text("epoch 2 of 30", timeout=30_000)
    assert log.text_content().startswith("epoch 1 of 30\nepoch 2 of 30\n")
    assert any(re.search(rf"/ws/jobs/{job_id}/logs/\?replica=0&offset=0$", url) for url in sockets), sockets
    text = bob.request.get(f"/api/v1/jobs/{job_id}/logs/?replica=0&offset=0&format=text")
    assert text.status == 200 and text.text().startswith("epoch 1 of 30\n")
    bob.get_by_role("button", name=tr(language, "Pause")).click()
    expect(bob.locator("[data-log-status]")).to_have_text(
        tr(language, "Paused: new output is kept and shown when you follow again.")
    )
    paused = len(log.text_content())
    bob.wait_for_timeout(2_500)  # an epoch or so comes meanwhile
    assert len(log.text_content()) == paused
    bob.get_by_role("button", name=tr(language, "Follow")).click()
    expect(bob.locator("[data-log-status]")).to_have_text(tr(language, "Following the output as it comes."))
    with bob.expect_download() as download:
        bob.get_by_role("link", name=tr(language, "Download")).click()
    assert download.value.suggested_filename == f"job-{job_id}-replica-0.log"
    assert open(download.value.path(), encoding="utf-8").read().startswith("epoch 1 of 30\n")

    # 6: the priority comes out of the API as the word that went in.
    detail = bob.request.get(f"/api/v1/jobs/{job_id}/").json()
    assert detail["priority_class"] == "high", detail

    # 9: the placement message in the page's language; 10: the command shown with its quotes.
    placed = tr_pattern(language, "Placed on %(nodes)s.", nodes=r"sim-\d\d")
    expect(bob.locator("ol.timeline")).to_contain_text(placed)
    assert bob.get_by_test_id("job-command").inner_text().startswith("python3 -c 'import time;")

    # 7: the chart of a half card draws this job's share, and says so.
    share = bob.get_by_test_id("job-share")
    expect(share).to_contain_text(
        tr_head(
            language,
            JOB_SHARE,
        )
    )
    expect(share).to_contain_text("0.5")

    # 10: at 390 px the running job's page (command, output, chart) does not scroll sideways.
    bob.set_viewport_size(PHONE)
    bob.wait_for_timeout(300)
    assert no_sideways_scroll(bob), bob.evaluate("document.scrollingElement.scrollWidth")
    shot(bob, f"job-running-phone-{language}")
    bob.set_viewport_size({"width": 1366, "height": 860})

    bob.once("dialog", lambda dialog: dialog.accept())
    bob.get_by_role("button", name=tr(language, "Cancel job")).click()
    bob.locator("[data-testid='job-state'].cancelled").wait_for()


# --- 3 and 4: the system admin's tenant and quota pages; the overcommit warning ------------------------------


def create_team(admin, language: str, parent_id: int) -> int:
    admin.goto("/console/tenants/new/")
    suffix = uuid.uuid4().hex[:6]
    admin.get_by_label(tr(language, "Name"), exact=True).fill(f"Team {language} {suffix}")
    admin.get_by_label(tr(language, "Short name (slug)")).fill(f"team-{suffix}")
    admin.get_by_label(tr(language, "Parent tenant")).select_option(str(parent_id))
    admin.get_by_role("button", name=tr(language, "Create tenant")).click()
    admin.wait_for_url(re.compile(r"/console/tenants/\d+/$"))
    expect(admin.locator("h1")).to_contain_text(f"Team {language} {suffix}")
    return int(admin.url.rstrip("/").rsplit("/", 1)[-1])


@pytest.mark.parametrize("language", LANGUAGES)
def test_3_4_admin_creates_a_tenant_sets_quotas_and_sees_the_overcommit(
    browser, live_demo, tenant_ids, pages, language
):
    admin = signed_in(browser, live_demo, "admin", language)
    pages.append(admin)
    # A new team under ACME, through the console.
    team_id = create_team(admin, language, tenant_ids["acme"])
    # An empty tenant can be deleted again (after the confirmation).
    empty_id = create_team(admin, language, tenant_ids["acme"])
    admin.goto(f"/console/tenants/{empty_id}/edit/")
    admin.once("dialog", lambda dialog: dialog.accept())
    admin.get_by_role("button", name=tr(language, "Delete tenant")).click()
    expect(admin.get_by_text(tr_pattern(language, "Tenant %(name)s deleted.", name=".+"))).to_be_visible()
    assert admin.goto(f"/console/tenants/{empty_id}/").status == 404

    # Renamed on its edit page.
    admin.goto(f"/console/tenants/{team_id}/edit/")
    new_name = f"Renamed {language} {uuid.uuid4().hex[:4]}"
    admin.get_by_label(tr(language, "Name"), exact=True).fill(new_name)
    admin.get_by_role("button", name=tr(language, "Save"), exact=True).click()
    admin.goto(f"/console/tenants/{team_id}/")
    expect(admin.locator("h1")).to_contain_text(new_name)
    # A system admin submits no work: the submit page says why (403), as the API does.
    refused = admin.goto("/console/jobs/submit/")
    assert refused.status == 403
    expect(admin.get_by_test_id("cannot-submit").locator("h2")).to_have_text(tr(language, "You cannot submit jobs"))

    # Its quota: ACME's guarantee is all given to Research, so a guarantee for the team is refused at the field.
    admin.goto(f"/console/tenants/{team_id}/quotas/?flavor=nvidia-h100-80g")
    admin.get_by_label(tr(language, "Guaranteed (cards)")).fill("1")
    admin.get_by_role("button", name=tr(language, "Save quota")).click()
    error = admin.locator(".errorlist, .error, [role='alert']").first
    expect(error).to_be_visible()
    if language != "en":
        assert not re.search(r"\b(guarantees|guaranteed|raise)\b", error.inner_text()), error.inner_text()
    # A limit alone is fine: saved at once.
    admin.get_by_label(tr(language, "Guaranteed (cards)")).fill("0")
    admin.get_by_label(tr(language, "Limit incl. borrowing (cards, empty = no limit)")).fill("2")
    admin.get_by_role("button", name=tr(language, "Save quota")).click()
    saved = tr_pattern(language, "Quota of %(tenant)s for %(flavor)s saved.", tenant=".+", flavor="nvidia-h100-80g")
    expect(admin.get_by_text(saved)).to_be_visible()

    # Raising ACME's Ascend guarantee past the pool's 8 cards: the overview warns.
    try:
        admin.goto(f"/console/tenants/{tenant_ids['acme']}/quotas/?flavor=ascend-910b")
        guaranteed = admin.get_by_label(tr(language, "Guaranteed (cards)"))
        assert float(guaranteed.input_value()) == 8.0  # prefilled with the current guarantee
        guaranteed.fill("9")
        admin.get_by_label(tr(language, "Limit incl. borrowing (cards, empty = no limit)")).fill("9")
        admin.get_by_role("button", name=tr(language, "Save quota")).click()
        saved_ascend = tr_pattern(
            language, "Quota of %(tenant)s for %(flavor)s saved.", tenant=".+", flavor="ascend-910b"
        )
        expect(admin.get_by_text(saved_ascend)).to_be_visible()
        admin.goto("/console/overview/")
        warning = admin.get_by_test_id("overcommit-warning")
        expect(warning).to_contain_text(
            tr_pattern(
                language,
                OVERCOMMITTED,
                flavor="ascend-910b",
                g="9",
                c="8",
            )
        )
        shot(admin, f"overcommit-{language}")
    finally:
        live_demo.python(RESTORE_ACME_ASCEND)


# --- 3 and 10: the security admin's users and roles, in words --------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_3_10_security_admin_creates_an_account_and_roles_read_as_words(browser, live_demo, pages, language):
    from tenants.models import PlatformRole

    security = signed_in(browser, live_demo, "security", language)
    pages.append(security)
    security.goto("/console/users/")
    users = security.get_by_test_id("user-table")
    expect(users).to_contain_text(tr(language, PlatformRole.SYSTEM_ADMIN.label))
    expect(users).to_contain_text(tr(language, PlatformRole.AUDITOR.label))
    assert "system_admin" not in users.inner_text()

    security.get_by_role("link", name=tr(language, "New account")).click()
    name = f"user-{language}-{uuid.uuid4().hex[:6]}"
    security.get_by_label(tr(language, "Username")).fill(name)
    security.locator("select[name='platform_role']").select_option("auditor")
    expect(security.get_by_label(tr(language, "Platform role"))).to_be_visible()
    password = f"Pw-{uuid.uuid4().hex}"
    security.get_by_label(tr(language, "Initial password")).fill(password)
    security.locator("main form button[type='submit']").first.click()
    security.wait_for_url(re.compile(r"/console/users/\d+/$"))
    expect(security.locator("h1")).to_contain_text(name)
    assert security.locator("select[name='platform_role']").input_value() == "auditor"
    security.goto(f"/console/users/?q={name}")
    expect(security.get_by_test_id("user-table")).to_contain_text(tr(language, PlatformRole.AUDITOR.label))

    # Five wrong passwords lock the new account out; the security admin sees it and unlocks it.
    stranger = new_page(browser, live_demo)
    pages.append(stranger)
    for _attempt in range(5):
        stranger.goto("/accounts/login/")
        stranger.get_by_label("Username").fill(name)
        stranger.get_by_label("Password").fill("wrong-password")
        stranger.get_by_role("button", name="Log in").click()
        stranger.wait_for_load_state()
    security.goto("/console/lockouts/")
    expect(security.locator("h1")).to_have_text(tr(language, "Sign-in lockouts"))
    locked = security.get_by_test_id("locked-table").locator("tr", has_text=name)
    expect(locked).to_have_count(1)
    security.once("dialog", lambda dialog: dialog.accept())
    locked.get_by_role("button", name=tr(language, "Unlock")).click()
    expect(security.get_by_test_id("locked-table").locator("tr", has_text=name)).to_have_count(0)
    stranger.goto("/accounts/login/")
    stranger.get_by_label("Username").fill(name)
    stranger.get_by_label("Password").fill(password)
    stranger.get_by_role("button", name="Log in").click()
    stranger.wait_for_url(lambda url: "/accounts/login/" not in url)  # signs in again

    assert security.goto("/console/tenants/new/").status == 404  # tenants are the system admin's


# --- 3: API tokens (both languages in test_api_tokens.py); 6: the typed API as a user meets it ----------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_6_the_api_documents_the_job_spec_and_refuses_what_it_would_ignore(browser, live_demo, pages, language):
    bob = signed_in(browser, live_demo, "bob", language)
    pages.append(bob)
    bob.goto("/api/docs/")
    # Swagger UI lists the job spec as a schema of its own, with its fields.
    model = bob.locator("#model-JobSpecRequest")
    model.wait_for(timeout=30_000)
    model.locator(".model-toggle").first.click()
    expect(model).to_contain_text("priority_class")
    schema = bob.request.get("/api/schema/?format=json").json()
    spec = schema["components"]["schemas"]["JobSpecRequest"]
    assert {"command", "replicas", "priority_class"} <= set(spec["properties"])
    assert "additionalProp1" not in json.dumps(schema)
    for query, field in (("ordering=secret_field", "ordering"), ("serach=x", "serach")):
        refused = bob.request.get(f"/api/v1/jobs/?{query}")
        assert refused.status == 400, (query, refused.text())
        assert field in refused.json()["errors"]
    found = bob.request.get("/api/v1/jobs/?search=resnet50&ordering=-id").json()["results"]
    assert found and all("resnet50" in job["name"] for job in found)


# --- 5: numbers you can trust ------------------------------------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_5_nodes_and_overview_show_what_is_allocated(browser, live_demo, pages, language):
    admin = signed_in(browser, live_demo, "admin", language)
    pages.append(admin)
    for _attempt in range(3):  # the demo's live jobs may end between the reads
        held = json.loads(live_demo.python(ALLOCATED_BY_NODE).strip().splitlines()[-1])
        admin.goto("/console/nodes/")
        header = admin.locator("table.data thead th").all_inner_texts()
        column = next(i for i, text in enumerate(header) if tr(language, "Allocated (cards)") in text)
        shown = {}
        for row in admin.locator("table.data tbody tr").all():
            cells = row.locator("td").all_inner_texts()
            shown[cells[0].strip()] = round(cards(cells[column]) * 1000)
        admin.goto("/console/overview/")
        by_flavor = [cards(text) for text in admin.get_by_test_id("flavor-allocated").all_inner_texts()]
        overview = round(sum(by_flavor) * 1000)
        if shown == held and overview == sum(held.values()):
            break
    assert shown == held
    assert overview == sum(held.values()), (by_flavor, held)
    assert any(held.values()), held  # the demo's two live jobs hold cards
    expect(admin.get_by_role("heading", name=tr(language, "Capacity by flavor"))).to_be_visible()


# --- 7: the fleet heatmap, one date format --------------------------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_7_the_heatmap_opens_a_node_and_dates_read_the_same(browser, live_demo, pages, language):
    admin = signed_in(browser, live_demo, "admin", language)
    pages.append(admin)
    admin.goto("/console/overview/")
    heatmap = admin.get_by_test_id("fleet-heatmap")
    expect(heatmap.get_by_role("heading", name=tr(language, "Fleet heatmap"))).to_be_visible()
    rows = heatmap.get_by_test_id("heat-row")
    expect(rows).to_have_count(3)  # sim-00, sim-01, sim-02
    assert heatmap.locator("[data-heat-uuid]").count() == 20  # 8 H100 + 4 A100 + 8 Ascend
    assert admin.locator("html").get_attribute("data-datetime-format") == "{YYYY}-{MM}-{DD} {HH}:{mm} UTC"
    name = rows.nth(1).locator(".heat-name").inner_text()
    rows.nth(1).click()
    admin.wait_for_url(re.compile(r"/console/nodes/\d+/$"))
    expect(admin.locator("h1")).to_contain_text(name)
    expect(admin.get_by_test_id("card-panel")).not_to_have_count(0)
    # Every moment on the node page in the one format.
    admin.goto("/console/nodes/")
    moments = re.findall(r"\d{4}[-/]\d{1,2}[-/]\d{1,2}[^\n\t]*?UTC", admin.locator("main").inner_text())
    assert moments and all(re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}(:\d{2})? UTC", m) for m in moments), moments


# --- 9: Chinese complete: ISO date inputs, the 404 page, plurals -------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_9_date_inputs_keep_iso_values_and_the_404_page_is_translated(browser, live_demo, pages, language):
    admin = signed_in(browser, live_demo, "admin", language)
    pages.append(admin)
    admin.goto("/console/reports/")
    for label in ("From (date, UTC)", "To (date, UTC, inclusive)"):
        assert ISO_DATE.match(admin.get_by_label(tr(language, label)).first.input_value())
    expect(admin.get_by_test_id("usage-table")).to_contain_text("acme-vision")  # the demo's hour

    response = admin.goto("/console/no-such-page/")
    assert response.status == 404
    expect(admin.get_by_test_id("not-found").locator("h1")).to_have_text(tr(language, "Not found"))
    expect(admin.get_by_test_id("not-found")).to_contain_text(
        tr(language, "There is no such page, or it is not one you may see.")
    )

    auditor = signed_in(browser, live_demo, "auditor", language)
    pages.append(auditor)
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    auditor.goto(f"/console/audit/?since={yesterday}")
    # The filter keeps the date it was given, and the export form opens with its default range.
    assert auditor.get_by_label(tr(language, "From (date)"), exact=True).input_value() == yesterday
    expect(auditor.locator("table.data tbody tr").first).to_be_visible()
    export_from = auditor.get_by_label(tr(language, "From (date, UTC)"))
    assert ISO_DATE.match(export_from.input_value()), export_from.input_value()

    bob = signed_in(browser, live_demo, "bob", language)
    pages.append(bob)
    bob.goto("/console/overview/")
    heading = bob.get_by_role("heading", name=tr(language, "Your tenants"), exact=True)
    own = bob.locator("main section.card", has=heading).first.inner_text()
    if language == "en":
        assert not re.search(r"\b1 jobs\b", own) and not re.search(r"\b(0|[2-9]|\d\d+) job running\b", own), own
        assert re.search(r"\d+ jobs? running", own), own
    else:
        assert "running" not in own and "jobs" not in own, own


# --- 10: a living pool at first login; audit details as tables; role names in words ------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_10_the_auditor_reads_records_as_tables_with_roles_in_words(browser, live_demo, pages, language):
    from tenants.models import PlatformRole

    auditor = signed_in(browser, live_demo, "auditor", language, viewport=PHONE)
    pages.append(auditor)
    auditor.goto("/console/audit/?action=quota.update")
    # The tenant filter is a picker of names, not a number to type.
    tenant = auditor.locator("select[name='tenant']").first
    assert "Research" in tenant.inner_text()
    roles = auditor.locator("table.data").first.inner_text()
    assert "system_admin" not in roles and tr(language, PlatformRole.SYSTEM_ADMIN.label) in roles
    auditor.locator("table.data tbody tr td a").first.click()
    auditor.wait_for_url(re.compile(r"/console/audit/\d+/$"))
    change = auditor.get_by_test_id("audit-change")
    expect(change.locator("tr[data-changed]")).not_to_have_count(0)
    assert "{'" not in auditor.locator("main").inner_text()
    assert no_sideways_scroll(auditor)

    admin = signed_in(browser, live_demo, "admin", language)
    pages.append(admin)
    admin.goto("/console/overview/")
    # About an hour of history and live work at first login: running jobs and a chart with data.
    assert int(admin.get_by_test_id("jobs-running").inner_text()) >= 1
    expect(admin.locator("[data-flavor-chart]")).to_have_attribute("data-history-points", re.compile(r"^[1-9]\d*$"))
