"""What the distributed-training tests share: the manual's example scripts where a sandboxed job can read them,
jobs spread over the cluster's nodes, their logs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from scheduler.models import Job, JobState
from tests.resilience.cluster import FLAVOR, Cluster, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "distributed"
#: Cards per simulated node in these tests; a replica asking for all of them fills a node, so a 2-replica gang
#: spans both nodes.
CARDS = 4


def shared_examples() -> Path:
    """A copy of docs/examples/distributed that every uid can read, where a sandboxed job sees it: not under
    /tmp or /var/tmp (a sandbox has its own), so under /var/lib when the tests run as root (CI)."""
    base = Path("/var/lib/gpupool-tests") if os.geteuid() == 0 else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    folder = Path(tempfile.mkdtemp(prefix="examples-", dir=base))
    folder.chmod(0o755)
    for script in EXAMPLES.iterdir():
        if script.is_file():
            shutil.copy(script, folder / script.name)
            (folder / script.name).chmod(0o755 if script.suffix == ".sh" else 0o644)
    return folder


def start_cluster(make_cluster, *, agents: int = 2, settings: dict[str, str] | None = None) -> Cluster:
    """Web, worker, beat and ``agents`` agents of CARDS cards, agent i announcing 127.0.0.(i+1): distinct node
    addresses on one machine (all of 127/8 is this machine's loopback), as distinct hosts would have."""
    cluster = make_cluster(settings=settings)
    cluster.seed(cards=4 * CARDS)
    cluster.start_web()
    cluster.start_worker()
    cluster.start_beat()
    cluster.wait_web()
    for index in range(agents):
        cluster.add_agent(f"node-{index}-{cluster.run_id[:6]}", cards=CARDS, address=f"127.0.0.{index + 1}")
    cluster.wait_nodes_ready(list(cluster.agents))
    return cluster


def gang_spec(cluster: Cluster, name: str, command: list[str], *, replicas: int = 2, gpus: int = CARDS, **extra):
    return {
        "name": name,
        "tenant": cluster.tenant_slug,
        "kind": "training",
        "replicas": replicas,
        "resources": {"flavors": [FLAVOR], "gpus": gpus},
        "command": command,
        **extra,
    }


def submit(cluster: Cluster, spec: dict, *, token: str = "") -> int:
    status, job = cluster.api("/api/v1/jobs/", spec, token=token)
    assert status == 201, (status, job)
    return job["id"]


def wait_final(cluster: Cluster, job_id: int, *, timeout_s: float = 120) -> Job:
    final = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
    return wait_until(
        lambda: (job := Job.objects.get(pk=job_id)).state in final and job,
        timeout_s=timeout_s,
        what=f"job {job_id} to end",
        describe=cluster.describe,
    )


def replica_logs(cluster: Cluster, job_id: int) -> dict[int, str]:
    """Each replica's output, from its job dir on whichever node ran it."""
    logs = {}
    for path in (cluster.root / "agents").glob(f"*/work/jobs/{job_id}-*/output.log"):
        replica = int(path.parent.name.rsplit("-", 1)[1])
        logs[replica] = logs.get(replica, "") + path.read_text(errors="replace")
    return logs


def nft_available() -> bool:
    return (
        shutil.which("nft") is not None
        and subprocess.run(["nft", "list", "tables"], capture_output=True).returncode == 0
    )
