"""A job's command is shown as a shell would take it back (quotes kept), and the submit form offers an example
command that a job can run as it is (tests/test_end_to_end.py runs it on a real agent)."""

from __future__ import annotations

import html
import shlex

import pytest

from scheduler.jobspec import EXAMPLE_COMMAND
from scheduler.models import Job
from scheduler.services.jobs import job_submit
from tests.frontend.factories import make_flavor, make_member, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def bob():
    make_flavor("nvidia-h100-80g")
    return make_member(make_tenant("vision"), username="bob")


def test_the_job_page_shows_the_command_with_its_quotes(client, bob):
    argv = ["python3", "-c", "print('hello world')", "--out", "/tmp/a b"]
    job = job_submit(
        actor=bob,
        spec={
            "name": "quoted",
            "tenant": "vision",
            "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
            "command": argv,
        },
    )
    client.force_login(bob)
    page = client.get(f"/console/jobs/{job.pk}/").content.decode()
    shown = html.unescape(page.split('data-testid="job-command">', 1)[1].split("</code>", 1)[0])
    assert shown == "python3 -c 'print('\"'\"'hello world'\"'\"')' --out '/tmp/a b'"
    assert shlex.split(shown) == argv  # pasting it into a shell runs the same command


def test_the_submit_form_offers_the_example_and_submits_it_unchanged(client, bob):
    client.force_login(bob)
    page = html.unescape(client.get("/console/jobs/submit/").content.decode())
    assert EXAMPLE_COMMAND in page
    assert "train.py" not in page  # no example that needs a file the job's empty directory lacks
    response = client.post(
        "/console/jobs/submit/",
        {
            "submit_form": "1",
            "f-tenant": "vision",
            "f-name": "example",
            "f-kind": "training",
            "f-priority_class": "normal",
            "f-replicas": "1",
            "f-flavor": "nvidia-h100-80g",
            "f-size": "whole",
            "f-gpus": "1",
            "f-command": EXAMPLE_COMMAND,
        },
    )
    assert response.status_code == 302
    job = Job.objects.get(name="example")
    assert job.command == shlex.split(EXAMPLE_COMMAND)
    page = html.unescape(client.get(f"/console/jobs/{job.pk}/").content.decode())
    assert f'data-testid="job-command">{EXAMPLE_COMMAND}</code>' in page
