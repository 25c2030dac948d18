"""End to end, as a user sees it: submit a job through the REST API → the scheduler places it → a real
`gpupool-agent` process (simulated backend) runs the real command → the job succeeds → its device time
shows up in the usage report."""

from __future__ import annotations

import datetime as dt
import json
import shlex
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from portal.livedemo import DemoFailed, LiveDemo
from scheduler.jobspec import EXAMPLE_COMMAND
from tests.nodeagent.sandboxing import WORKLOAD_PYTHON

pytestmark = pytest.mark.slow


def _api(demo: LiveDemo, token: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        demo.url(path),
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.fixture(scope="module")
def live_demo():
    demo = LiveDemo(agents=1)
    try:
        demo.start()
    except DemoFailed as exc:
        pytest.fail(str(exc))
    try:
        yield demo
    finally:
        demo.stop()


def _token(demo: LiveDemo, name: str) -> str:
    created = demo.python(
        "from tenants.models import User\n"
        "from tenants.services.tokens import api_token_create\n"
        f"token, raw = api_token_create(actor=User.objects.get(username='bob'), name='{name}', scope='write')\n"
        "print('TOKEN=' + raw)\n"
    )
    return next(line for line in created.splitlines() if line.startswith("TOKEN="))[len("TOKEN=") :]


def _wait_until_ended(demo: LiveDemo, token: str, job_id: int, *, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, job = _api(demo, token, f"/api/v1/jobs/{job_id}/")
        assert status == 200, job
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(1)
    return job


def test_the_consoles_example_command_succeeds_on_a_real_agent(live_demo):
    token = _token(live_demo, "example")
    status, job = _api(
        live_demo,
        token,
        "/api/v1/jobs/",
        {
            "name": "example",
            "tenant": "acme-vision",
            "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1},
            "command": shlex.split(EXAMPLE_COMMAND),  # as the submit form splits what it shows
        },
    )
    assert status == 201, job
    job = _wait_until_ended(live_demo, token, job["id"], timeout_s=180)
    assert job["state"] == "succeeded" and job["exit_code"] == 0, f"{job}\ndemo log:\n{live_demo.log_tail(60)}"
    status, log = _api(live_demo, token, f"/api/v1/jobs/{job['id']}/logs/?replica=0&offset=0")
    assert status == 200 and log["text"].startswith("epoch 1 of 30\n") and log["text"].endswith("epoch 30 of 30\n")


def test_job_submitted_through_the_api_runs_on_a_real_agent_and_is_accounted(live_demo):
    token = _token(live_demo, "e2e")
    started = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)

    marker = "hello-from-gpupool-e2e"
    status, job = _api(
        live_demo,
        token,
        "/api/v1/jobs/",
        {
            "name": "e2e",
            "tenant": "acme-vision",
            "kind": "batch",
            "priority_class": "normal",
            "resources": {"flavors": ["nvidia-h100-80g", "nvidia-a100-40g"], "millis": 500, "memory_mib": 4096},
            "command": [
                WORKLOAD_PYTHON,  # the demo's agents sandbox the job as an unprivileged uid when run as root
                "-c",
                "import os, time; print('loading data', flush=True); time.sleep(4); "
                f"print('{marker}', os.environ['CUDA_VISIBLE_DEVICES'])",
            ],
        },
    )
    assert status == 201, job
    job_id = job["id"]

    deadline = time.monotonic() + 150
    seen_states = []
    output_while_running = ""
    while time.monotonic() < deadline:
        status, job = _api(live_demo, token, f"/api/v1/jobs/{job_id}/")
        assert status == 200, job
        if not seen_states or seen_states[-1] != job["state"]:
            seen_states.append(job["state"])
        if job["state"] == "running" and not output_while_running:
            status, log = _api(live_demo, token, f"/api/v1/jobs/{job_id}/logs/?replica=0&offset=0")
            assert status == 200, log
            output_while_running = log["text"] if not log["complete"] else ""
        if job["state"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(1)
    assert job["state"] == "succeeded", f"states seen: {seen_states}; demo log:\n{live_demo.log_tail(60)}"
    assert "running" in seen_states or any(event.get("to_state") == "running" for event in job.get("events", []))
    # Live logs: the first line was readable while the job ran, and the whole output once it ended.
    assert output_while_running.startswith("loading data\n") and marker not in output_while_running
    status, log = _api(live_demo, token, f"/api/v1/jobs/{job_id}/logs/?replica=0&offset=0")
    assert status == 200 and log["complete"] is True, log
    assert log["text"].startswith(f"loading data\n{marker} "), log
    allocations = job.get("allocations", [])
    assert allocations and all(allocation["millis"] == 500 for allocation in allocations), allocations

    ended = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    query = urllib.parse.urlencode({"start": started.isoformat(), "end": ended.isoformat(), "period": "day"})
    status, report = _api(live_demo, token, f"/api/v1/usage/?{query}")
    assert status == 200, report
    text = json.dumps(report)
    assert "acme-vision" in text, report
    hours = [float(value) for value in _values(report, "device_hours") + _values(report, "own_device_hours")]
    # 500 millis for at least the 2 s the command sleeps: at least 0.5 * 2 / 3600 device-hours.
    assert max(hours, default=0) >= 0.5 * 2 / 3600, report


def _values(tree, key: str) -> list:
    found = []
    if isinstance(tree, dict):
        for name, value in tree.items():
            if name == key and value is not None:
                found.append(value)
            else:
                found.extend(_values(value, key))
    elif isinstance(tree, list):
        for item in tree:
            found.extend(_values(item, key))
    return found
