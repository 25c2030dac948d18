"""gpupool's own history as a trace: jobs that ran are exported with the inventory and the quota tree, and a
replay of the export runs the same jobs for the same GPU-seconds; ``gpupool whatif`` compares policies on it."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from audit.models import AuditRecord
from scheduler.scheduling_policy import policy_from_settings
from scheduler.sim import SimPolicy, simulate
from scheduler.sim.traceformat import load_trace
from tenants.models import TenantKind
from tenants.services.quotas import quota_set
from tenants.services.tenancy import tenant_create, tenant_update
from tests.scheduler.history import job_history

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _quiet(no_cycle_requests):
    return no_cycle_requests


def export(tmp_path, history, *extra: str) -> dict:
    until = (timezone.now() + timedelta(minutes=1)).isoformat()
    out = io.StringIO()
    call_command(
        "export_trace",
        "--since",
        history.start.isoformat(),
        "--until",
        until,
        "--out",
        str(tmp_path),
        *extra,
        stdout=out,
    )
    return {"stdout": out.getvalue(), "manifest": json.loads((tmp_path / "manifest.json").read_text())}


def test_export_then_replay_runs_the_same_jobs_for_the_same_gpu_seconds(tmp_path, member, node):
    history = job_history(member, node)
    type(history.jobs["half"]).objects.filter(pk=history.jobs["half"].pk).update(any_flavor=True)

    exported = export(tmp_path, history)

    manifest = exported["manifest"]
    assert (manifest["jobs"], manifest["never_ran"], manifest["still_running"]) == (3, 1, 0)
    assert manifest["gpu_seconds"] == pytest.approx(history.gpu_seconds)
    assert "gpupool simulate --trace-file" in exported["stdout"]
    with (tmp_path / "jobs.csv").open() as fh:
        rows = {row["job_id"]: row for row in csv.DictReader(fh)}
    jobs = history.jobs
    assert set(rows) == {str(jobs[name].pk) for name in ("whole", "half", "pair")}
    half = rows[str(jobs["half"].pk)]
    assert (half["millis"], half["memory_mib"], half["duration_s"], half["submit_s"]) == ("500", "10000", "1200", "31")
    assert rows[str(jobs["pair"].pk)]["cards"] == "2" and rows[str(jobs["pair"].pk)]["tenant"] == "team-a"
    # A job whose flavors were alternatives replays as one.
    assert (half["flavors"], half["any_flavor"], rows[str(jobs["pair"].pk)]["any_flavor"]) == ("sim-80g", "true", "")
    assert (tmp_path / "cluster.csv").read_text().splitlines()[1].startswith("node-a,,2,sim-80g,81920,64,524288")

    workload = load_trace(tmp_path / "jobs.csv", tmp_path / "cluster.csv", tmp_path / "tenants.csv")
    assert {j.job_id for j in workload.jobs if j.any_flavor} == {str(jobs["half"].pk)}
    result = simulate(workload, SimPolicy("current", policy_from_settings()))

    finished = [j for j in result.jobs if j.finish_s is not None]
    assert len(finished) == 3
    assert sum(j.gpus * j.duration_s for j in finished) == pytest.approx(history.gpu_seconds)
    assert AuditRecord.objects.filter(action="trace.export").count() == 1


def test_the_exported_files_replay_with_gpupool_simulate(tmp_path, member, node):
    history = job_history(member, node)
    export(tmp_path, history, "--format", "jsonl")
    out = tmp_path / "r.json"

    call_command(
        "simulate",
        "--",
        "--trace-file",
        str(tmp_path / "jobs.jsonl"),
        "--cluster-file",
        str(tmp_path / "cluster.jsonl"),
        "--tenants-file",
        str(tmp_path / "tenants.jsonl"),
        "--out",
        str(out),
    )

    summary = json.loads(out.read_text())["results"][0]["summary"]
    assert (summary["jobs"], summary["finished"]) == (3, 3)
    assert summary["gpu_hours"] == pytest.approx(history.gpu_seconds / 3600)


def test_the_quota_tree_is_exported_as_the_tenants_file(tmp_path, member, node, tenant, flavor):
    history = job_history(member, node)
    org = tenant_create(actor=None, name="Org", slug="org", kind=TenantKind.COMPANY)
    tenant_update(actor=None, tenant=tenant, parent=org)
    quota_set(actor=None, tenant=org, flavor=flavor, values={"guaranteed_millis": 2000, "limit_millis": 2000})

    export(tmp_path, history)

    with (tmp_path / "tenants.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {"tenant": "org", "parent": "", "flavor": "sim-80g", "guaranteed_millis": "2000"}.items() <= rows[0].items()
    assert [(r["tenant"], r["parent"]) for r in rows] == [("org", ""), ("team-a", "org")]


def test_whatif_command_compares_the_current_and_the_proposed_policy(tmp_path, member, node):
    job_history(member, node)
    out = io.StringIO()
    chart = tmp_path / "chart.svg"

    call_command(
        "whatif", "--days", "1", "--set", "preemption=false", "--per-tenant", "--chart", str(chart), stdout=out
    )

    text = out.getvalue()
    assert "3 jobs on 2 GPUs; proposed: preemption=false" in text
    assert "completion time, mean" in text and "jobs within their guarantee" in text
    assert "team-a" in text  # the per-tenant table
    assert chart.read_text().startswith("<svg")


def test_whatif_command_refuses_an_unknown_setting_naming_the_valid_ones(member, node):
    job_history(member, node)

    with pytest.raises(CommandError, match="unknown setting 'preempt'; the settings are preemption, borrowing"):
        call_command("whatif", "--days", "1", "--set", "preempt=false")
