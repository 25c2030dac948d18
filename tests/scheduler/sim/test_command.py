"""``gpupool simulate`` and ``python -m scheduler.sim`` on the fixture traces."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management import call_command

from scheduler.sim.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
ARGS = ["--traces", str(FIXTURES), "--start", "2017-10-01", "--days", "1", "--cluster", "32"]


def test_cli_prints_a_row_per_policy_and_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([*ARGS, "--policy", "fifo,gpupool", "--out", str(out)]) == 0

    table = capsys.readouterr().out
    assert "fifo" in table and "gpupool" in table
    results = json.loads(out.read_text())["results"]
    assert [r["summary"]["policy"] for r in results] == ["fifo", "gpupool"]
    assert all(r["summary"]["finished"] == 4 for r in results)


def test_simulate_command_applies_the_deployed_policy_overrides(settings, tmp_path):
    settings.GPUPOOL_SCHEDULER_POLICY = {"grace_period_s": 5.0, "backfill": False}
    out = tmp_path / "r.json"
    call_command("simulate", "--", *ARGS, "--out", str(out))

    summary = json.loads(out.read_text())["results"][0]["summary"]
    assert summary["policy"] == "gpupool" and summary["jobs"] == 4


def test_gpupool_simulate_takes_a_trace_file_without_a_separator(tmp_path, settings):
    from portal.cli import main as gpupool
    from scheduler.sim import traceformat
    from scheduler.sim.loaders import load_philly

    settings.GPUPOOL_SCHEDULER_POLICY = {"backfill": False}
    files = traceformat.write_workload(load_philly(FIXTURES, days=1, cluster=32), tmp_path)
    out = tmp_path / "r.json"

    gpupool(
        ["simulate", "--trace-file", str(files["jobs"]), "--cluster-file", str(files["cluster"]), "--out", str(out)]
    )

    summary = json.loads(out.read_text())["results"][0]["summary"]
    assert (summary["jobs"], summary["finished"], summary["gpus"]) == (4, 4, 32)
