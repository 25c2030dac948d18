"""Distributed training runs unmodified on the pool (issue 30): real agents, real processes, Debian's CPU
PyTorch (gloo) and Open MPI, replicas on two nodes (two agents on this machine announcing 127.0.0.1 and
127.0.0.2). The commands are the manual's (docs/distributed-training.md, docs/examples/distributed/)."""

from __future__ import annotations

import re

import pytest

from scheduler.models import JobState, ReplicaPort
from tests.distributed.helpers import gang_spec, replica_logs, start_cluster, submit, wait_final
from tests.nodeagent.sandboxing import WORKLOAD_PYTHON

pytestmark = [pytest.mark.services, pytest.mark.slow]

#: What torch 1.13's torchrun needs on Python 3.11 (Debian 12): its default "--tee 0 --redirects 0" is parsed to
#: None there (an IntFlag's zero member is not iterated on 3.11); torch 2.x needs nothing.
TORCHRUN_ENV = {"PET_TEE": "1", "PET_REDIRECTS": "1"}


def _torch_available() -> bool:
    import subprocess

    return subprocess.run([WORKLOAD_PYTHON, "-c", "import torch.distributed"], capture_output=True).returncode == 0


@pytest.fixture
def require_torch():
    if not _torch_available():
        pytest.fail(f"{WORKLOAD_PYTHON} cannot import torch.distributed: apt-get install python3-torch")


def _sums(log: str) -> list[str]:
    return re.findall(r"rank (\d+)/(\d+) .*: sum (\S+) \((ok|WRONG)\)", log)


def test_env_init_torchrun_and_two_gangs_at_once_find_their_peers(make_cluster, examples, require_torch):
    cluster = start_cluster(make_cluster)
    script = str(examples / "allreduce.py")

    # 1. torch env:// with no rank arguments: one process per replica, the replicas on two nodes.
    env_job = submit(cluster, gang_spec(cluster, "env-init", [WORKLOAD_PYTHON, script]))
    job = wait_final(cluster, env_job)
    logs = replica_logs(cluster, env_job)
    assert job.state == JobState.SUCCEEDED, (job.state_message, logs)
    assert sorted(rank for log in logs.values() for rank, _world, _sum, _ok in _sums(log)) == ["0", "1"], logs
    assert all(ok == "ok" and world == "2" for log in logs.values() for _r, world, _s, ok in _sums(log)), logs
    # Rank 0 is the master, on the node of replica 0; each replica ran on its own node.
    assert "master 127.0.0." in logs[0]
    ports = list(ReplicaPort.objects.filter(job_id=env_job).values_list("node__address", "replica", "purpose"))
    assert len({address for address, _r, _p in ports}) == 2, ports

    # 2. A bare torchrun, no --nnodes, --node_rank or master arguments: PET_* say it. (TORCHRUN_ENV: Debian 12's
    # torch 1.13 on Python 3.11 cannot parse torchrun's default --tee/--redirects; docs/distributed-training.md.)
    torchrun_job = submit(cluster, gang_spec(cluster, "torchrun", ["torchrun", script], env=TORCHRUN_ENV))
    job = wait_final(cluster, torchrun_job)
    logs = replica_logs(cluster, torchrun_job)
    assert job.state == JobState.SUCCEEDED, (job.state_message, logs)
    # One process per card (PET_NPROC_PER_NODE = the replica's 4 cards): 8 ranks over the two replicas.
    ranks = sorted(int(r) for log in logs.values() for r, w, _s, ok in _sums(log) if ok == "ok" and w == "8")
    assert ranks == list(range(8)) and sorted(logs) == [0, 1], logs

    # 3. torchrun with the explicit form of the manual (torch 1.13 spells it --nproc_per_node; 2.x takes both),
    # two processes on each node: 4 ranks.
    explicit = submit(
        cluster,
        gang_spec(
            cluster,
            "torchrun-2x2",
            ["torchrun", "--nnodes", "2", "--nproc_per_node", "2", script],
            env=TORCHRUN_ENV,
        ),
    )
    job = wait_final(cluster, explicit)
    logs = replica_logs(cluster, explicit)
    assert job.state == JobState.SUCCEEDED, (job.state_message, logs)
    assert sorted(r for log in logs.values() for r, w, _s, ok in _sums(log) if ok == "ok" and w == "4") == [
        "0",
        "1",
        "2",
        "3",
    ], logs

    # 4. Two gangs on the same nodes at the same time: each replica takes half a node, both jobs run at once and
    # each gets its own rendezvous port (torch's default 29500 for both would clash).
    both = [
        submit(cluster, gang_spec(cluster, f"pair-{i}", [WORKLOAD_PYTHON, script], gpus=2, env={"PAIR": str(i)}))
        for i in range(2)
    ]
    jobs = [wait_final(cluster, job_id) for job_id in both]
    assert [job.state for job in jobs] == [JobState.SUCCEEDED] * 2, [(j.state, j.state_message) for j in jobs]
    overlap = min(job.finished_at for job in jobs) > max(job.started_at for job in jobs)
    assert overlap, [(job.started_at, job.finished_at) for job in jobs]
    for job_id in both:
        logs = replica_logs(cluster, job_id)
        assert sorted(r for log in logs.values() for r, _w, _s, ok in _sums(log) if ok == "ok") == ["0", "1"], logs


def test_mpirun_on_replica_0_starts_the_ranks_of_every_node_from_the_hostfile(make_cluster, examples):
    cluster = start_cluster(make_cluster)
    # Two ranks on each of the two nodes: mpirun reads the hostfile (127.0.0.1 slots=4, 127.0.0.2 slots=4), starts
    # its daemon on the second node through gpupool-rsh and the replica serving there.
    command = ["mpirun", "-n", "8", WORKLOAD_PYTHON, str(examples / "mpi_allreduce.py")]
    job_id = submit(cluster, gang_spec(cluster, "mpi", command, launcher="mpi"))
    job = wait_final(cluster, job_id)
    logs = replica_logs(cluster, job_id)
    assert job.state == JobState.SUCCEEDED, (job.state_message, logs)
    found = re.findall(r"mpi rank (\d+)/8 .* replica (\d+): sum 36 \(ok\)", logs[0])
    assert sorted(int(rank) for rank, _replica in found) == list(range(8)), logs
    # Each rank's output comes back to mpirun on replica 0; half the ranks ran in replica 1's sandbox.
    assert sorted({replica for _rank, replica in found}) == ["0", "1"], logs
