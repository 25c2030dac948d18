"""A job that tries to leave its directory: into another job's directory (another tenant's ``output.log``), the
agent's own files, or anywhere through ``..``, an absolute path or a symlink.

tests/nodeagent/test_workloads.py already refuses a working_dir outside the agent's *work dir*; here the runner
must also keep a job out of *other jobs'* directories, and the portal refuses such a spec at submit (400,
nothing stored). Reading another tenant's job (and its log tail in the job events) through the API or the
console is covered by test_cross_tenant.py.

These tests drive the runner without a sandbox (``--sandbox none``): the path checks hold in every mode. With
the sandbox (the default of ``gpupool-agent run``) a command such as ``cat ../1-0/output.log`` finds nothing
either: other jobs' directories are not in its mount namespace (tests/security/test_sandbox.py).

A refused start is recorded as a ``failed`` workload that never ran (no pid, no log), so its job fails and its
devices are freed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from nodeagent import protocol
from nodeagent.launcher import WorkloadRejected
from nodeagent.workloads import WorkloadRunner
from tenants.models import MembershipRole
from tests.factories import MembershipFactory, TenantFactory, UserFactory
from tests.scheduler.factories import FlavorFactory
from tests.security.conftest import assert_unchanged, state_fingerprint


def _start(job_id: int, **fields) -> protocol.WorkloadStart:
    command = fields.pop("command", [sys.executable, "-c", "print('secret of job', flush=True)"])
    return protocol.WorkloadStart(command_id=100 + job_id, job_id=job_id, replica=0, command=command, **fields)


def _finish(runner: WorkloadRunner, job_id: int) -> None:
    deadline = time.monotonic() + 10
    while runner.records[(job_id, 0)].active:
        assert time.monotonic() < deadline, "workload did not finish"
        runner.poll()
        time.sleep(0.02)


def assert_refused(runner: WorkloadRunner, job_id: int) -> None:
    """Refused before anything ran: recorded failed (reported, so the job fails), no process, no log."""
    record = runner.records[(job_id, 0)]
    assert (record.state, record.pid, record.reason) == ("failed", None, "rejected")
    assert not (runner.work_dir / "jobs" / f"{job_id}-0" / "output.log").exists()


@pytest.fixture
def runner(tmp_path: Path) -> WorkloadRunner:
    runner = WorkloadRunner(work_dir=tmp_path / "agent", base_env={"PATH": "/usr/bin:/bin"})
    runner.start(_start(1))  # another tenant's job, with its log
    _finish(runner, 1)
    return runner


@pytest.mark.parametrize(
    "working_dir",
    [
        "../1-0",  # the other job's directory, with its output.log
        "../../",  # the agent's work dir (state.json)
        "sub/../../1-0",
        "{work}/jobs/1-0",  # absolute, inside the work dir but another job's
        "{work}",
    ],
)
def test_a_job_cannot_work_in_another_jobs_directory(runner: WorkloadRunner, working_dir: str) -> None:
    with pytest.raises(WorkloadRejected, match="outside the job's directory"):
        runner.start(_start(2, working_dir=working_dir.format(work=runner.work_dir)))
    assert_refused(runner, 2)


def test_a_symlink_out_of_the_job_directory_is_not_followed(runner: WorkloadRunner) -> None:
    for job_id in (2, 4):
        job_dir = runner.work_dir / "jobs" / f"{job_id}-0"
        job_dir.mkdir(parents=True)
        (job_dir / "peek").symlink_to(runner.work_dir / "jobs" / "1-0")
    with pytest.raises(WorkloadRejected):
        runner.start(_start(2, working_dir="peek"))
    assert_refused(runner, 2)
    with pytest.raises(WorkloadRejected):
        runner.start(_start(4, checkpoint_dir="peek/ckpt"))
    assert_refused(runner, 4)


def test_a_relative_checkpoint_dir_stays_in_the_job_directory(runner: WorkloadRunner) -> None:
    with pytest.raises(WorkloadRejected):
        runner.start(_start(2, checkpoint_dir="../1-0/ckpt"))
    runner.start(_start(3, working_dir="src/train", checkpoint_dir="ckpt"))
    _finish(runner, 3)
    assert runner.records[(3, 0)].working_dir == str(runner.work_dir / "jobs" / "3-0" / "src" / "train")
    assert runner.records[(3, 0)].checkpoint_dir == str(runner.work_dir / "jobs" / "3-0" / "ckpt")


@pytest.mark.django_db
@pytest.mark.parametrize("working_dir", ["/etc", "../other-job", "src/../../x", "/var/lib/gpupool-agent/jobs/1-0"])
def test_the_portal_refuses_a_working_dir_outside_the_job_directory(working_dir: str) -> None:
    FlavorFactory(name="sim-80g")
    tenant = TenantFactory(slug="confine")
    member = UserFactory(username="confine-member")
    MembershipFactory(user=member, tenant=tenant, role=MembershipRole.MEMBER)
    client = APIClient()
    client.force_authenticate(member)
    spec = {
        "name": "escape",
        "tenant": "confine",
        "resources": {"flavors": ["sim-80g"], "gpus": 1},
        "command": ["sh", "-c", "cat output.log"],
        "working_dir": working_dir,
    }
    before = state_fingerprint()
    response = client.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_job_spec" and "working_dir" in body["detail"]
    assert_unchanged(before, state_fingerprint(), "refused working_dir")
    accepted = client.post("/api/v1/jobs/", {**spec, "working_dir": "src/train"}, format="json")
    assert accepted.status_code == 201 and accepted.json()["working_dir"] == "src/train"
