"""``gpupool-cli`` against a live server: what a user types and what they see (and what scripts parse)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from catalog.models import ResourceFlavor
from scheduler.models import Job, JobState
from tenants.models import Tenant
from tenants.services.quotas import quota_set
from tests.client.conftest import place_and_start, submitted_id
from tests.factories import SystemAdminFactory
from tests.scheduler.factories import FlavorFactory

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_login_saves_a_private_config_that_later_commands_use(pool, run_cli):
    ran = run_cli("login", pool.url, "--token", pool.member_token, env={"GPUPOOL_URL": "", "GPUPOOL_TOKEN": ""})
    assert ran.exit_code == 0, ran.stderr
    assert "as alice (team-a)" in ran.stdout
    assert stat.S_IMODE(os.stat(pool.config_path).st_mode) == 0o600
    assert json.loads(pool.config_path.read_text()) == {"url": pool.url, "token": pool.member_token}
    whoami = run_cli("whoami", env={"GPUPOOL_URL": "", "GPUPOOL_TOKEN": ""})
    assert whoami.exit_code == 0 and whoami.stdout.startswith("alice on ")
    refused = run_cli("login", pool.url, "--token", "gp_wrong_token", env={"GPUPOOL_URL": "", "GPUPOOL_TOKEN": ""})
    assert refused.exit_code == 3
    assert json.loads(pool.config_path.read_text())["token"] == pool.member_token  # the good login is kept


def test_submit_ls_show_cancel(pool, run_cli):
    ran = run_cli("submit", "--gpus", "1", "--", "python", "train.py", "--epochs", "3")
    assert ran.exit_code == 0, ran.stderr
    job_id = submitted_id(ran.stdout)
    assert "(queued)" in ran.stdout

    table = run_cli("ls")
    assert table.exit_code == 0
    header, *rows = [line for line in table.stdout.splitlines() if line.strip() and set(line.strip()) != {"─"}]
    assert header.split()[:6] == ["JOBID", "NAME", "TENANT", "USER", "STATE", "REASON"]
    assert rows[0].split()[:5] == [str(job_id), "train", "team-a", "alice", "queued"]

    listed = run_cli("queue", "--json").json()
    assert [(row["id"], row["state"], row["tenant"]) for row in listed] == [(job_id, "queued", "team-a")]

    detail = run_cli("show", str(job_id))
    assert "python train.py --epochs 3" in detail.stdout and "Waiting" in detail.stdout
    assert run_cli("show", str(job_id), "--json").json()["command"] == ["python", "train.py", "--epochs", "3"]

    cancelled = run_cli("cancel", str(job_id), "--reason", "wrong data")
    assert cancelled.exit_code == 0 and f"Cancelled job {job_id}" in cancelled.stdout
    assert run_cli("ls", "--json").json() == []  # unfinished jobs only, like squeue
    assert [row["state"] for row in run_cli("ls", "--all", "--json").json()] == ["cancelled"]
    assert Job.objects.get(pk=job_id).events.last().message == "wrong data"


def test_submit_options_and_a_yaml_file_become_the_spec(pool, run_cli, tmp_path):
    ran = run_cli(
        "submit",
        "--fraction", "0.3", "--memory", "8Gi", "--replicas", "2", "--priority", "high", "--cpus", "4",
        "--mem", "16Gi", "--env", "EPOCHS=10", "--env", "LR=0.1", "--flavor", "sim-80g", "--json",
        "--", "python", "infer.py",
    )  # fmt: skip
    assert ran.exit_code == 0, ran.stderr
    body = ran.json()
    assert body["replayed"] is False and body["idempotency_key"]
    assert (body["millis_per_replica"], body["memory_mib_per_replica"], body["replicas"]) == (300, 8192, 2)
    assert body["priority_class"] == "high" and body["env"] == {"EPOCHS": "10", "LR": "0.1"}
    assert body["spec"]["resources"]["cpu_cores"] == 4 and body["spec"]["resources"]["host_memory_mib"] == 16384

    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: from-file\nresources:\n  flavors: [sim-80g]\n  gpus: 2\ncommand: [python, a.py]\nenv:\n  A: '1'\n"
    )
    body = run_cli("submit", "-f", str(spec), "--fraction", "0.5", "--memory", "1Gi", "--env", "B=2", "--json").json()
    assert body["name"] == "from-file" and body["command"] == ["python", "a.py"]
    assert body["millis_per_replica"] == 500 and body["env"] == {"A": "1", "B": "2"}


def test_any_flavor_submits_the_flavors_as_alternatives_and_show_says_so(pool, run_cli):
    FlavorFactory(name="sim-40g", memory_mib=40960)
    either = run_cli(
        "submit", "--gpus", "1", "--flavor", "sim-80g", "--flavor", "sim-40g", "--any-flavor", "--json", "--", "a"
    ).json()
    ordered = run_cli("submit", "--gpus", "1", "--flavor", "sim-80g", "--flavor", "sim-40g", "--json", "--", "b").json()
    assert (either["any_flavor"], ordered["any_flavor"]) == (True, False)
    assert Job.objects.get(pk=either["id"]).any_flavor is True
    assert "sim-80g or sim-40g (whichever fits the pool best)" in run_cli("show", str(either["id"])).stdout
    assert "sim-80g, sim-40g" in run_cli("show", str(ordered["id"])).stdout


def test_an_array_of_20_and_several_jobs_are_cancelled(pool, run_cli):
    ran = run_cli("submit", "--array", "0-19", "--fraction", "0.1", "--memory", "1Gi", "--json", "--", "python", "s.py")
    array = ran.json()
    assert array["count"] == 20 and array["first_job_id"]
    rows = run_cli("ls", "--array", array["array_id"], "--json").json()
    assert [row["array_index"] for row in rows] == [0]  # the other tasks are not jobs until a cycle places them
    listed = run_cli("ls", "--array", array["array_id"])
    assert f"Also queued, not jobs yet: tasks 1-19 of array {array['array_id']}" in listed.stdout
    task = run_cli("array", array["array_id"], "--json").json()
    assert task["states"] == {"queued": 20} and task["not_yet_jobs"] == "1-19"
    assert "20 tasks: 20 queued" in run_cli("array", array["array_id"]).stdout

    done = run_cli("cancel", "--array", array["array_id"], "--indices", "0-4")
    assert done.exit_code == 0 and "Cancelled 5 task(s)" in done.stdout, done.stdout
    done = run_cli("cancel", "--array", array["array_id"])
    assert done.exit_code == 0 and "Cancelled 15 task(s)" in done.stdout, done.stdout
    states = {row["state"] for row in run_cli("ls", "--array", array["array_id"], "--json").json()}
    assert states == {"cancelled"}

    # Several ids: it goes on past one it cannot cancel and ends with that error's exit code.
    first = submitted_id(run_cli("submit", "--gpus", "1", "--", "python", "a.py").stdout)
    second = submitted_id(run_cli("submit", "--gpus", "1", "--", "python", "b.py").stdout)
    ran = run_cli("cancel", str(first), "999999", str(second))
    assert ran.exit_code == 4
    assert "[not_found]: job 999999: No job with id 999999" in ran.stderr
    assert Job.objects.filter(pk__in=[first, second], state=JobState.CANCELLED).count() == 2
    again = run_cli("cancel", str(first), "--json")
    assert again.exit_code == 5 and again.json()[0]["code"] == "job_finished"


def test_a_running_job_in_ls_top_and_quota(pool, run_cli):
    tenant = Tenant.objects.get(slug="team-a")
    quota_set(
        actor=SystemAdminFactory(username="quota-admin"),
        tenant=tenant,
        flavor=ResourceFlavor.objects.get(name="sim-80g"),
        values={"guaranteed_millis": 1000, "limit_millis": 3000},
    )
    job_id = submitted_id(run_cli("submit", "--gpus", "2", "--name", "resnet", "--", "python", "train.py").stdout)
    place_and_start(job_id, pool.node)

    row = next(line for line in run_cli("ls").stdout.splitlines() if line.split()[:1] == [str(job_id)])
    assert "running" in row and "gpu-node-1" in row
    assert row.split()[-1].count(":") == 1  # elapsed, M:SS

    cards = [line for line in run_cli("top", "--once").stdout.splitlines() if line.startswith("gpu-node-1")]
    assert [("100%" in line, f"{job_id}:team-a" in line) for line in cards] == [(True, True)] * 2 + [(False, False)] * 2

    rows = run_cli("quota", "--json").json()
    assert [(r["tenant"], r["flavor"], r["guaranteed"], r["in_use"], r["borrowed"], r["limit"]) for r in rows] == [
        ("team-a", "sim-80g", 1000, 2000, 1000, 3000)
    ]
    line = next(line for line in run_cli("quota").stdout.splitlines() if line.startswith("team-a"))
    columns = line.split()
    assert columns[:5] == ["team-a", "sim-80g", "1", "2", "1"] and columns[-2:] == ["3", "1"]  # limit 3, 1 job


def test_error_answers_have_their_code_and_a_distinct_exit_code(pool, run_cli):
    missing = run_cli("show", "999999")
    assert missing.exit_code == 4 and "[not_found]: No job with id 999999" in missing.stderr
    bad_token = run_cli("ls", token="gp_nope_nope")
    assert bad_token.exit_code == 3 and "[token_invalid]: Unknown API token." in bad_token.stderr
    bad_spec = run_cli("submit", "--gpus", "1", "--flavor", "no-such-card", "--", "python", "x.py")
    assert bad_spec.exit_code == 5 and "[invalid_job_spec]" in bad_spec.stderr and "known flavors" in bad_spec.stderr
    as_json = run_cli("show", "999999", "--json")
    assert json.loads(as_json.stderr) == {
        "code": "not_found",
        "detail": "No job with id 999999 is visible to you.",
        "message": {"code": "scheduler.no_job_id_visible_you", "params": {"pk": "999999"}},  # for programs
        "status": 404,
    }
    usage = run_cli("submit", "--gpus", "1", "--fraction", "0.5", "--", "python", "x.py")
    assert usage.exit_code == 2 and "exclude each other" in usage.stderr
    unreachable = run_cli("--retries", "0", "ls", env={"GPUPOOL_URL": "http://127.0.0.1:9"})
    assert unreachable.exit_code == 7 and "cannot reach http://127.0.0.1:9" in unreachable.stderr
    members_may_not = run_cli("whatif", "--set", "preemption=false")
    assert members_may_not.exit_code == 3 and "[permission_denied]" in members_may_not.stderr


def test_nodes_and_the_installed_console_script(pool, run_cli):
    rows = run_cli("nodes", "--json").json()
    assert [(row["name"], row["device_count"]) for row in rows] == [("gpu-node-1", 4)]
    assert run_cli("nodes").stdout.splitlines()[-1].split()[:3] == ["gpu-node-1", "ready", "4"]

    # The entry point itself (a separate process): JSON on stdout, the exit code of an API error.
    env = {**os.environ, **pool.env()}
    gpupool_cli = os.path.join(os.path.dirname(sys.executable), "gpupool-cli")
    listed = subprocess.run([gpupool_cli, "ls", "--all", "--json"], env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    missing = subprocess.run([gpupool_cli, "cancel", "424242"], env=env, capture_output=True, text=True)
    assert missing.returncode == 4 and "not_found" in missing.stderr


def test_top_shows_each_cards_live_utilisation_and_memory(pool, run_cli, monkeypatch):
    from scheduler.fleet import telemetry

    store = telemetry.MemoryLatestStore()
    monkeypatch.setattr(telemetry, "latest_store", lambda: store)
    first = pool.node.devices.order_by("index").first()
    store.put(pool.node.pk, {first.uuid: {"utilization_pct": 87.0, "memory_used_mib": 6144}})

    ran = run_cli("top", "--once", token=pool.admin_token)
    assert ran.exit_code == 0, ran.stderr
    row = next(line for line in ran.stdout.splitlines() if line.startswith("gpu-node-1") and " 0 " in f" {line} ")
    assert "87%" in row and "6.0 GiB" in row
