"""The jobs list as a queue view (issue 20, item 8): why each job waits, its place in the queue, where it runs,
how long it has run; a tenant picker of the tenants the user sees; bulk cancel through the one cancel service."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditRecord
from scheduler.models import Job, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_cancel, job_submit
from tenants.models import MembershipRole, PlatformRole
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant, make_user

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr[^>]*data-job-id="(\d+)"[^>]*>(.*?)</tr>', re.S)
CELL = re.compile(r'<td[^>]*data-col="(\w+)"[^>]*>(.*?)</td>', re.S)
TAG = re.compile(r"<[^>]+>")


def cells(html: str) -> dict[int, dict[str, str]]:
    """Job id → column → the cell's HTML, for every row of the jobs table."""
    return {int(pk): dict(CELL.findall(row)) for pk, row in ROW.findall(html)}


def text(cell_html: str) -> str:
    return " ".join(TAG.sub(" ", cell_html).split())


@pytest.fixture
def world(settings):
    # Cycles run when a test says so (run_cycle): the cycle a change requests runs on commit, and these tests'
    # transactions never commit.
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    flavor = make_flavor("nvidia-h100-80g")
    node = make_node("n1", devices=1, flavor=flavor)
    acme = make_tenant("acme")
    vision = make_tenant("vision", parent=acme)
    nlp = make_tenant("nlp", parent=acme)
    return {
        "flavor": flavor,
        "node": node,
        "acme": acme,
        "vision": vision,
        "nlp": nlp,
        "bob": make_member(vision, username="bob"),
        "bea": make_member(vision, username="bea"),
        "carol": make_member(nlp, username="carol"),
        "alice": make_member(acme, role=MembershipRole.TENANT_ADMIN, username="alice"),
        "vic": make_member(vision, role=MembershipRole.VIEWER, username="vic"),
    }


def submit(actor, tenant, name="train", priority="normal", preemptible=True) -> Job:
    spec = {
        "name": name,
        "tenant": tenant.slug,
        "priority_class": priority,
        "preemptible": preemptible,
        "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
        "command": ["python", "train.py"],
    }
    return job_submit(actor=actor, spec=spec)


@pytest.fixture
def queue(world):
    """The node's one card taken by a high-priority job (none of the waiting jobs outranks it, so none preempts
    it); three jobs wait behind it, submitted low, high, normal; one scheduling cycle has explained them."""
    runner = submit(world["bob"], world["vision"], name="runner", priority="high")
    result = run_cycle()
    runner.refresh_from_db()
    assert runner.pk in result.placed, (runner.state, runner.pending_message)
    low = submit(world["bob"], world["vision"], name="low-one", priority="low")
    high = submit(world["carol"], world["nlp"], name="high-one", priority="high")
    normal = submit(world["bob"], world["vision"], name="normal-one", priority="normal")
    assert not run_cycle().placed
    return {"runner": runner, "low": low, "high": high, "normal": normal}


def test_waiting_jobs_show_their_reason_word_and_code(client, world, queue):
    client.force_login(world["alice"])
    rows = cells(client.get("/console/jobs/").content.decode())
    low = Job.objects.get(pk=queue["low"].pk)
    assert low.pending_reason_code  # the cycle explained it
    reason = rows[low.pk]["reason"]
    assert f"<code>{low.pending_reason_code}</code>" in reason
    assert text(reason) != low.pending_reason_code  # a word beside the code
    assert text(rows[queue["runner"].pk]["reason"]) == "—"  # running: no reason


def test_position_follows_priority_then_the_engines_order(client, world, queue):
    client.force_login(world["alice"])
    rows = cells(client.get("/console/jobs/").content.decode())
    positions = {name: text(rows[queue[name].pk]["position"]) for name in ("high", "normal", "low")}
    assert positions == {"high": "1", "normal": "2", "low": "3"}
    assert text(rows[queue["runner"].pk]["position"]) == "—"
    # The per-tenant place is in the title: normal is first among vision's waiting jobs.
    assert "1 among its tenant" in rows[queue["normal"].pk]["position"]


def test_positions_close_gaps_and_place_jobs_no_cycle_has_seen(client, world, queue):
    job_cancel(job=queue["high"], actor=world["carol"])
    newcomer = submit(world["bob"], world["vision"], name="newcomer", priority="high")  # no cycle since
    client.force_login(world["alice"])
    rows = cells(client.get("/console/jobs/").content.decode())
    positions = {pk: text(rows[pk]["position"]) for pk in (newcomer.pk, queue["normal"].pk, queue["low"].pk)}
    assert positions == {newcomer.pk: "1", queue["normal"].pk: "2", queue["low"].pk: "3"}


def test_sorting_by_position_lists_the_queue_in_order(client, world, queue):
    client.force_login(world["alice"])
    html = client.get("/console/jobs/?sort=position").content.decode()
    order = [int(pk) for pk, _ in ROW.findall(html)]
    assert order[:3] == [queue["high"].pk, queue["normal"].pk, queue["low"].pk]
    html = client.get("/console/jobs/?sort=-position").content.decode()
    order = [int(pk) for pk, _ in ROW.findall(html)]
    assert order == [queue["runner"].pk, queue["low"].pk, queue["normal"].pk, queue["high"].pk]


