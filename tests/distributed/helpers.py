"""What the distributed-training tests share: the manual's example scripts where a sandboxed job can read them,
jobs spread over the cluster's nodes, their logs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from scheduler.models import Job, JobState
from tests.resilience.cluster import FLAVOR, Cluster, free_port, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "distributed"
SERVING_EXAMPLES = EXAMPLES.parent / "serving"
CHECKPOINT_EXAMPLES = EXAMPLES.parent / "checkpoints"
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
    for script in [*EXAMPLES.iterdir(), *SERVING_EXAMPLES.iterdir(), *CHECKPOINT_EXAMPLES.iterdir()]:
        if script.is_file():
            shutil.copy(script, folder / script.name)
            (folder / script.name).chmod(0o755 if script.suffix == ".sh" else 0o644)
    return folder


def start_cluster(
    make_cluster,
    *,
    agents: int = 2,
    settings: dict[str, str] | None = None,
    caddy: CaddyServer | None = None,
    agent_args: tuple[str, ...] = (),
) -> Cluster:
    """Web, worker, beat and ``agents`` agents of CARDS cards, agent i announcing 127.0.0.(i+1): distinct node
    addresses on one machine (all of 127/8 is this machine's loopback), as distinct hosts would have. With
    ``caddy``, the portal routes serving endpoints through it."""
    cluster = make_cluster(settings=settings)
    if caddy is not None:
        cluster.settings.update(caddy.portal_settings(portal=f"127.0.0.1:{cluster.port}"))
    cluster.seed(cards=4 * CARDS)
    cluster.start_web()
    cluster.start_worker()
    cluster.start_beat()
    cluster.wait_web()
    for index in range(agents):
        cluster.add_agent(
            f"node-{index}-{cluster.run_id[:6]}", cards=CARDS, address=f"127.0.0.{index + 1}", extra_args=agent_args
        )
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


class CaddyServer:
    """Debian's Caddy with nothing but its admin API, as a deployment starts it; the portal adds the rest."""

    def __init__(self, folder: Path) -> None:
        self.admin_port, self.serving_port = free_port(), free_port()
        self.folder = folder
        self.process: subprocess.Popen | None = None

    @property
    def serving_url(self) -> str:
        return f"http://127.0.0.1:{self.serving_port}"

    def portal_settings(self, *, portal: str) -> dict[str, str]:
        return {
            "GPUPOOL_SERVING_CADDY_ADMIN": f"http://127.0.0.1:{self.admin_port}",
            "GPUPOOL_SERVING_LISTEN": f"127.0.0.1:{self.serving_port}",
            "GPUPOOL_SERVING_URL": self.serving_url,
            "GPUPOOL_SERVING_PORTAL": portal,
            "GPUPOOL_SERVING_SYNC_S": "5",
        }

    def start(self) -> CaddyServer:
        config = self.folder / "caddy.json"
        config.write_text(json.dumps({"admin": {"listen": f"127.0.0.1:{self.admin_port}"}}))
        env = {
            **os.environ,
            "HOME": str(self.folder),
            "XDG_DATA_HOME": str(self.folder),
            "XDG_CONFIG_HOME": str(self.folder),
        }
        log = open(self.folder / "caddy.log", "wb")
        self.process = subprocess.Popen(["caddy", "run", "--config", str(config)], stdout=log, stderr=log, env=env)
        wait_until(self._answers, timeout_s=30, what="Caddy's admin API")
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/config/", timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


def system_admin_token(cluster: Cluster) -> str:
    """An admin-scope API token of a system admin (node operations go through the API, as an operator's do)."""
    from tenants.models import PlatformRole
    from tenants.services.identity import user_create
    from tenants.services.tokens import api_token_create

    admin = user_create(
        actor=None, username=f"ops-{cluster.run_id[:6]}", password=None, platform_role=PlatformRole.SYSTEM_ADMIN
    )
    _token, raw = api_token_create(actor=admin, name="ops", scope="admin")
    return raw
