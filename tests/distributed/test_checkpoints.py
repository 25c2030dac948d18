"""Shared checkpoints (issue 31): with shared storage declared, a job's checkpoint dir is one per job on it, so a
job requeued onto another node continues from its checkpoint; each tenant's jobs see only the tenant's part."""

from __future__ import annotations

import re

import pytest

from scheduler.models import Allocation, Job, JobState
from tests.distributed.helpers import (
    gang_spec,
    replica_logs,
    start_cluster,
    submit,
    system_admin_token,
    wait_final,
)
from tests.nodeagent.sandboxing import SANDBOX_AVAILABLE, WORKLOAD_PYTHON
from tests.resilience.cluster import wait_until

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_a_job_requeued_on_another_node_resumes_from_its_shared_checkpoint(make_cluster, examples, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    cluster = start_cluster(make_cluster, settings={"GPUPOOL_SHARED_STORAGE": str(shared)})
    admin = system_admin_token(cluster)
    job_id = submit(
        cluster, gang_spec(cluster, "counter", [WORKLOAD_PYTHON, str(examples / "counter.py"), "30"], replicas=1)
    )
    job = Job.objects.get(pk=job_id)
    saved = shared / "tenants" / str(job.tenant_id) / "jobs" / str(job_id) / "checkpoint" / "count"

    wait_until(lambda: saved.exists() and int(saved.read_text() or 0) >= 4, timeout_s=60, what="4 steps saved")
    first_node = Allocation.objects.active().filter(job_id=job_id).first().node
    # An operator drains the node: the job is stopped there (SIGTERM, 5 s grace) and requeued.
    status, answer = cluster.api(f"/api/v1/nodes/{first_node.pk}/drain/", {"grace_s": 5}, token=admin)
    assert status == 200, answer
    job = wait_final(cluster, job_id, timeout_s=120)
    assert job.state == JobState.SUCCEEDED, job.state_message

    log = replica_logs(cluster, job_id)[0]
    resumed = [(int(at), node) for at, node in re.findall(r"resumed at (\d+) on (\S+)", log)]
    counts = [(int(n), node) for n, node in re.findall(r"count (\d+) on (\S+)", log)]
    assert len(resumed) == 2, log
    # The two runs' logs are on two nodes, read in no particular order: the first run is the one that began at 0.
    (start_a, node_a), (start_b, node_b) = sorted(resumed)
    assert start_a == 0 and node_b != node_a, resumed
    last_on_a = max(n for n, node in counts if node == node_a)
    assert start_b >= last_on_a - 1 and start_b >= 4, (start_b, last_on_a)  # continued, not restarted
    assert max(n for n, node in counts if node == node_b) == 30 and int(saved.read_text()) == 30


def test_a_tenants_jobs_see_only_the_tenants_part_of_the_shared_storage(make_cluster, tmp_path):
    if not SANDBOX_AVAILABLE:
        pytest.fail("the sandbox needs root and util-linux unshare")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    cluster = start_cluster(make_cluster, settings={"GPUPOOL_SHARED_STORAGE": str(shared)})
    mine = submit(
        cluster,
        gang_spec(cluster, "writer", ["/bin/sh", "-c", 'echo secret > "$GPUPOOL_SHARED_DIR/model.bin"'], replicas=1),
    )
    assert wait_final(cluster, mine).state == JobState.SUCCEEDED
    owner_dir = shared / "tenants" / str(Job.objects.get(pk=mine).tenant_id)
    assert (owner_dir / "model.bin").read_text() == "secret\n"
    assert oct(owner_dir.stat().st_mode & 0o777) == "0o700"

    other_token = cluster.seed(slug="othertenant", cards=8)
    cluster.tenant_slug = "othertenant"
    look = (
        f'echo "listing:" $(ls {shared}/tenants); cat {owner_dir}/model.bin; echo "mine: $GPUPOOL_SHARED_DIR"; exit 0'
    )
    theirs = submit(cluster, gang_spec(cluster, "reader", ["/bin/sh", "-c", look], replicas=1), token=other_token)
    assert wait_final(cluster, theirs).state == JobState.SUCCEEDED
    log = replica_logs(cluster, theirs)[0]
    other_id = Job.objects.get(pk=theirs).tenant_id
    assert "secret" not in log and "No such file or directory" in log, log
    assert f"listing: {other_id}\n" in log, log  # of every tenant's part, it sees its own alone
