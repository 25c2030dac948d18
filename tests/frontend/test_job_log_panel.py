"""The job page's output panel: shown to those who may see the job, wired to the logs API and the follow socket,
a replica choice for gangs, a download link, in Chinese too; the old log tail only for agents before live logs."""

from __future__ import annotations

import re

import pytest

from scheduler import logs
from scheduler.models import JobEvent
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant
from tests.patching import patch_request_cycle

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(settings, monkeypatch):
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: None)
    flavor = make_flavor()
    node = make_node("n1", devices=2, flavor=flavor)
    tenant = make_tenant("vision")
    owner = make_member(tenant, username="bob")

    def place(replicas: int = 1):
        spec = {
            "name": "train",
            "tenant": "vision",
            "replicas": replicas,
            "resources": {"flavors": [flavor.name], "gpus": 1},
            "command": ["python", "train.py"],
        }
        job = job_submit(actor=owner, spec=spec)
        assert job.pk in run_cycle().placed
        return job

    return {"node": node, "owner": owner, "place": place}


def panel(page: str) -> str:
    match = re.search(r"<section[^>]*data-job-log.*?</section>", page, re.S)
    assert match, "the output panel is missing"
    return match.group(0)


def test_the_job_page_has_an_output_panel_wired_to_the_logs_api(client, running):
    job = running["place"]()
    client.force_login(running["owner"])

    section = panel(client.get(f"/console/jobs/{job.pk}/").content.decode())

    assert f'data-api="/api/v1/jobs/{job.pk}/logs/"' in section
    assert f'data-ws="/ws/jobs/{job.pk}/logs/"' in section and 'data-live="1"' in section
    assert "data-log-toggle" in section and ">Pause<" in section
    assert f'href="/api/v1/jobs/{job.pk}/logs/?replica=0&amp;format=text&amp;download=1"' in section
    assert "data-log-replica" not in section  # one replica: nothing to choose
    # The download link the panel offers answers the job's output as a file.
    logs.job_log_append(node_id=running["node"].pk, job_id=job.pk, replica=0, offset=0, text="epoch 1\n")
    download = client.get(f"/api/v1/jobs/{job.pk}/logs/?replica=0&format=text&download=1")
    assert download.status_code == 200 and download.content == b"epoch 1\n"
    assert download["Content-Disposition"].startswith("attachment;")


def test_a_gang_gets_a_replica_choice(client, running):
    job = running["place"](replicas=2)
    client.force_login(running["owner"])

    section = panel(client.get(f"/console/jobs/{job.pk}/").content.decode())

    assert "data-log-replica" in section
    assert re.findall(r'<option value="(\d+)">', section) == ["0", "1"]


def test_the_panel_speaks_chinese(client, running):
    job = running["place"]()
    client.force_login(running["owner"])
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/overview/"})

    section = panel(client.get(f"/console/jobs/{job.pk}/").content.decode())

    assert "输出" in section and "暂停" in section and "下载" in section and 'data-label-follow="跟随"' in section


def test_the_old_log_tail_shows_only_for_jobs_without_streamed_output(client, running):
    job = running["place"]()
    JobEvent.objects.create(job=job, from_state=job.state, to_state=job.state, details={"log_tail": "old agent tail"})
    client.force_login(running["owner"])
    assert 'data-testid="log-tail"' in client.get(f"/console/jobs/{job.pk}/").content.decode()

    logs.job_log_append(node_id=running["node"].pk, job_id=job.pk, replica=0, offset=0, text="streamed\n")

    assert 'data-testid="log-tail"' not in client.get(f"/console/jobs/{job.pk}/").content.decode()


def test_someone_who_may_not_see_the_job_gets_neither_page_nor_log(client, running):
    job = running["place"]()
    client.force_login(make_member(make_tenant("nlp"), username="carol"))

    assert client.get(f"/console/jobs/{job.pk}/").status_code == 404
    assert client.get(f"/api/v1/jobs/{job.pk}/logs/").status_code == 404