def test_running_job_shows_its_node_and_elapsed_time(client, world, queue):
    started = timezone.now() - timedelta(hours=1, minutes=2, seconds=5)
    Job.objects.filter(pk=queue["runner"].pk).update(started_at=started, state=JobState.RUNNING)
    client.force_login(world["bob"])
    rows = cells(client.get("/console/jobs/").content.decode())
    runner = rows[queue["runner"].pk]
    assert text(runner["nodes"]) == "n1"
    assert re.fullmatch(r"1h 02m 0[5-9]s", text(runner["elapsed"])), runner["elapsed"]
    assert text(rows[queue["low"].pk]["nodes"]) == "—" and text(rows[queue["low"].pk]["elapsed"]) == "—"


def test_finished_job_shows_its_run_time_and_where_it_ran(client, world, queue):
    job_cancel(job=queue["runner"], actor=world["bob"])
    finished = timezone.now()
    Job.objects.filter(pk=queue["runner"].pk).update(started_at=finished - timedelta(minutes=10), finished_at=finished)
    client.force_login(world["bob"])
    runner = cells(client.get("/console/jobs/").content.decode())[queue["runner"].pk]
    assert text(runner["elapsed"]) == "10m 00s"
    assert text(runner["nodes"]) == "n1"


def test_the_list_takes_a_bounded_number_of_queries(client, world, queue):
    client.force_login(world["alice"])
    client.get("/console/jobs/")  # warm the session and caches
    with CaptureQueriesContext(connection) as few:
        client.get("/console/jobs/")
    for index in range(30):
        submit(world["bob"] if index % 2 else world["carol"], world["vision"] if index % 2 else world["nlp"])
    run_cycle()
    with CaptureQueriesContext(connection) as many:
        response = client.get("/console/jobs/")
    assert len(cells(response.content.decode())) == 34
    assert len(many) <= len(few), [q["sql"] for q in many.captured_queries]


