"""One date format per language (issue 20, item 7): every moment the main pages show, in English and in
Chinese, is written the language's one way (``frontend.datetimes``), not three ways on one screen."""

from __future__ import annotations

import datetime
import html
import re

import pytest
from django.utils import timezone

from frontend.datetimes import MOMENT_FORMATS, format_moment
from scheduler.fleet.models import Node
from scheduler.models import Job, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole, PlatformRole
from tenants.services.quotas import quota_set
from tenants.services.tokens import api_token_create
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user
from tests.patching import patch_request_cycle

pytestmark = pytest.mark.django_db

#: The one format of both languages: ``2026-11-27 14:05 UTC``, with seconds where order within a minute matters.
ONE_FORMAT = re.compile(r"\b\d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})? UTC\b")
#: Anything else that writes a moment: a clock time, a year in Chinese, a month name, am/pm, d/m/y, ISO "T".
OTHER_MOMENTS = re.compile(
    r"\d{1,2}:\d{2}|\d{4}\s*年|\d{1,2}\s*月\s*\d{1,2}\s*日"
    r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.? \d"
    r"|\b[ap]\.m\.|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\d{4}-\d{2}-\d{2}T\d",
)
SCRIPT_OR_STYLE = re.compile(r"<(script|style)\b.*?</\1>", re.S | re.I)
READ_ATTRIBUTES = re.compile(r'\s(?:title|aria-label|placeholder|alt)="([^"]*)"')


def shown_text(page: str) -> str:
    """What a person reads or hears: the text between tags and the labels a screen reader or hover shows."""
    page = SCRIPT_OR_STYLE.sub(" ", page)
    labels = " ".join(READ_ATTRIBUTES.findall(page))
    return html.unescape(re.sub(r"<[^>]+>", " ", page) + " " + labels)


@pytest.fixture
def busy_pool(settings, monkeypatch, client):
    """A pool with a moment on every main page: heartbeats, jobs started, finished and expected, events, audit
    records, a token, a quota request, a failed sign-in."""
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: None)
    now = timezone.now()
    flavor = make_flavor("nvidia-h100-80g")
    node = make_node("n1", devices=2, flavor=flavor)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now)
    acme = make_tenant("acme")
    team = make_tenant("team", parent=acme)
    quota_set(actor=None, tenant=acme, flavor=flavor, values={"guaranteed_millis": 2000, "limit_millis": 4000})
    lead = make_member(team, role=MembershipRole.TENANT_ADMIN, username="lead")
    member = make_member(team, username="bob")
    spec = {"tenant": "team", "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]}
    running = job_submit(actor=member, spec={**spec, "name": "running"})
    assert running.pk in run_cycle().placed
    Job.objects.filter(pk=running.pk).update(state=JobState.RUNNING, started_at=now)
    done = job_submit(actor=member, spec={**spec, "name": "done"})
    Job.objects.filter(pk=done.pk).update(
        state=JobState.SUCCEEDED, started_at=now - datetime.timedelta(hours=1), finished_at=now, exit_code=0
    )
    waiting = job_submit(actor=member, spec={**spec, "name": "waiting", "resources": {**spec["resources"], "gpus": 2}})
    Job.objects.filter(pk=waiting.pk).update(
        state=JobState.QUEUED,
        estimated_start_at=now + datetime.timedelta(hours=2),
        estimated_start_p10_at=now + datetime.timedelta(hours=1),
        estimated_start_p90_at=now + datetime.timedelta(hours=3),
    )
    api_token_create(actor=member, name="ci")
    client.force_login(lead)
    client.post(
        f"/console/tenants/{team.pk}/quota-request/",
        {"q-flavor": flavor.name, "q-guaranteed_cards": "1", "q-guaranteed_memory_gib": "0", "q-reason": "more"},
    )
    client.logout()
    client.post("/accounts/login/", {"username": "bob", "password": "wrong-password"})
    from tenants.models import ApprovalRequest

    approval = ApprovalRequest.objects.get()
    sysadmin = make_user("root", platform_role=PlatformRole.SYSTEM_ADMIN)
    auditor = make_user("eve", platform_role=PlatformRole.AUDITOR)
    security = make_user("sec", platform_role=PlatformRole.SECURITY_ADMIN)
    from audit.models import AuditRecord

    record = AuditRecord.objects.order_by("-pk").first()
    return {
        sysadmin: [
            "/console/overview/",
            "/console/nodes/",
            f"/console/nodes/{node.pk}/",
            "/console/jobs/",
            f"/console/jobs/{running.pk}/",
            f"/console/jobs/{done.pk}/",
            f"/console/jobs/{waiting.pk}/",
            "/console/approvals/",
            f"/console/approvals/{approval.pk}/",
            f"/console/tenants/{team.pk}/",
        ],
        member: ["/console/jobs/", f"/console/jobs/{waiting.pk}/", "/console/account/tokens/"],
        auditor: ["/console/audit/", f"/console/audit/{record.pk}/"],
        security: ["/console/users/", f"/console/users/{member.pk}/", "/console/lockouts/"],
    }


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_every_moment_on_the_main_pages_is_written_the_languages_one_way(client, busy_pool, language):
    client.cookies["django_language"] = language
    seen = 0
    for user, urls in busy_pool.items():
        client.force_login(user)
        for url in urls:
            response = client.get(url, HTTP_ACCEPT_LANGUAGE=language)
            assert response.status_code == 200, url
            text = shown_text(response.content.decode())
            seen += len(ONE_FORMAT.findall(text))
            others = OTHER_MOMENTS.findall(ONE_FORMAT.sub(" ", text))
            assert others == [], f"{url} ({language}) writes moments another way: {others}"
    # The pages did show moments (a test that finds none proves nothing).
    assert seen >= 20


def test_the_charts_get_the_same_format_from_the_page(client, busy_pool):
    sysadmin = next(iter(busy_pool))
    client.force_login(sysadmin)
    for language in MOMENT_FORMATS:
        client.cookies["django_language"] = language
        page = client.get("/console/overview/").content.decode()
        assert f'data-datetime-format="{MOMENT_FORMATS[language].script}"' in page


def test_a_moment_is_written_in_utc_to_the_minute_or_second():
    moment = datetime.datetime(2026, 11, 27, 22, 5, 9, tzinfo=datetime.timezone(datetime.timedelta(hours=8)))
    assert format_moment(moment, language="en") == "2026-11-27 14:05 UTC"
    assert format_moment(moment, seconds=True, language="zh-hans") == "2026-11-27 14:05:09 UTC"
    assert format_moment(None) == ""
