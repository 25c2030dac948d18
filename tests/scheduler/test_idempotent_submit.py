"""``Idempotency-Key`` on ``POST /api/v1/jobs/``: a retried submit never creates a second job."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from rest_framework.test import APIClient

from audit.models import AuditRecord
from scheduler import idempotency
from scheduler.models import Job, JobArray
from tests.factories import ApiTokenFactory
from tests.scheduler.factories import MembershipFactory, UserFactory

SPEC = {"name": "train", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["python"]}


@pytest.fixture
def api(member, node, no_cycle_requests) -> APIClient:
    client = APIClient()
    client.force_authenticate(member)
    return client


def submit(client: APIClient, spec: dict, key: str | None):
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post("/api/v1/jobs/", spec, format="json", headers=headers)


def test_a_retried_submit_answers_the_first_job_and_creates_no_second(api):
    first = submit(api, SPEC, "retry-1")
    again = submit(api, SPEC, "retry-1")
    assert first.status_code == 201, first.json()
    assert again.status_code == 200, again.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["events"] == first.json()["events"]
    assert Job.objects.count() == 1
    assert AuditRecord.objects.filter(action="job.submit").count() == 1


def test_a_replay_without_the_tenant_still_matches_when_it_is_the_same_tenant(api):
    first = submit(api, SPEC, "k").json()
    spec_without_tenant = {key: value for key, value in SPEC.items() if key != "tenant"}
    again = submit(api, spec_without_tenant, "k")
    assert again.status_code == 200 and again.json()["id"] == first["id"]


def test_the_same_key_with_another_spec_is_refused_and_creates_nothing(api):
    first = submit(api, SPEC, "k").json()
    other = submit(api, {**SPEC, "command": ["python", "other.py"]}, "k")
    assert other.status_code == 422
    body = other.json()
    assert body["code"] == "idempotency_key_reused"
    assert f"job {first['id']}" in body["detail"] and "new key" in body["detail"]
    assert Job.objects.count() == 1


def test_submits_without_a_key_are_never_merged(api):
    ids = {submit(api, SPEC, None).json()["id"] for _ in range(2)}
    assert len(ids) == 2


def test_keys_are_per_submitter(api, tenant):
    other_user = UserFactory(username="member-b")
    MembershipFactory(user=other_user, tenant=tenant, role="member")
    other = APIClient()
    other.force_authenticate(other_user)
    mine = submit(api, SPEC, "shared-key")
    theirs = submit(other, SPEC, "shared-key")
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"]


@pytest.mark.parametrize("bad_key", ["", "has space", "x" * 129, "ключ"])
def test_a_malformed_key_is_refused_before_anything_is_created(api, bad_key):
    response = api.post(
        "/api/v1/jobs/", SPEC, format="json", headers={"Idempotency-Key": bad_key.encode().decode("latin1")}
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_idempotency_key"
    assert Job.objects.count() == 0


def test_an_array_keeps_the_key_on_job_0_and_a_retry_answers_the_same_array(api):
    spec = {**SPEC, "resources": {"flavors": ["sim-80g"], "millis": 100, "memory_mib": 512}, "array": {"count": 20}}
    first = submit(api, spec, "sweep-1")
    again = submit(api, spec, "sweep-1")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["array_id"] == first.json()["array_id"]
    assert again.json()["first_job_id"] == first.json()["first_job_id"] and again.json()["count"] == 20
    assert JobArray.objects.count() == 1
    api.get(f"{first.json()['array_url']}tasks/3/")  # a task that becomes a job does not take the key
    keys = list(Job.objects.order_by("array_index").values_list("idempotency_key", flat=True))
    assert keys == ["sweep-1", ""]
    bigger = submit(api, {**spec, "array": {"count": 21}}, "sweep-1")
    assert bigger.status_code == 422 and "array" in bigger.json()["detail"]


def test_a_replayed_job_shows_its_current_state(api):
    job_id = submit(api, SPEC, "k").json()["id"]
    api.post(f"/api/v1/jobs/{job_id}/cancel/", {}, format="json")
    again = submit(api, SPEC, "k")
    assert again.status_code == 200 and again.json()["state"] == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_concurrent_submits_with_one_key_create_exactly_one_job(
    live_server, postgres, member, node, no_cycle_requests, monkeypatch
):
    """Real concurrent requests against a live server. Every request first looks the key up and finds nothing
    (a barrier holds them until all have looked), so all of them insert: the unique constraint lets one win and
    the others answer its job."""
    racers = 6
    barrier = threading.Barrier(racers)
    lookup = idempotency._job_of_key
    waited = threading.local()

    def lookup_then_wait(**kwargs):
        found = lookup(**kwargs)
        if found is None and not getattr(waited, "done", False):
            waited.done = True
            barrier.wait(timeout=20)
        return found

    monkeypatch.setattr(idempotency, "_job_of_key", lookup_then_wait)
    token = ApiTokenFactory(user=member)

    def post(_: int) -> tuple[int, dict, str | None]:
        request = urllib.request.Request(
            f"{live_server.url}/api/v1/jobs/",
            data=json.dumps(SPEC).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {token.secret}",
                "Content-Type": "application/json",
                "Idempotency-Key": "race-1",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read()), response.headers.get("Idempotent-Replayed")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read()), None

    with ThreadPoolExecutor(racers) as pool:
        answers = list(pool.map(post, range(racers)))

    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200] * (racers - 1) + [201], answers
    assert len({body["id"] for _, body, _ in answers}) == 1
    assert sum(replayed == "true" for _, _, replayed in answers) == racers - 1
    assert Job.objects.filter(idempotency_key="race-1").count() == 1
    assert Job.objects.count() == 1
    # The losers' audit records went with their rolled-back savepoints.
    assert AuditRecord.objects.filter(action="job.submit").count() == 1
