"""The console's job page of an array task counts the whole array, the tasks that are not jobs yet included."""

from __future__ import annotations

import re

import pytest

from scheduler.services.arrays import job_array_submit
from scheduler.services.cycle import run_cycle
from tests.frontend.factories import make_flavor, make_member, make_node, make_tenant
from tests.patching import patch_request_cycle

pytestmark = pytest.mark.django_db


def test_a_task_page_shows_its_array_counted_by_state(client, settings, monkeypatch):
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    settings.GPUPOOL_ARRAY_WINDOW = 4
    patch_request_cycle(monkeypatch, lambda: None)
    flavor = make_flavor()
    make_node("n1", devices=2, flavor=flavor)
    owner = make_member(make_tenant("vision"), username="bob")
    spec = {
        "name": "sweep",
        "tenant": "vision",
        "resources": {"flavors": [flavor.name], "gpus": 1},
        "command": ["python", "sweep.py"],
        "array": {"count": 100},
    }
    array = job_array_submit(actor=owner, spec=spec)
    run_cycle()  # 2 cards: tasks 0 and 1 placed, 2-3 queued jobs, 4-99 not jobs yet
    client.force_login(owner)

    page = client.get(f"/console/jobs/{array.first_job_id}/").content.decode()
    row = re.search(r'data-testid="job-array">(.*?)</dd>', page, re.S)
    assert row, "the array row is missing"
    text = " ".join(row.group(1).split())
    assert "task 0 of 100" in text and "2 admitted, 98 queued" in text
    assert "tasks 4-99 are queued, not jobs yet" in text
