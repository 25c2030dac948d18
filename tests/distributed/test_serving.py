"""Serving endpoints through a real Caddy configured by the portal (issue 31): the owner reaches a job's named port,
another tenant gets a 404 and nobody gets in without credentials, the job never sees the caller's token, traffic
spreads over the replicas, and a replica taken back stops receiving traffic before it stops."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.error
import urllib.request

import pytest

from scheduler.models import Job, JobState
from tests.distributed.helpers import CaddyServer, replica_logs, start_cluster, submit
from tests.nodeagent.sandboxing import WORKLOAD_PYTHON
from tests.resilience.cluster import FLAVOR, wait_until

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture
def caddy(tmp_path):
    if shutil.which("caddy") is None:
        pytest.fail("caddy is not installed (apt-get install caddy; scripts/test_prereqs.py does)")
    server = CaddyServer(tmp_path).start()
    yield server
    server.stop()


def _get(url: str, token: str | None) -> tuple[int, dict | str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except OSError as error:
        return 0, str(error)


def test_a_serving_job_is_reached_by_its_owner_through_caddy_and_by_nobody_else(make_cluster, caddy, examples):
    cluster = start_cluster(make_cluster, caddy=caddy)
    owner = cluster.token
    other = cluster.seed(slug="othertenant", cards=8)
    cluster.token = owner
    cluster.tenant_slug = "resilience"
    spec = {
        "name": "echo",
        "tenant": "resilience",
        "kind": "inference",
        "replicas": 2,
        "min_replicas": 1,
        "max_replicas": 2,
        "resources": {"flavors": [FLAVOR], "gpus": 1},
        "ports": [{"name": "http", "ready_path": "/ready"}],
        "command": [WORKLOAD_PYTHON, str(examples / "echo_server.py")],
    }
    job_id = submit(cluster, spec)
    status, detail = cluster.api(f"/api/v1/jobs/{job_id}/")
    url = f"{caddy.serving_url}/serve/jobs/{job_id}/http/"

    def both_replicas_answer() -> bool:
        answers = [_get(url, owner)[1] for _ in range(6)]
        return {answer.get("replica") for answer in answers if isinstance(answer, dict)} == {0, 1}

    wait_until(both_replicas_answer, timeout_s=90, what="both replicas to serve", describe=cluster.describe)
    status, detail = cluster.api(f"/api/v1/jobs/{job_id}/")
    (endpoint,) = detail["endpoints"]
    assert endpoint["name"] == "http" and endpoint["url"] == url and len(endpoint["replicas"]) == 2

    status, answer = _get(url + "v1/models?x=1", owner)
    assert status == 200
    assert answer["path"] == "/v1/models?x=1"  # the prefix is stripped
    assert answer["user"] == "resilience-member"  # the proxy says who calls
    assert answer["credentials_seen"] is False  # the caller's token never reaches the job

    assert _get(url, other)[0] == 404  # another tenant: as if there were no such endpoint
    assert _get(url, None)[0] == 401
    assert _get(f"{caddy.serving_url}/serve/jobs/{job_id}/metrics/", owner)[0] == 404  # no such named port

    # Scale down while a client keeps calling: replica 1 leaves the route before it is stopped, so no call fails.
    results: list[tuple[int, int | None]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            code, body = _get(url, owner)
            results.append((code, body.get("replica") if isinstance(body, dict) else None))
            time.sleep(0.02)

    caller = threading.Thread(target=client)
    caller.start()
    try:
        time.sleep(1)
        status, _ = cluster.api(f"/api/v1/jobs/{job_id}/scale/", {"replicas": 1})
        assert status == 200
        wait_until(
            lambda: Job.objects.get(pk=job_id).scaling_down_replicas == [] and Job.objects.get(pk=job_id).replicas == 1,
            timeout_s=60,
            what="replica 1 to stop",
            describe=cluster.describe,
        )
        time.sleep(2)
    finally:
        stop.set()
        caller.join()
    failures = [result for result in results if result[0] != 200]
    assert not failures, failures[:5]
    # Replica 1 kept serving for 2 s after its SIGTERM, yet no request reached it after the SIGTERM: the proxy had
    # dropped it before its node was told to stop it.
    log = replica_logs(cluster, job_id)[1]
    (term,) = [float(line.split()[1]) for line in log.splitlines() if line.startswith("term ")]
    served = [float(line.split()[1]) for line in log.splitlines() if line.startswith("served ")]
    assert served and not [at for at in served if at > term], (term, served[-3:])
    assert results[-1] == (200, 0)  # after the scale-down only replica 0 answers
    assert Job.objects.get(pk=job_id).state == JobState.RUNNING