def test_the_tenant_picker_offers_the_tenants_the_user_sees_by_path(client, world):
    client.force_login(world["bob"])
    html = client.get("/console/jobs/").content.decode()
    picker = re.search(r'<select name="tenant"[^>]*>(.*?)</select>', html, re.S).group(1)
    options = dict(re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', picker))
    assert set(options) == {"", "vision"}
    client.force_login(world["alice"])
    html = client.get("/console/jobs/").content.decode()
    picker = re.search(r'<select name="tenant"[^>]*>(.*?)</select>', html, re.S).group(1)
    options = dict(re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', picker))
    assert options["nlp"] == "Acme / Nlp (nlp)" and set(options) == {"", "acme", "nlp", "vision"}


def test_filtering_by_a_picked_tenant(client, world, queue):
    client.force_login(world["alice"])
    rows = cells(client.get("/console/jobs/?tenant=nlp").content.decode())
    assert set(rows) == {queue["high"].pk}


def test_bulk_cancel_cancels_own_jobs_and_hides_other_tenants(client, world, queue):
    client.force_login(world["bob"])
    response = client.post(
        "/console/jobs/cancel/",
        {"select": [queue["low"].pk, queue["normal"].pk, queue["high"].pk], "return_query": "state=waiting"},
        follow=True,
    )
    assert response.redirect_chain[-1][0] == "/console/jobs/?state=waiting"
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[queue["low"].pk] == states[queue["normal"].pk] == JobState.CANCELLED
    assert states[queue["high"].pk] == JobState.QUEUED  # carol's job in nlp: untouched
    page = response.content.decode()
    assert "Cancelled 2 jobs" in page
    assert "1 job could not be cancelled" in page
    # Another tenant's job reads exactly like one that does not exist.
    assert f"{queue['high'].pk} (no such job)" in page
    client.post("/console/jobs/cancel/", {"select": ["999999"]})
    messages = [str(m) for m in client.get("/console/jobs/").context["messages"]]
    assert messages == ["1 job could not be cancelled: 999999 (no such job)."]
    # Each cancellation is audited by the cancel service, as one cancel from the job page is.
    audited = AuditRecord.objects.filter(action="job.cancel", target=f"job:{queue['low'].pk}", actor_username="bob")
    assert audited.exists()


def test_bulk_cancel_skips_finished_jobs_and_others_jobs(client, world, queue):
    mine_done = submit(world["bob"], world["vision"], name="done")
    job_cancel(job=mine_done, actor=world["bob"])
    beas = submit(world["bea"], world["vision"], name="beas")
    client.force_login(world["bob"])
    client.post("/console/jobs/cancel/", {"select": [mine_done.pk, beas.pk, queue["low"].pk]})
    assert Job.objects.get(pk=beas.pk).state == JobState.QUEUED  # a member cancels only their own jobs
    assert Job.objects.get(pk=queue["low"].pk).state == JobState.CANCELLED
    messages = [str(m) for m in client.get("/console/jobs/").context["messages"]]
    assert messages[0] == f"Cancelled 1 job: {queue['low'].pk}."
    assert f"{mine_done.pk} (already cancelled)" in messages[1]
    assert f"{beas.pk} (you may not cancel it)" in messages[1]
    assert messages[1].startswith("2 jobs could not be cancelled")


def test_tenant_admin_cancels_jobs_of_the_subtree_in_bulk(client, world, queue):
    client.force_login(world["alice"])
    client.post("/console/jobs/cancel/", {"select": [queue["low"].pk, queue["high"].pk]})
    assert {Job.objects.get(pk=queue[n].pk).state for n in ("low", "high")} == {JobState.CANCELLED}


def test_a_viewer_sees_no_checkboxes_and_cannot_cancel(client, world, queue):
    client.force_login(world["vic"])
    page = client.get("/console/jobs/").content.decode()
    assert "data-job-select" not in page and "/console/jobs/cancel/" not in page
    client.post("/console/jobs/cancel/", {"select": [queue["low"].pk]})
    assert Job.objects.get(pk=queue["low"].pk).state == JobState.QUEUED


def test_an_auditor_cannot_cancel_in_bulk(client, world, queue):
    client.force_login(make_user(platform_role=PlatformRole.AUDITOR))
    page = client.get("/console/jobs/")
    assert page.status_code == 404 or "data-job-select" not in page.content.decode()
    response = client.post("/console/jobs/cancel/", {"select": [queue["low"].pk]}, follow=True)
    # Either the jobs section is closed to auditors (404) or it is read-only to them: nothing is cancelled.
    assert response.status_code == 404 or "1 job could not be cancelled" in response.content.decode()
    assert Job.objects.get(pk=queue["low"].pk).state == JobState.QUEUED


def test_bulk_cancel_needs_a_csrf_token(world, queue):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(world["bob"])
    response = client.post("/console/jobs/cancel/", {"select": [queue["low"].pk]})
    assert response.status_code == 403
    assert Job.objects.get(pk=queue["low"].pk).state == JobState.QUEUED


def test_bulk_cancel_speaks_chinese_with_plurals(client, world, queue):
    client.force_login(world["bob"])
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/"})
    client.post("/console/jobs/cancel/", {"select": [queue["low"].pk, queue["normal"].pk, "999999"]})
    messages = [str(m) for m in client.get("/console/jobs/").context["messages"]]
    assert messages[0].startswith("已取消 2 个作业")
    assert messages[1].startswith("1 个作业无法取消") and "999999（没有这个作业）" in messages[1]  # noqa: RUF001


def test_the_page_has_the_column_picker_and_saved_filters_wired_to_a_static_script(client, world, queue):
    client.force_login(world["bob"])
    html = client.get("/console/jobs/?state=waiting").content.decode()
    assert re.search(r'<script type="module" src="[^"]*frontend/jobqueue\.js"></script>', html)
    toggles = re.findall(r'data-col-toggle="(\w+)"', html)
    assert {"reason", "position", "nodes", "elapsed", "priority_class", "estimated_start_at"} <= set(toggles)
    assert 'name="return_query" value="state=waiting"' in html


def test_csv_export_carries_the_queue_columns(client, world, queue):
    client.force_login(world["alice"])
    lines = client.get("/console/jobs/?export=csv&sort=position").content.decode().strip().splitlines()
    header = lines[0].split(",")
    assert {"Reason", "Position", "Nodes", "Elapsed"} <= set(header) and "" not in header
    first = dict(zip(header, lines[1].split(","), strict=False))
    assert first["Name"] == "high-one" and first["Position"] == "1"


def test_state_badges_keep_their_class_in_chinese(client, world, queue):
    """The badge's class is the stored state (CSS colours by it), not the translated label."""
    client.force_login(world["bob"])
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/"})
    rows = cells(client.get("/console/jobs/").content.decode())
    assert '<span class="badge queued">排队中</span>' in rows[queue["low"].pk]["state"]


def test_bulk_cancel_reads_odd_ids_as_missing(client, world, queue):
    client.force_login(world["bob"])
    odd = ["abc", "²", "9" * 30]
    client.post("/console/jobs/cancel/", {"select": [*odd, queue["low"].pk]})
    assert Job.objects.get(pk=queue["low"].pk).state == JobState.CANCELLED
    messages = [str(m) for m in client.get("/console/jobs/").context["messages"]]
    assert messages[1].startswith("3 jobs could not be cancelled") and "abc (no such job)" in messages[1]


def test_filtering_by_reason_code(client, world, queue):
    code = Job.objects.get(pk=queue["low"].pk).pending_reason_code
    client.force_login(world["alice"])
    html = client.get(f"/console/jobs/?reason={code}").content.decode()
    rows = cells(html)
    assert queue["low"].pk in rows and queue["runner"].pk not in rows
    assert all(f"<code>{code}</code>" in row["reason"] for row in rows.values())
    assert set(cells(client.get("/console/jobs/?reason=awaiting_approval").content.decode())) == set()
