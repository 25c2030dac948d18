"""A live gpupool server (pytest-django's ``live_server``: a real HTTP server on the test database) with a pool,
a tenant and API tokens, and a way to run ``gpupool-cli`` against it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpupool_client.cli import cli
from scheduler.core import types as core
from scheduler.fleet.models import Node
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Job
from scheduler.persist import persist_plan
from tests.factories import ApiTokenFactory, MembershipFactory, SystemAdminFactory, TenantFactory, UserFactory
from tests.patching import patch_request_cycle
from tests.scheduler.factories import node_with_devices


@dataclass
class Pool:
    url: str
    node: Node
    member_token: str
    admin_token: str
    config_path: Path

    def env(self, token: str | None = None) -> dict[str, str]:
        return {
            "GPUPOOL_URL": self.url,
            "GPUPOOL_TOKEN": token or self.member_token,
            "GPUPOOL_CONFIG": str(self.config_path),
        }


@dataclass
class Ran:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@pytest.fixture
def pool(live_server, transactional_db, settings, monkeypatch, tmp_path) -> Pool:
    """Tenant team-a with member alice (write token), a system admin (admin token), one node of 4 sim-80g cards.
    Cycles are not run (tests place jobs themselves), so submits queue nothing in Celery."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: False)
    tenant = TenantFactory(slug="team-a", name="Team A")
    alice = UserFactory(username="alice")
    MembershipFactory(user=alice, tenant=tenant, role="member")
    node = node_with_devices(4, name="gpu-node-1")
    return Pool(
        url=live_server.url,
        node=node,
        member_token=ApiTokenFactory(user=alice).secret,
        admin_token=ApiTokenFactory(user=SystemAdminFactory(username="ops"), scope="admin").secret,
        config_path=tmp_path / "config" / "cli.json",
    )


@pytest.fixture
def run_cli(pool):
    """``run_cli("ls", "--json")``: gpupool-cli in this process against the live server, as alice by default."""

    def run(*args: str, token: str | None = None, env: dict[str, str] | None = None, input: str | None = None) -> Ran:
        result = CliRunner().invoke(cli, list(args), env={**pool.env(token), **(env or {})}, input=input)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return Ran(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

    return run


def place_and_start(job_id: int, node: Node) -> Job:
    """Give the job's replica 0 its cards on ``node`` from card 0 on (as a cycle would) and report it running."""
    job = Job.objects.get(pk=job_id)
    cards = max(1, job.millis_per_replica // 1000)
    per_card = min(job.millis_per_replica, 1000)
    devices = list(node.devices.order_by("index")[:cards])
    assignments = tuple(
        core.Assignment(0, node.name, device.uuid, per_card, job.memory_mib_per_replica) for device in devices
    )
    persist_plan(
        core.Plan(
            places=(core.Place(job_id=str(job.pk), tenant=job.tenant.slug, flavor="sim-80g", assignments=assignments),)
        )
    )
    workload_status_report(
        node=node, job_id=job.pk, replica=0, state="running", exit_code=None, last_checkpoint_at=None
    )
    return Job.objects.get(pk=job_id)


def finish(job_id: int, node: Node, *, exit_code: int = 0) -> None:
    workload_status_report(
        node=node,
        job_id=job_id,
        replica=0,
        state="succeeded" if exit_code == 0 else "failed",
        exit_code=exit_code,
        last_checkpoint_at=None,
    )


def submitted_id(stdout: str) -> int:
    """The job id in ``gpupool-cli submit``'s answer: "Submitted job 42 to team-a (queued): ..."."""
    return int(stdout.split("Submitted job ", 1)[1].split()[0])
