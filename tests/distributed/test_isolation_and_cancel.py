"""A job's sockets are closed to other tenants' jobs (nftables rules of the agent, nodeagent/netpolicy.py), open
to its own tenant; a cancelled job keeps its cards until its process has ended (issue 30, items 4 and 5)."""

from __future__ import annotations

import time
import urllib.request

import pytest

from scheduler.models import Allocation, Job, JobState, ReplicaPort
from tests.distributed.helpers import (
    CARDS,
    gang_spec,
    nft_available,
    replica_logs,
    start_cluster,
    submit,
    wait_final,
)
from tests.nodeagent.sandboxing import SANDBOX_AVAILABLE, WORKLOAD_PYTHON
from tests.resilience.cluster import wait_until

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _running(job_id: int) -> bool:
    return Job.objects.get(pk=job_id).state == JobState.RUNNING


def test_another_tenants_job_is_refused_at_a_jobs_port_and_its_own_tenant_is_not(make_cluster, examples):
    if not (SANDBOX_AVAILABLE and nft_available()):
        pytest.fail("network isolation needs root, util-linux unshare and nftables (scripts/test_prereqs.py)")
    cluster = start_cluster(make_cluster)
    owner_token, owner_slug = cluster.token, cluster.tenant_slug
    other_token = cluster.seed(slug="othertenant", cards=4 * CARDS)
    cluster.token, cluster.tenant_slug = owner_token, owner_slug

    # bob's job: an HTTP server on its own port, serving a file.
    server = submit(
        cluster,
        gang_spec(
            cluster,
            "server",
            ["/bin/sh", "-c", f'echo secret > secret.txt && exec {WORKLOAD_PYTHON} -m http.server "$GPUPOOL_PORT"'],
            replicas=1,
            gpus=1,
        ),
    )
    wait_until(lambda: _running(server), timeout_s=60, what="the server job to run", describe=cluster.describe)
    (port_row,) = ReplicaPort.objects.filter(job_id=server, purpose=ReplicaPort.Purpose.REPLICA)
    address, port = port_row.node.address, port_row.port

    def serves() -> bool:  # from this test (root, outside any sandbox): not restricted
        try:
            with urllib.request.urlopen(f"http://{address}:{port}/secret.txt", timeout=2) as response:
                return response.read() == b"secret\n"
        except OSError:
            return False

    wait_until(serves, timeout_s=30, what=f"the server at {address}:{port}", describe=cluster.describe)

    probe = [WORKLOAD_PYTHON, str(examples / "probe.py"), address, str(port)]
    # carol's job, another tenant, on the same node or the other: refused.
    cluster.token, cluster.tenant_slug = other_token, "othertenant"
    intruder = submit(cluster, gang_spec(cluster, "intruder", probe, replicas=1, gpus=1), token=other_token)
    cluster.token, cluster.tenant_slug = owner_token, owner_slug
    # Another job of bob's own tenant: the same uid, reaches it.
    colleague = submit(cluster, gang_spec(cluster, "colleague", probe, replicas=1, gpus=1))
    for job_id in (intruder, colleague):
        assert wait_final(cluster, job_id, timeout_s=60).state == JobState.SUCCEEDED
    assert f"{address}:{port} refused" in replica_logs(cluster, intruder)[0], replica_logs(cluster, intruder)
    assert f"{address}:{port} connected" in replica_logs(cluster, colleague)[0], replica_logs(cluster, colleague)
    assert serves()  # the server is still up: the refusal was the rules', not a dead server


def test_a_cancelled_jobs_cards_are_not_given_to_another_job_while_its_process_lives(make_cluster):
    cluster = start_cluster(make_cluster)
    # Takes 6 s to stop after SIGTERM (a checkpoint being written), then notes when it exited.
    stubborn = submit(
        cluster,
        gang_spec(
            cluster,
            "stubborn",
            ["/bin/sh", "-c", "trap 'sleep 6; date +%s.%N > exited; exit 0' TERM; sleep 300 & wait"],
            replicas=1,
        ),
    )
    wait_until(lambda: _running(stubborn), timeout_s=60, what="the job to run", describe=cluster.describe)
    time.sleep(1)  # the shell has set its trap
    status, _ = cluster.api(f"/api/v1/jobs/{stubborn}/cancel/", {})
    assert status == 200
    cancelled_at = time.time()
    # A job that needs every card of the pool, the cancelled job's too.
    everything = submit(cluster, gang_spec(cluster, "everything", [WORKLOAD_PYTHON, "-c", "print('placed')"]))

    assert Job.objects.get(pk=stubborn).state == JobState.CANCELLED  # the user sees it cancelled at once
    time.sleep(3)
    assert Allocation.objects.active().filter(job_id=stubborn).count() == CARDS  # its process still runs
    assert Job.objects.get(pk=everything).state == JobState.QUEUED

    job = wait_final(cluster, everything, timeout_s=60)
    assert job.state == JobState.SUCCEEDED, job.state_message
    exited = [float(path.read_text()) for path in (cluster.root / "agents").glob(f"*/work/jobs/{stubborn}-0/exited")]
    assert exited and exited[0] >= cancelled_at + 5, (exited, cancelled_at)
    assert job.admitted_at.timestamp() > exited[0], (job.admitted_at.timestamp(), exited[0])
    assert not Allocation.objects.active().filter(job_id=stubborn).exists()
