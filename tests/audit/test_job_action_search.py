"""An auditor finds a job's cancellation by searching the trail for "cancel", and its preemption for "preempt",
through the API and on the console's audit page (issue 33, item 6: both were recorded as ``job.transition``,
whose state sits in the sealed details that no search reads)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from scheduler.core import types as core
from scheduler.fleet.models import Node
from scheduler.fleet.services.nodes import node_drain
from scheduler.models import JobState
from scheduler.persist import persist_plan
from tests.factories import AuditorFactory, MembershipFactory, SystemAdminFactory, TenantFactory, UserFactory
from tests.factories import client_for as api_client_for
from tests.patching import patch_request_cycle
from tests.scheduler.factories import FlavorFactory, node_with_devices

pytestmark = pytest.mark.django_db
RECORDS = "/api/v1/audit/records/"
SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["x"]}


@pytest.fixture
def pool(settings, monkeypatch) -> dict:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: None)
    FlavorFactory()
    tenant = TenantFactory(slug="team-a")
    member = UserFactory(username="mia")
    MembershipFactory(user=member, tenant=tenant, role="member")
    return {"member": member, "node": node_with_devices(2, name="node-a"), "auditor": AuditorFactory()}


def _submit(member) -> int:
    response = api_client_for(member).post("/api/v1/jobs/", SPEC, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _place(job_id: int, node: Node) -> None:
    device = node.devices.get(index=0)
    assignment = core.Assignment(0, node.name, device.uuid, 1000, 0)
    place = core.Place(job_id=str(job_id), tenant="team-a", flavor="sim-80g", assignments=(assignment,))
    assert persist_plan(core.Plan(places=(place,))).placed == [job_id]


def _api_found(auditor, **query: str) -> list[dict]:
    response = api_client_for(auditor).get(RECORDS, {"limit": 500, **query})
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def _console_found(auditor, text: str) -> list[tuple[str, str]]:
    """(action, target) of each row the console's audit page lists for the search ``text``."""
    client = Client()
    client.force_login(auditor)
    response = client.get("/console/audit/", {"q": text})
    assert response.status_code == 200
    return [(record.action, record.target) for record in response.context["table"].data]


def test_a_job_cancelled_through_the_api_is_found_by_searching_cancel(pool):
    job_id = _submit(pool["member"])
    cancelled = api_client_for(pool["member"]).post(f"/api/v1/jobs/{job_id}/cancel/", {"reason": "wrong data"})
    assert cancelled.status_code == 200 and cancelled.json()["state"] == JobState.CANCELLED
    target = f"job:{job_id}"

    for text in ("cancel", "Cancelled"):
        found = [row for row in _api_found(pool["auditor"], q=text) if row["target"] == target]
        assert [row["action"] for row in found] == ["job.cancel"], text
        assert found[0]["actor_username"] == "mia"
        assert found[0]["details"]["after"] == {"state": JobState.CANCELLED}
        assert [row for row in _console_found(pool["auditor"], text) if row[1] == target] == [("job.cancel", target)]
    # The job's other records are still found by the job, and a search for another word does not find this one.
    actions = {row["action"] for row in _api_found(pool["auditor"], q=target)}
    assert actions == {"job.submit", "job.cancel"}
    assert not [row for row in _api_found(pool["auditor"], q="preempt") if row["target"] == target]
    assert [row["action"] for row in _api_found(pool["auditor"], action="job.cancel")] == ["job.cancel"]


def test_a_running_job_cancelled_on_its_console_page_is_found_by_searching_cancel(pool):
    job_id = _submit(pool["member"])
    _place(job_id, pool["node"])
    console = Client()
    console.force_login(pool["member"])
    assert console.post(f"/console/jobs/{job_id}/cancel/", {"reason": "done"}).status_code == 302
    page = Client()
    page.force_login(pool["auditor"])
    html = page.get("/console/audit/", {"q": "cancel"}).content.decode()
    rows = re.findall(r"<tr[^>]*>.*?</tr>", html, re.S)
    assert [row for row in rows if f"job:{job_id}" in row and "job.cancel" in row], html


def test_a_preempted_job_is_found_by_searching_preempt(pool):
    job_id = _submit(pool["member"])
    _place(job_id, pool["node"])
    preempt = core.Preempt(job_id=str(job_id), victim_of="0", reason=core.PreemptReason.PRIORITY, grace_s=5)
    assert persist_plan(core.Plan(preemptions=(preempt,))).preempted == [job_id]
    target = f"job:{job_id}"

    for text in ("preempt", "preempted"):
        found = [row for row in _api_found(pool["auditor"], q=text) if row["target"] == target]
        assert [row["action"] for row in found] == ["job.preempt"], text
        assert found[0]["details"]["after"] == {"state": JobState.PREEMPTING}
        assert [row for row in _console_found(pool["auditor"], text) if row[1] == target] == [("job.preempt", target)]
    assert not [row for row in _api_found(pool["auditor"], q="cancel") if row["target"] == target]


def test_a_job_stopped_by_a_node_drain_is_found_by_searching_preempt(pool):
    job_id = _submit(pool["member"])
    _place(job_id, pool["node"])
    node_drain(node=pool["node"], actor=SystemAdminFactory())
    found = [row for row in _api_found(pool["auditor"], q="preempt") if row["target"] == f"job:{job_id}"]
    # A system admin's action is copied into the platform stream too: one event, two records.
    assert len({row["event_id"] for row in found}) == 1 and found
    assert {(row["action"], row["details"]["reason"]) for row in found} == {("job.preempt", "node_drain")}


def test_other_state_changes_stay_job_transition(pool):
    job_id = _submit(pool["member"])
    _place(job_id, pool["node"])
    records = _api_found(pool["auditor"], q=f"job:{job_id}")
    transitions = [row for row in records if row["action"] == "job.transition"]
    states = sorted(row["details"]["after"]["state"] for row in transitions)
    assert states == [JobState.ADMITTED]
