"""When the agent runs ``nft``: the rules follow the tenants and peers of the node's workloads, and a tenant's
rules stay a while after its last workload ended, so short jobs one after another cost no ``nft`` run each."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.netpolicy import NetworkIsolation


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def nft(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in ``nft`` that records each run (its arguments, then the script it was given): (program, log)."""
    log = tmp_path / "nft.log"
    program = tmp_path / "nft"
    program.write_text(f'#!/bin/sh\necho "run $*" >> {log}\ncat >> {log}\n')
    program.chmod(0o755)
    return program, log


def _runs(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("run ")] if log.exists() else []


def test_short_jobs_of_a_tenant_one_after_another_run_nft_once_and_the_rules_go_after_the_linger(nft) -> None:
    program, log = nft
    clock = Clock()
    rules = NetworkIsolation(nft=str(program), linger_s=60.0, clock=clock)

    for _job in range(20):  # each job starts (its tenant's uid is isolated) and ends (no workload left)
        rules.sync({200001: ["10.0.0.2"]})
        clock.now += 0.5
        rules.sync({})
        clock.now += 0.5

    assert _runs(log) == ["run -f -"]  # before: 40 runs, the table made and deleted for every job
    assert "meta skuid 200001" in log.read_text()
    assert not rules.linger_over()
    clock.now += 60.0
    assert rules.linger_over()
    rules.sync({})
    assert _runs(log) == ["run -f -", "run delete table inet gpupool"]
    assert not rules.linger_over()


def test_a_lingering_tenant_whose_next_job_has_other_peers_gets_them_at_once(nft) -> None:
    program, log = nft
    clock = Clock()
    rules = NetworkIsolation(nft=str(program), clock=clock)
    rules.sync({200001: ["10.0.0.2"]})
    rules.sync({})

    rules.sync({200001: ["10.0.0.3"]})  # a two-node job on another pair of nodes: its peer must be allowed now

    script = log.read_text().split("run -f -")[-1]
    assert "10.0.0.3" in script and "10.0.0.2" not in script
    assert len(_runs(log)) == 2


def test_another_tenants_start_while_one_lingers_keeps_both_and_the_idle_one_goes_after_its_linger(nft) -> None:
    program, log = nft
    clock = Clock()
    rules = NetworkIsolation(nft=str(program), linger_s=60.0, clock=clock)
    rules.sync({200001: []})
    rules.sync({})
    clock.now += 30.0

    rules.sync({200002: []})
    assert "skuid 200001" in log.read_text().split("run -f -")[-1]  # still idle, rules kept
    clock.now += 31.0
    assert rules.linger_over()
    rules.sync({200002: []})

    last = log.read_text().split("run -f -")[-1]
    assert "skuid 200002" in last and "skuid 200001" not in last
    assert len(_runs(log)) == 3
