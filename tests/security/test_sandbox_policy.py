"""What a job may ask for, checked at submit (400 naming the field, nothing stored), and the credential theft of
issue 17 end to end: a plain member's job that ``cat``s the node's credential file, run by the real agent in
its real sandbox against the real portal, gets nothing, and the job's log (API) holds no ``gpn_`` secret.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from rest_framework.test import APIClient

from nodeagent.agent import Agent, AgentSettings
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.sandbox import Sandbox, SandboxConfig
from nodeagent.workloads import WorkloadRunner
from scheduler.fleet.models import Device
from scheduler.models import Job, JobEvent, JobState
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tenants.models import MembershipRole
from tests.factories import MembershipFactory, TenantFactory, UserFactory
from tests.fleet.conftest import register_node
from tests.fleet.test_agent_reports import Link, drive, job_state
from tests.nodeagent.sandboxing import SANDBOX_AVAILABLE
from tests.patching import patch_imported, patch_request_cycle
from tests.scheduler.factories import FlavorFactory
from tests.security.conftest import assert_unchanged, state_fingerprint

db = database_sync_to_async


@pytest.fixture
def member(db):
    FlavorFactory(name="sim-80g")
    tenant = TenantFactory(slug="policy")
    user = UserFactory(username="policy-member")
    MembershipFactory(user=user, tenant=tenant, role=MembershipRole.MEMBER)
    client = APIClient()
    client.force_authenticate(user)
    return client


def spec(**fields) -> dict:
    return {
        "name": "p",
        "tenant": "policy",
        "resources": {"flavors": ["sim-80g"], "gpus": 1},
        "command": ["sh", "-c", "true"],
        **fields,
    }


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PATH", "GLIBC_TUNABLES", "LD_X"])
def test_a_denied_env_variable_is_refused_at_submit_naming_it(member, name) -> None:
    before = state_fingerprint()
    response = member.post("/api/v1/jobs/", spec(env={"OK": "1", name: "/tmp/evil.so"}), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_job_spec" and f"env.{name}" in body["detail"]
    assert_unchanged(before, state_fingerprint(), f"refused env {name}")


def test_the_env_denylist_is_configurable(member, settings) -> None:
    settings.GPUPOOL_ENV_DENYLIST = ["SECRET_*"]
    refused = member.post("/api/v1/jobs/", spec(env={"SECRET_X": "1"}), format="json")
    assert refused.status_code == 400 and "env.SECRET_X" in refused.json()["detail"]
    assert member.post("/api/v1/jobs/", spec(env={"LD_PRELOAD": "x"}), format="json").status_code == 201


@pytest.mark.parametrize("working_dir", ["..\\..\\x", "src\\..\\..\\x", "\\etc", "C:\\Windows", "a/..\\../b"])
def test_a_working_dir_escaping_with_backslashes_is_refused(member, working_dir) -> None:
    response = member.post("/api/v1/jobs/", spec(working_dir=working_dir), format="json")
    assert response.status_code == 400, (working_dir, response.content)
    assert "working_dir" in response.json()["detail"]
    assert not Job.objects.exists()


def test_a_backslash_working_dir_inside_the_job_dir_is_normalised(member) -> None:
    response = member.post("/api/v1/jobs/", spec(working_dir="src\\train"), format="json")
    assert response.status_code == 201 and response.json()["working_dir"] == "src/train"


@pytest.mark.parametrize(
    "checkpoint_dir", ["/var/lib/gpupool-agent/jobs/1-0", "/ckpt/other-tenant/x", "/ckpt/policy/../x"]
)
def test_an_absolute_checkpoint_dir_outside_the_tenants_prefixes_is_refused(member, settings, checkpoint_dir) -> None:
    settings.GPUPOOL_CHECKPOINT_PREFIXES = '{"policy": ["/ckpt/policy"], "other-tenant": ["/ckpt/other-tenant"]}'
    response = member.post("/api/v1/jobs/", spec(checkpoint_dir=checkpoint_dir), format="json")
    assert response.status_code == 400, response.content
    assert "checkpoint_dir" in response.json()["detail"]
    assert not Job.objects.exists()


def test_an_absolute_checkpoint_dir_under_the_tenants_prefix_is_accepted(member, settings) -> None:
    settings.GPUPOOL_CHECKPOINT_PREFIXES = '{"policy": ["/ckpt/policy"]}'
    response = member.post("/api/v1/jobs/", spec(checkpoint_dir="/ckpt/policy/run-1"), format="json")
    assert response.status_code == 201 and response.json()["checkpoint_dir"] == "/ckpt/policy/run-1"
    settings.GPUPOOL_CHECKPOINT_PREFIXES = "{}"  # none configured: relative only
    refused = member.post("/api/v1/jobs/", spec(checkpoint_dir="/ckpt/policy/run-2"), format="json")
    assert refused.status_code == 400 and "none are configured" in refused.json()["detail"]
    assert member.post("/api/v1/jobs/", spec(checkpoint_dir="ckpt"), format="json").status_code == 201


def test_an_image_job_is_only_for_nodes_with_a_container_runtime(member) -> None:
    response = member.post("/api/v1/jobs/", spec(image="docker.io/pytorch/pytorch:2.3.0-cuda12.1"), format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.node_selector == {"gpupool.io/oci": "true"} and job.spec["image"].startswith("docker.io/pytorch")
    from scheduler.fleet.outbox import workload_start_frame

    frame = workload_start_frame(job=job, replica=0, devices=[])
    assert frame.image == "docker.io/pytorch/pytorch:2.3.0-cuda12.1" and frame.tenant_id == job.tenant_id
    for bad, field in (
        ({"image": "Not An Image"}, "image"),
        ({"image": "busybox", "node_selector": {"gpupool.io/oci": "false"}}, "node_selector"),
    ):
        refused = member.post("/api/v1/jobs/", spec(**bad), format="json")
        assert refused.status_code == 400 and field in refused.json()["detail"], refused.content


# --- the credential theft, end to end ------------------------------------------------------------------------


@pytest.mark.skipif(not SANDBOX_AVAILABLE, reason="the sandbox needs root and util-linux unshare")
@pytest.mark.django_db(transaction=True)
async def test_a_job_cannot_steal_the_node_credential_end_to_end(tmp_path: Path, settings, monkeypatch) -> None:
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: False)
    patch_imported(monkeypatch, "scheduler.fleet.services.notify.cycle_request_after_commit", lambda: None)
    _node, credential = await db(register_node)("gpu-theft")
    credential_file = tmp_path / "etc" / "agent.json"
    credential_file.parent.mkdir()
    credential_file.write_text(json.dumps({"credential": credential}))
    credential_file.chmod(0o600)
    work_dir = tmp_path / "work"
    link = Link(credential)
    agent = Agent(
        settings=AgentSettings(
            node_name="gpu-theft", backoff_base_s=0.05, backoff_cap_s=0.1, stop_workloads_on_exit=True
        ),
        backend=SimulatedBackend(node_name="gpu-theft", cards=1),
        runner=WorkloadRunner(
            work_dir=work_dir,
            sandbox=Sandbox(SandboxConfig(hidden_files=(str(credential_file),)), work_dir=work_dir),
        ),
        connector=link,
        rng=random.Random(1),
    )
    await drive(agent, lambda: Device.objects.filter(node__name="gpu-theft").exists(), what="the hello")

    def submit() -> int:
        flavor = Device.objects.select_related("flavor").get(node__name="gpu-theft").flavor.name
        tenant = TenantFactory()
        user = UserFactory()
        MembershipFactory(user=user, tenant=tenant, role="member")
        steal = f"cat {credential_file} > out; cat {work_dir}/outbox.jsonl >> out; cat out; grep -c gpn_ out"
        job = job_submit(
            actor=user,
            spec={
                "name": "thief",
                "tenant": tenant.slug,
                "resources": {"flavors": [flavor], "gpus": 1},
                "command": ["sh", "-c", steal],
            },
        )
        assert job.pk in run_cycle().placed
        return job.pk

    job_id = await db(submit)()
    await drive(agent, lambda: job_state(job_id) in (JobState.SUCCEEDED, JobState.FAILED), what="the job to end")
    agent.runner.close(stop_workloads=True)
    await link.close()

    job = await db(Job.objects.get)(pk=job_id)
    event = await db(lambda: JobEvent.objects.filter(job_id=job_id, to_state=job.state).last())()
    log_tail = event.details.get("log_tail", "")
    # grep found no credential: exit code 1, reported honestly as the job's failure; nothing secret in the log.
    assert job.state == JobState.FAILED and job.exit_code == 1, (job.state, job.exit_code, log_tail)
    assert credential not in log_tail and "gpn_" not in log_tail.replace("grep -c gpn_", "")
    job_dir = work_dir / "jobs" / f"{job_id}-0"
    assert credential not in (job_dir / "out").read_text()
    assert credential in credential_file.read_text()  # the agent's copy is intact
