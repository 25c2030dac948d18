"""The agent's side of the launch contract (issue 30): the hostfile and the launchers' variables, an MPI job's
replicas, the launcher script's own checks, and the network isolation rules (in a network namespace of their
own, so the test touches none of the machine's rules)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nodeagent import protocol
from nodeagent.launcher import RSH_AGENT, WorkloadRejected
from nodeagent.netpolicy import IsolationMode, NetworkIsolation, render_ruleset
from nodeagent.workloads import WorkloadRunner
from tests.nodeagent.sandboxing import SANDBOX_AVAILABLE, WORKLOAD_PYTHON

MPI_LAUNCH = Path(__file__).resolve().parents[2] / "nodeagent" / "mpi_launch.py"


def _start(**fields) -> protocol.WorkloadStart:
    return protocol.WorkloadStart(
        command_id=fields.pop("command_id", 101),
        job_id=fields.pop("job_id", 1),
        replica=fields.pop("replica", 0),
        command=fields.pop("command", [sys.executable, "-c", "import os; print(sorted(os.environ))"]),
        **fields,
    )


def _wait_final(runner: WorkloadRunner, key=(1, 0), timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while runner.records[key].active:
        runner.poll()
        assert time.monotonic() < deadline, "the workload did not end"
        time.sleep(0.02)


def test_the_hostfile_is_written_to_the_job_dir_and_mpirun_is_pointed_at_it(tmp_path):
    runner = WorkloadRunner(work_dir=tmp_path, base_env={})
    code = (
        "import os; print(os.environ['OMPI_MCA_orte_default_hostfile']); "
        "print(open(os.environ['GPUPOOL_HOSTFILE']).read())"
    )
    runner.start(_start(command=[sys.executable, "-c", code], hostfile="10.0.0.1 slots=8\n10.0.0.2 slots=8\n"))
    _wait_final(runner)
    job_dir = tmp_path / "jobs" / "1-0"
    assert (job_dir / "output.log").read_text().splitlines() == [
        str(job_dir / "hostfile"),
        "10.0.0.1 slots=8",
        "10.0.0.2 slots=8",
        "",
    ]


def test_a_link_left_where_the_hostfile_goes_is_replaced_not_followed(tmp_path):
    runner = WorkloadRunner(work_dir=tmp_path, base_env={})
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "jobs" / "1-0").mkdir(parents=True)
    (tmp_path / "jobs" / "1-0" / "hostfile").symlink_to(victim)
    runner.start(_start(hostfile="10.0.0.1 slots=1\n"))
    _wait_final(runner)
    assert victim.read_text() == "keep"
    assert (tmp_path / "jobs" / "1-0" / "hostfile").read_text() == "10.0.0.1 slots=1\n"


def test_an_mpi_jobs_replica_0_launches_the_command_and_the_others_serve(tmp_path, monkeypatch):
    runner = WorkloadRunner(work_dir=tmp_path, base_env={})
    spawned = []
    monkeypatch.setattr(runner, "_save", lambda **_: None)
    real_popen = subprocess.Popen

    def record(argv, **kwargs):
        spawned.append((argv, kwargs["env"]))
        return real_popen(["true"], **{k: v for k, v in kwargs.items() if k != "env"})

    monkeypatch.setattr(subprocess, "Popen", record)
    runner.start(_start(replica=0, launcher="mpi", command=["mpirun", "python3", "x.py"]))
    runner.start(_start(replica=1, launcher="mpi", command=["mpirun", "python3", "x.py"]))
    (argv0, env0), (argv1, _env1) = spawned
    script = str(tmp_path / "jobs" / "1-0" / RSH_AGENT)
    assert argv0[-6:] == ["python3", script, "launch", "--", "mpirun", "python3", "x.py"][-6:]
    assert argv1[-2:] == [str(tmp_path / "jobs" / "1-1" / RSH_AGENT), "serve"]
    assert env0["OMPI_MCA_plm_rsh_agent"] == script
    assert Path(script).read_bytes() == MPI_LAUNCH.read_bytes()


def test_a_launcher_the_agent_does_not_know_is_refused(tmp_path):
    runner = WorkloadRunner(work_dir=tmp_path, base_env={})
    with pytest.raises(WorkloadRejected, match="launcher 'slurm' is not known"):
        runner.start(_start(launcher="slurm"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_launcher_servers_run_only_what_carries_the_jobs_token(tmp_path):
    launcher_port, server_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "TF_CONFIG": json.dumps({"cluster": {"worker": [f"127.0.0.1:{launcher_port}", f"127.0.0.1:{server_port}"]}}),
        "GPUPOOL_LAUNCH_TOKEN": "the-token",
        "TMPDIR": str(tmp_path),
    }
    server = subprocess.Popen(
        [sys.executable, str(MPI_LAUNCH), "serve"], env={**env, "GPUPOOL_PORT": str(server_port)}, cwd=tmp_path
    )
    # The launcher: replica 0 runs its command, which calls the server twice, with and without the token.
    call = f"{sys.executable} {MPI_LAUNCH} 127.0.0.1 echo ran-on-the-worker; echo code $?"
    forged = f"GPUPOOL_LAUNCH_TOKEN=wrong {sys.executable} {MPI_LAUNCH} 127.0.0.1 touch {tmp_path}/forged; echo code $?"
    launcher = subprocess.run(
        [sys.executable, str(MPI_LAUNCH), "launch", "--", "/bin/sh", "-c", f"{call}; {forged}"],
        env={**env, "GPUPOOL_PORT": str(launcher_port)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert launcher.returncode == 0, launcher.stderr
    assert launcher.stdout.splitlines() == ["ran-on-the-worker", "code 0", "code 255"]
    assert not (tmp_path / "forged").exists()
    assert server.wait(timeout=10) == 0  # the launcher said goodbye: the server is done


def test_the_rules_mark_each_tenants_connections_and_refuse_answers_to_another_tenant():
    script = render_ruleset(table="t", tenants={200001: ["10.0.0.2"], 200002: []}, allow_from=["192.0.2.0/24"])
    assert "meta skuid 200001 ct mark set 200001" in script
    assert "meta skuid 200001 ct mark != 0 ct mark != 200001 ct mark set 1 drop" in script
    assert "ip daddr != { 10.0.0.2, 192.0.2.0/24 } drop" in script
    assert "ct direction original ct mark 1 reject with tcp reset" in script
    with pytest.raises(ValueError, match="not an IP address"):
        NetworkIsolation(mode=IsolationMode.NFTABLES, allow_from=("proxy.example",))


ISOLATION_CHECK = textwrap.dedent(
    """
    import os, socket, subprocess, sys, time
    from nodeagent.netpolicy import NetworkIsolation
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    NetworkIsolation(table="isolation_test").sync({200001: [], 200002: []})

    def as_uid(uid, code):
        return subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.argv[1], "-c", code],
            stdout=subprocess.PIPE, text=True)

    server = as_uid(200001, "import socket, time\\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 40123)); s.listen(); print('up', flush=True)\\n"
        "while True: s.accept()[0].close()")
    assert server.stdout.readline().strip() == "up"
    probe = ("import socket\\ntry:\\n"
             " socket.create_connection(('127.0.0.1', 40123), timeout=5).close(); print('connected')\\n"
             "except OSError as e: print(type(e).__name__)")
    for uid in (200001, 200002):
        print(uid, as_uid(uid, probe).communicate()[0].strip())
    print("root", "connected" if socket.create_connection(("127.0.0.1", 40123), timeout=5) else "?")
    server.kill()
    """
)


@pytest.mark.skipif(not SANDBOX_AVAILABLE or shutil.which("nft") is None, reason="needs root, unshare and nft")
def test_in_a_network_namespace_another_tenant_is_refused_and_the_same_tenant_and_root_connect():
    result = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", ISOLATION_CHECK, WORKLOAD_PYTHON],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["200001 connected", "200002 ConnectionRefusedError", "root connected"]
