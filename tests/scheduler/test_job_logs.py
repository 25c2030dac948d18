"""Live logs on the portal: pieces stored once however often they are sent, read back by offset through
``GET /api/v1/jobs/{id}/logs/`` (JSON and text) while the job runs, for those who may see the job only, capped,
continued by a requeued job's next run, followed over ``/ws/jobs/{id}/logs/``, deleted after the retention —
and a real agent running a real command whose output the API shows while it still runs."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from catalog.models import ResourceFlavor
from nodeagent import protocol
from scheduler import logs
from scheduler.fleet.models import AgentCommand
from scheduler.fleet.services.workload_reports import node_jobs_requeue, workload_status_report
from scheduler.models import Job, JobLogChunk, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from scheduler.tasks import job_logs_purge
from tests.fleet.conftest import connect_agent, register_node, settle
from tests.fleet.test_agent_reports import Link, drive, job_state, real_agent, stop_agent, submit_and_place
from tests.patching import patch_imported, patch_request_cycle
from tests.scheduler.factories import MembershipFactory, TenantFactory, UserFactory, node_with_devices

db = database_sync_to_async


def place(member, flavor, *, replicas: int = 1) -> Job:
    spec = {
        "name": "train",
        "tenant": "team-a",
        "replicas": replicas,
        "resources": {"flavors": [flavor.name], "gpus": 1},
        "command": ["python", "train.py"],
    }
    job = job_submit(actor=member, spec=spec)
    assert job.pk in run_cycle().placed
    return Job.objects.get(pk=job.pk)


def append(node, job, text: str, *, offset: int, replica: int = 0) -> logs.LogAppendOutcome:
    return logs.job_log_append(node_id=node.pk, job_id=job.pk, replica=replica, offset=offset, text=text)


def read(user, job, **query) -> tuple[int, dict]:
    client = APIClient()
    client.force_authenticate(user)
    response = client.get(f"/api/v1/jobs/{job.pk}/logs/", query)
    return response.status_code, response.json()


def read_all(user, job, *, limit_bytes: int, replica: int = 0) -> tuple[str, list[dict]]:
    offset, texts, answers = 0, [], []
    while True:
        status, answer = read(user, job, offset=offset, limit_bytes=limit_bytes, replica=replica)
        assert status == 200, answer
        answers.append(answer)
        texts.append(answer["text"])
        if answer["next_offset"] == offset:
            return "".join(texts), answers
        offset = answer["next_offset"]


@pytest.fixture
def running(member, flavor, node, no_cycle_requests) -> Job:
    return place(member, flavor)


# --- storing ---------------------------------------------------------------------------------------------------


def test_a_piece_sent_again_is_stored_once(running, node, member) -> None:
    first = append(node, running, "epoch 1 loss 0.9\n", offset=0)
    again = append(node, running, "epoch 1 loss 0.9\n", offset=0)

    assert (first.stored_bytes, first.next_offset) == (17, 17)
    assert (again.ok, again.stored_bytes, again.next_offset) == (True, 0, 17)
    assert read(member, running)[1]["text"] == "epoch 1 loss 0.9\n"


def test_a_resend_that_overlaps_what_is_stored_adds_only_the_new_bytes(running, node, member) -> None:
    append(node, running, "0123456789", offset=0)
    append(node, running, "56789abcde", offset=5)  # the agent resent from an older acknowledged offset

    assert read(member, running)[1]["text"] == "0123456789abcde"


def test_lines_printed_one_by_one_are_kept_in_few_rows(running, node, member) -> None:
    offset = 0
    for number in range(300):
        line = f"step {number}\n"
        offset = append(node, running, line, offset=offset).next_offset

    assert JobLogChunk.objects.filter(job=running).count() == 1
    assert read(member, running)[1]["text"] == "".join(f"step {n}\n" for n in range(300))


def test_a_node_that_never_held_the_replica_cannot_write_its_log(running, flavor) -> None:
    stranger = node_with_devices(1, name="node-b")

    outcome = append(stranger, running, "forged output\n", offset=0)

    assert (outcome.ok, outcome.code) == (False, "not_held")
    assert not JobLogChunk.objects.filter(job=running).exists()


def test_past_the_size_cap_the_newest_output_is_kept(running, node, member, settings) -> None:
    settings.GPUPOOL_JOB_LOG_MAX_BYTES = 3000
    lines = [f"{n:05d} " + "x" * 94 + "\n" for n in range(100)]  # 100 lines of 101 bytes, merged into one row
    offset = 0
    for line in lines:
        offset = append(node, running, line, offset=offset).next_offset

    status, answer = read(member, running, offset=0)

    assert status == 200
    assert answer["truncated_before"] == offset - 3000
    assert answer["text"] == "".join(lines)[-3000:]  # from the first kept byte: the newest 3,000 bytes
    assert answer["next_offset"] == offset


def test_past_the_size_cap_rows_of_the_oldest_output_are_deleted(running, node, member, settings) -> None:
    settings.GPUPOOL_JOB_LOG_MAX_BYTES = 100 * 1024
    pieces = [chr(ord("a") + n) * (60 * 1024) for n in range(5)]  # 300 KiB in rows of 60 KiB
    offset = 0
    for piece in pieces:
        offset = append(node, running, piece, offset=offset).next_offset

    status, answer = read(member, running, offset=0, limit_bytes=1024 * 1024)

    assert status == 200
    assert answer["truncated_before"] == 200 * 1024
    assert answer["text"] == "".join(pieces)[-100 * 1024 :]
    assert JobLogChunk.objects.filter(job=running).count() == 2


# --- reading ---------------------------------------------------------------------------------------------------


def test_the_api_reads_on_from_next_offset_until_nothing_is_new(running, node, member) -> None:
    output = "".join(f"epoch {n} loss {1 / (n + 1):.3f}\n" for n in range(50))
    append(node, running, output, offset=0)

    text, answers = read_all(member, running, limit_bytes=100)

    assert text == output
    assert len(answers) > 5
    assert all(len(a["text"].encode()) <= 100 and not a["complete"] for a in answers)
    assert answers[-1]["next_offset"] == len(output.encode())


def test_a_character_is_never_cut_in_two_by_the_limit(running, node, member) -> None:
    output = "训练第一轮完成。损失 0.42\n" * 20
    append(node, running, output, offset=0)

    text, _answers = read_all(member, running, limit_bytes=17)

    assert text == output


def test_complete_says_the_job_ended_and_nothing_more_will_come(running, node, member) -> None:
    append(node, running, "done\n", offset=0)
    assert read(member, running)[1]["complete"] is False

    workload_status_report(
        node=node, job_id=running.pk, replica=0, state="succeeded", exit_code=0, last_checkpoint_at=None
    )

    assert read(member, running, offset=0)[1] == {
        "job": running.pk,
        "replica": 0,
        "offset": 0,
        "next_offset": 5,
        "text": "done\n",
        "complete": True,
        "truncated_before": 0,
    }


def test_format_text_downloads_the_log_as_a_file(running, node, member) -> None:
    append(node, running, "línea 1\nline 2\n", offset=0)
    client = APIClient()
    client.force_authenticate(member)

    response = client.get(f"/api/v1/jobs/{running.pk}/logs/", {"format": "text", "download": "1"})

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert response["Content-Disposition"] == f'attachment; filename="job-{running.pk}-replica-0.log"'
    assert response.content.decode() == "línea 1\nline 2\n"
    assert response["X-Log-Next-Offset"] == str(len("línea 1\nline 2\n".encode()))


def test_each_replica_has_its_own_log(member, flavor, node, no_cycle_requests) -> None:
    job = place(member, flavor, replicas=2)
    append(node, job, "rank 0\n", offset=0, replica=0)
    append(node, job, "rank 1\n", offset=0, replica=1)

    assert read(member, job, replica=1)[1]["text"] == "rank 1\n"
    assert read(member, job, replica=0)[1]["text"] == "rank 0\n"


# --- who may read, and bad requests ---------------------------------------------------------------------------


def test_a_member_of_another_tenant_gets_404(running, node) -> None:
    append(node, running, "secret weights path\n", offset=0)
    outsider = UserFactory(username="outsider")
    MembershipFactory(user=outsider, tenant=TenantFactory(slug="team-b"), role="member")

    status, answer = read(outsider, running)

    assert status == 404 and answer["code"] == "not_found"
    assert "secret" not in json.dumps(answer)


def test_a_tenant_admin_above_the_job_reads_it_and_a_stranger_without_a_session_cannot(running, node, tenant) -> None:
    append(node, running, "hello\n", offset=0)
    parent_admin = UserFactory(username="parent-admin")
    parent = TenantFactory(slug="org")
    tenant.parent = parent
    tenant.save(update_fields=["parent"])
    MembershipFactory(user=parent_admin, tenant=parent, role="tenant_admin")

    status, answer = read(parent_admin, running)
    assert (status, answer["text"]) == (200, "hello\n")
    assert APIClient().get(f"/api/v1/jobs/{running.pk}/logs/").status_code == 401


@pytest.mark.parametrize(
    "query",
    [{"replica": 1}, {"replica": -1}, {"offset": -5}, {"offset": "abc"}, {"limit_bytes": 0}],
    ids=["replica-past-the-gang", "negative-replica", "negative-offset", "offset-not-a-number", "zero-limit"],
)
def test_a_bad_replica_or_offset_is_a_400_saying_what_to_ask(running, member, query) -> None:
    status, answer = read(member, running, **query)

    assert status == 400
    assert answer["code"] == "invalid" and answer["detail"]


# --- a requeued job, and retention -----------------------------------------------------------------------------


def test_a_requeued_job_continues_its_log_where_the_last_run_ended(running, node, flavor) -> None:
    append(node, running, "run 1: epoch 1\n", offset=0)
    node_jobs_requeue(node=node)
    node.status = "cordoned"
    node.save(update_fields=["status"])
    other = node_with_devices(1, name="node-b")

    assert running.pk in run_cycle().placed
    start = AgentCommand.objects.filter(job=running, node=other, command_type="workload.start").get()

    assert start.payload["log_offset"] == len("run 1: epoch 1\n")
    # The old node's late output is refused: the replica runs elsewhere now.
    late = append(node, running, "run 1: epoch 2\n", offset=15)
    assert (late.ok, late.code) == (False, "not_allocated")


def test_retention_deletes_the_logs_of_jobs_finished_long_ago(member, flavor, node, no_cycle_requests, settings):
    settings.GPUPOOL_JOB_LOG_RETENTION_DAYS = 30
    old = place(member, flavor)
    recent = place(member, flavor)
    node_with_devices(2, name="node-c")
    live = place(member, flavor)
    for job in (old, recent, live):
        holder = job.allocations.first().node
        append(holder, job, f"output of {job.pk}\n", offset=0)
    now = timezone.now()
    Job.objects.filter(pk=old.pk).update(state=JobState.SUCCEEDED, finished_at=now - timedelta(days=31))
    Job.objects.filter(pk=recent.pk).update(state=JobState.FAILED, finished_at=now - timedelta(days=29))

    deleted = job_logs_purge()

    assert deleted == 1
    assert set(JobLogChunk.objects.values_list("job_id", flat=True)) == {recent.pk, live.pk}
    assert read(member, Job.objects.get(pk=old.pk))[1]["text"] == ""


# --- follow over the WebSocket, fed by the agent socket ---------------------------------------------------------


async def log_socket(user, job_id: int, query: str = "") -> WebsocketCommunicator:
    from portal.asgi import application

    def session_cookie() -> str:
        client = Client()
        client.force_login(user)
        return client.cookies["sessionid"].value

    cookie = await sync_to_async(session_cookie)()
    headers = [(b"host", b"testserver"), (b"origin", b"http://testserver"), (b"cookie", f"sessionid={cookie}".encode())]
    return WebsocketCommunicator(application, f"/ws/jobs/{job_id}/logs/{query}", headers=headers)


@pytest.mark.django_db(transaction=True)
async def test_a_follower_gets_output_as_the_agent_sends_it_and_the_end(monkeypatch) -> None:
    patch_request_cycle(monkeypatch, lambda: None)
    patch_imported(monkeypatch, "scheduler.fleet.services.notify.cycle_request_after_commit", lambda: None)
    await db(ResourceFlavor.objects.create)(
        name="nvidia-h100-80g", vendor="nvidia", model="NVIDIA H100 80GB HBM3", memory_mib=81559
    )
    _node, credential = await db(register_node)("gpu-logs")
    agent = await connect_agent(credential, "gpu-logs", devices=1)
    owner = await db(UserFactory)(username="log-owner")
    await db(MembershipFactory)(user=owner, tenant=await db(TenantFactory)(slug="team-logs"), role="member")
    spec = {
        "name": "f",
        "tenant": "team-logs",
        "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
        "command": ["x"],
    }
    job = await db(job_submit)(actor=owner, spec=spec)
    assert (await db(run_cycle)()).placed == [job.pk]

    async def agent_sends(offset: int, text: str) -> dict:
        await agent.send_to(
            text_data=protocol.encode(protocol.WorkloadLog(job_id=job.pk, replica=0, offset=offset, text=text))
        )
        while True:
            frame = json.loads(await agent.receive_from(timeout=10))
            if frame["type"] == "workload.log.ack":
                return frame

    ack = await agent_sends(0, "loading data\n")
    assert (ack["ok"], ack["next_offset"]) == (True, 13)

    follower = await log_socket(owner, job.pk, "?replica=0&offset=0")
    connected, _ = await follower.connect()
    assert connected
    caught_up = await follower.receive_json_from(timeout=10)
    assert (caught_up["type"], caught_up["text"], caught_up["next_offset"]) == ("log", "loading data\n", 13)

    await agent_sends(13, "epoch 1\n")
    pushed = await follower.receive_json_from(timeout=10)
    assert (pushed["offset"], pushed["text"], pushed["complete"]) == (13, "epoch 1\n", False)

    done = protocol.WorkloadStatus(job_id=job.pk, replica=0, state="succeeded", exit_code=0, report_id=1)
    await agent.send_to(text_data=protocol.encode(done))
    await settle(agent)
    final = await follower.receive_json_from(timeout=15)  # seen at the next look, without new output
    assert (final["text"], final["complete"]) == ("", True)
    closed = await follower.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 1000}
    await agent.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_follower_who_may_not_see_the_job_is_refused(monkeypatch) -> None:
    patch_request_cycle(monkeypatch, lambda: None)
    tenant = await db(TenantFactory)(slug="hidden")
    outsider = await db(UserFactory)(username="outsider-ws")
    await db(MembershipFactory)(user=outsider, tenant=await db(TenantFactory)(slug="elsewhere"), role="member")
    from tests.scheduler.factories import JobFactory

    job = await db(JobFactory)(tenant=tenant)

    follower = await log_socket(outsider, job.pk)
    connected, _ = await follower.connect()
    assert connected
    refusal = await follower.receive_json_from(timeout=10)
    assert (refusal["type"], refusal["code"]) == ("error", "not_found")
    assert await follower.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}


# --- a real agent, a real command: the API shows its output while it runs ----------------------------------


@pytest.mark.django_db(transaction=True)
async def test_the_api_shows_a_running_jobs_output_from_a_real_agent(tmp_path: Path, settings, monkeypatch) -> None:
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: False)
    patch_imported(monkeypatch, "scheduler.fleet.services.notify.cycle_request_after_commit", lambda: None)
    _node, credential = await db(register_node)("gpu-live")
    link = Link(credential)
    agent = real_agent(tmp_path, "gpu-live", link)
    from scheduler.fleet.models import Device

    await drive(agent, lambda: Device.objects.filter(node__name="gpu-live").exists(), what="the hello")
    go = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        "for step in range(3):\n"
        "    print(f'step {step}', flush=True)\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.05)\n"
        "print('done')\n"
    )
    job_id = await db(submit_and_place)("gpu-live", command=[sys.executable, "-c", script, str(go)])
    reader = await db(lambda: Job.objects.get(pk=job_id).submitter)()

    def output() -> dict:
        return read(reader, Job.objects.get(pk=job_id))[1]

    await drive(agent, lambda: output()["text"] == "step 0\nstep 1\nstep 2\n", what="the first lines")
    assert await db(job_state)(job_id) == JobState.RUNNING
    assert (await db(output)())["complete"] is False

    go.touch()
    await drive(agent, lambda: job_state(job_id) == JobState.SUCCEEDED, what="the job to end")
    await stop_agent(agent, link)

    final = await db(output)()
    assert (final["text"], final["complete"]) == ("step 0\nstep 1\nstep 2\ndone\n", True)


def test_a_refused_text_request_still_answers_the_json_error(running, member) -> None:
    client = APIClient()
    client.force_authenticate(member)

    response = client.get(f"/api/v1/jobs/{running.pk}/logs/", {"format": "text", "replica": 7})

    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert response.json()["code"] == "invalid"


def test_pieces_of_many_jobs_are_stored_together_in_a_few_statements(member, flavor, no_cycle_requests) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    nodes = [node_with_devices(2, name=f"node-{n}") for n in range(5)]
    jobs = [place(member, flavor) for _ in range(10)]
    holder = {job.pk: job.allocations.first().node_id for job in jobs}

    def batch(count: int, offset: int) -> list[logs.LogPiece]:
        return [
            logs.LogPiece(node_id=holder[job.pk], job_id=job.pk, replica=0, offset=offset, text=f"line of {job.pk}\n")
            for job in jobs[:count]
        ]

    with CaptureQueriesContext(connection) as two:
        logs.job_logs_append(pieces=batch(2, 0))
    with CaptureQueriesContext(connection) as ten:
        outcomes = logs.job_logs_append(pieces=batch(10, 0))

    assert len(ten.captured_queries) == len(two.captured_queries)
    assert [o.stored_bytes > 0 for o in outcomes] == [False, False] + [True] * 8  # the first two were stored before
    assert len(nodes) == 5 and all(read(member, job)[1]["text"] == f"line of {job.pk}\n" for job in jobs)


def test_a_batch_refuses_its_bad_pieces_and_stores_the_rest(running, node, flavor) -> None:
    stranger = node_with_devices(1, name="node-b")
    pieces = [
        logs.LogPiece(node_id=node.pk, job_id=running.pk, replica=0, offset=0, text="kept\n"),
        logs.LogPiece(node_id=stranger.pk, job_id=running.pk, replica=0, offset=5, text="forged\n"),
        logs.LogPiece(node_id=node.pk, job_id=running.pk, replica=0, offset=-1, text="bad offset\n"),
        logs.LogPiece(node_id=node.pk, job_id=999_999, replica=0, offset=0, text="no such job\n"),
        logs.LogPiece(node_id=node.pk, job_id=running.pk, replica=0, offset=5, text="also kept\n"),
    ]

    outcomes = logs.job_logs_append(pieces=pieces)

    assert [(o.ok, o.code) for o in outcomes] == [
        (True, ""),
        (False, "not_held"),
        (False, "invalid_log"),
        (False, "unknown_job"),
        (True, ""),
    ]
    assert logs.job_log_slice(job=running, replica=0, offset=0).text == "kept\nalso kept\n"
