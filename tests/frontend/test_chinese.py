"""Chinese complete (issue 20, item 9): date inputs keep ISO values in every language, the console's 404 page
and the scheduler's sentences are translated, and plurals read right in English."""

from __future__ import annotations

import re

import pytest

from tenants.models import PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db


def _chinese(client, user) -> None:
    client.force_login(user)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/"})


@pytest.mark.parametrize(
    ("role", "url"),
    [(PlatformRole.SYSTEM_ADMIN, "/console/reports/"), (PlatformRole.AUDITOR, "/console/audit/")],
)
def test_date_inputs_carry_iso_values_in_chinese(client, role, url):
    _chinese(client, make_user(platform_role=role))
    html = client.get(url).content.decode()
    values = re.findall(r'<input type="date" name="[^"]+" value="([^"]*)"', html)
    assert values, "the page shows a date input with a default range"
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", value) for value in values), values


def test_the_console_404_page_is_translated(client):
    _chinese(client, make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    response = client.get("/console/no-such-page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "未找到" in html and "Not Found" not in html


def test_a_placement_sentence_is_shown_in_chinese(client):
    from scheduler.models import JobEvent, JobState
    from scheduler.services.jobs import job_submit

    flavor = make_flavor("nvidia-h100-80g")
    make_node("sim-01", devices=1, flavor=flavor)
    team = make_tenant("team")
    member = make_member(team)
    job = job_submit(
        actor=member,
        spec={"name": "x", "tenant": "team", "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]},
    )
    JobEvent.objects.create(
        job=job, from_state=JobState.QUEUED, to_state=JobState.ADMITTED, message="Placed on sim-01."
    )
    _chinese(client, member)
    html = client.get(f"/console/jobs/{job.pk}/").content.decode()
    assert "已放置到 sim-01。" in html and "Placed on" not in html
    assert "已排队" in html  # the pending sentence ("Queued; the scheduler looks at it …")


def test_one_job_running_is_singular_in_english(client):
    from scheduler.models import Job, JobState
    from scheduler.services.jobs import job_submit

    flavor = make_flavor("nvidia-h100-80g")
    make_node("sim-01", devices=2, flavor=flavor)
    team = make_tenant("team")
    member = make_member(team)
    spec = {"name": "x", "tenant": "team", "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]}
    running = job_submit(actor=member, spec=spec)
    job_submit(actor=member, spec=spec)
    Job.objects.filter(pk=running.pk).update(state=JobState.RUNNING)
    client.force_login(member)
    html = " ".join(client.get("/console/overview/numbers/").content.decode().split())
    assert "1 job running, 1 waiting." in html
