"""Job outputs (issue 31): a declared output dir is collected when the job ends, stored through Django's storage
API, listed and downloaded by whoever may read the job (another tenant: 404); the node's job dir is removed after
its retention."""

from __future__ import annotations

import io
import tarfile
import time
import urllib.request

import pytest

from scheduler.models import JobOutput, JobState
from tests.distributed.helpers import gang_spec, start_cluster, submit, wait_final
from tests.resilience.cluster import wait_until

pytestmark = [pytest.mark.services, pytest.mark.slow]

WRITE_OUTPUTS = (
    "mkdir -p out/sub && echo 'weights v1' > out/model.txt && echo nested > out/sub/notes.txt "
    "&& ln -s /etc/passwd out/passwd-link && echo done"
)


def _download(cluster, url: str, token: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_an_output_dir_is_collected_downloaded_by_its_tenant_only_and_the_job_dir_removed_later(make_cluster):
    cluster = start_cluster(make_cluster, agent_args=("--job-dir-retention", "4"))
    owner = cluster.token
    job_id = submit(
        cluster, gang_spec(cluster, "writer", ["/bin/sh", "-c", WRITE_OUTPUTS], replicas=1, gpus=1, output_dir="out")
    )
    assert wait_final(cluster, job_id).state == JobState.SUCCEEDED
    wait_until(lambda: JobOutput.objects.filter(job_id=job_id).exists(), timeout_s=30, what="the output stored")

    status, listing = cluster.api(f"/api/v1/jobs/{job_id}/outputs/")
    assert status == 200 and [row["replica"] for row in listing] == [0], listing
    status, body = _download(cluster, listing[0]["download_url"], owner)
    assert status == 200 and len(body) == listing[0]["size_bytes"]
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        names = sorted(archive.getnames())
        model = archive.extractfile("./model.txt").read()
    assert model == b"weights v1\n"
    assert "./sub/notes.txt" in names
    assert not [name for name in names if "passwd" in name]  # a link the job left is not followed, nor packed

    other = cluster.seed(slug="othertenant", cards=8)
    assert _download(cluster, listing[0]["download_url"], other)[0] == 404
    assert cluster.api(f"/api/v1/jobs/{job_id}/outputs/", token=other)[0] == 404

    job_dirs = list((cluster.root / "agents").glob(f"*/work/jobs/{job_id}-0"))
    assert len(job_dirs) == 1
    time.sleep(1)
    wait_until(lambda: not job_dirs[0].exists(), timeout_s=30, what="the job dir removed after its retention")
