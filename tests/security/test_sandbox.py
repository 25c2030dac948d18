"""A hostile job against the agent's sandbox, with real processes (CI runs as root; skipped elsewhere).

Each test starts real workloads through ``WorkloadRunner`` with the real ``Sandbox`` (namespaces mode: the
tenant's uid, mount/PID/IPC namespaces, cgroups) and has the job try one thing it must not do: read the agent's
credential or state, read another job's log, signal another job's process, write outside its directory, use more
memory or processes than its limits, set a denied environment variable. Each attempt fails, and the workload is
reported as what really happened (``succeeded`` when the job merely failed to peek, ``failed`` with reason
``oom_killed`` when the kernel killed it, ``failed`` naming the variable when the agent refused to start it).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from nodeagent import protocol
from nodeagent.cgroups import detect
from nodeagent.launcher import WorkloadRejected
from nodeagent.sandbox import Sandbox, SandboxConfig, SandboxMode, hidden_device_nodes
from nodeagent.workloads import WorkloadRunner
from tests.nodeagent.sandboxing import SANDBOX_AVAILABLE, WORKLOAD_PYTHON

pytestmark = pytest.mark.skipif(not SANDBOX_AVAILABLE, reason="the sandbox needs root and util-linux unshare")

SECRET = "gpn_agent-credential-do-not-leak"


@pytest.fixture
def node(tmp_path: Path) -> dict:
    credential = tmp_path / "etc" / "agent.json"
    credential.parent.mkdir()
    credential.write_text(json.dumps({"credential": SECRET}))
    credential.chmod(0o600)
    work_dir = tmp_path / "work"
    sandbox = Sandbox(
        SandboxConfig(hidden_files=(str(credential),), pids_max=64),
        work_dir=work_dir,
    )
    assert sandbox.problem is None, sandbox.problem
    runner = WorkloadRunner(work_dir=work_dir, sandbox=sandbox)
    yield {"runner": runner, "credential": credential, "work_dir": runner.work_dir, "tmp": tmp_path}
    runner.close(stop_workloads=True, grace_s=2)


def start(runner: WorkloadRunner, job_id: int, script: str, *, tenant_id: int = 1, **fields) -> None:
    runner.start(
        protocol.WorkloadStart(
            command_id=1000 + job_id,
            job_id=job_id,
            replica=0,
            command=["/bin/sh", "-c", script],
            tenant_id=tenant_id,
            **fields,
        )
    )


def finish(runner: WorkloadRunner, job_id: int, timeout_s: float = 20) -> protocol.WorkloadStatus:
    deadline = time.monotonic() + timeout_s
    while runner.records[(job_id, 0)].active:
        assert time.monotonic() < deadline, f"job {job_id} did not finish"
        runner.poll()
        time.sleep(0.02)
    return runner.status_of(runner.records[(job_id, 0)])


def output(runner: WorkloadRunner, job_id: int) -> str:
    return (Path(runner.records[(job_id, 0)].job_dir) / "output.log").read_text()


def test_a_job_runs_as_its_tenants_unprivileged_uid_in_its_own_pid_namespace(node) -> None:
    runner = node["runner"]
    start(runner, 1, "id -u; id -g; id -G; echo pid=$$; ls /proc | grep -c '^[0-9]'", tenant_id=7)
    status = finish(runner, 1)
    uid, gid, groups, pid, processes = output(runner, 1).split()
    assert status.state == "succeeded"
    assert int(uid) == int(gid) == int(groups) == 200_007 != os.getuid()
    assert pid == "pid=2" or int(pid.split("=")[1]) < 10  # its own PID namespace: its init is 1
    assert int(processes) < 6  # the agent's and other jobs' processes do not exist here


def test_a_job_gets_default_sigpipe_so_a_pipe_to_head_ends_quietly(node) -> None:
    # Python ignores SIGPIPE and SIGXFSZ and an ignored signal survives exec: a job inherited both from the
    # sandbox's init, so ``yes | head`` wrote "Broken pipe" errors instead of ending as it does outside.
    runner = node["runner"]
    start(runner, 1, "grep SigIgn /proc/self/status; yes | head -n 1")
    status = finish(runner, 1)
    log = output(runner, 1)
    ignored = int(log.split()[1], 16)
    assert status.state == "succeeded"
    assert not ignored & (1 << (13 - 1)) and not ignored & (1 << (25 - 1))  # SIGPIPE 13, SIGXFSZ 25
    assert "Broken pipe" not in log and log.splitlines()[1] == "y"


def test_a_job_cannot_read_the_agent_credential_state_or_outbox(node) -> None:
    runner, credential, work_dir = node["runner"], node["credential"], node["work_dir"]
    start(runner, 1, "sleep 0.1")  # something in the outbox and state.json
    finish(runner, 1)
    start(
        runner,
        2,
        f"cat {credential}; cat {work_dir}/state.json; cat {work_dir}/outbox.jsonl; ls {work_dir}; "
        f"cat {work_dir}/control/*/spec*; grep -r gpn_ / --include=*.json 2>/dev/null | head -3; echo done",
    )
    status = finish(runner, 2)
    log = output(runner, 2)
    assert status.state == "succeeded" and "done" in log
    assert SECRET not in log and '"workloads"' not in log and '"report"' not in log
    assert credential.read_text().count(SECRET) == 1  # still there for the agent


def test_a_job_cannot_read_another_jobs_log(node) -> None:
    runner, work_dir = node["runner"], node["work_dir"]
    start(runner, 1, "echo secret-of-job-1", tenant_id=1)
    finish(runner, 1)
    start(runner, 2, f"ls {work_dir}/jobs; cat ../1-0/output.log {work_dir}/jobs/1-0/output.log", tenant_id=2)
    status = finish(runner, 2)
    assert "secret-of-job-1" not in output(runner, 2)
    assert status.state == "failed" and status.exit_code == 1  # cat failed: honestly reported as the job's exit
    assert "secret-of-job-1" in output(runner, 1)  # the log is intact, readable by the agent (and the API)


def test_a_job_cannot_signal_another_jobs_process(node) -> None:
    runner = node["runner"]
    start(runner, 1, "sleep 30", tenant_id=1)
    victim = runner.records[(1, 0)]
    deadline = time.monotonic() + 5
    while len(runner.sandbox.alive_pids(victim.cgroup)) < 2:  # its init and the sleep
        assert time.monotonic() < deadline
        time.sleep(0.02)
    host_pids = runner.sandbox.alive_pids(victim.cgroup)
    kills = " ".join(f"kill -9 {pid} 2>&1; kill -9 -{pid} 2>&1;" for pid in host_pids)
    start(runner, 2, f"{kills} kill -9 -1 2>&1; echo tried", tenant_id=1)  # same tenant: still another job
    status = finish(runner, 2)
    assert status.state == "succeeded" and "tried" in output(runner, 2)
    runner.poll()
    assert victim.state == "running"
    assert all(os.path.exists(f"/proc/{pid}") for pid in host_pids)


def test_a_job_cannot_write_outside_its_directory(node) -> None:
    runner, tmp = node["runner"], node["tmp"]
    outside = tmp / "outside"
    outside.mkdir()
    start(
        runner,
        1,
        f"touch /etc/gpupool-pwned 2>&1; touch {outside}/pwned 2>&1; touch {node['work_dir']}/state.json 2>&1; "
        f"echo x > /tmp/private && cat /tmp/private; touch mine && echo wrote-own",
    )
    status = finish(runner, 1)
    log = output(runner, 1)
    assert status.state == "succeeded" and "wrote-own" in log and "Read-only file system" in log
    assert not Path("/etc/gpupool-pwned").exists() and not (outside / "pwned").exists()
    assert (Path(runner.records[(1, 0)].job_dir) / "mine").exists()
    assert not Path("/tmp/private").exists()  # its /tmp was its own


def test_a_job_over_its_memory_limit_is_reported_failed_oom_killed(node) -> None:
    runner = node["runner"]
    start(
        runner,
        1,
        f"{WORKLOAD_PYTHON} -c 'chunks = [bytearray(16 << 20) for _ in range(64)]; print(\"survived\")'",
        host_memory_mib=64,
    )
    status = finish(runner, 1)
    assert (status.state, status.reason) == ("failed", "oom_killed")
    assert "out of memory" in status.message
    assert "survived" not in output(runner, 1)


def test_a_job_cannot_fork_past_its_pids_limit(node) -> None:
    runner = node["runner"]
    script = (
        "import os, time\n"
        "children = 0\n"
        "try:\n"
        "    for _ in range(500):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(3); os._exit(0)\n"
        "        children += 1\n"
        "except OSError as exc:\n"
        "    print('refused after', children, exc.strerror, flush=True)\n"
    )
    start(runner, 1, f'{WORKLOAD_PYTHON} -c "$SCRIPT"', env={"SCRIPT": script})
    status = finish(runner, 1)
    log = output(runner, 1)
    assert "refused after" in log, log
    assert int(log.split("refused after")[1].split()[0]) < 64
    assert status.state == "succeeded"


def test_the_cpu_limit_of_the_spec_is_set_on_the_jobs_cgroup(node) -> None:
    runner = node["runner"]
    start(runner, 1, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null; sleep 0.3", cpu_cores=0.5)
    record = runner.records[(1, 0)]
    cgroups = detect()
    if cgroups.version == 1:
        quota = Path(cgroups.bases["cpu"] / record.cgroup / "cpu.cfs_quota_us").read_text().strip()
        assert quota == "50000"
    else:
        assert (cgroups.workloads / record.cgroup / "cpu.max").read_text().split()[0] == "50000"
    assert finish(runner, 1).state == "succeeded"


def test_a_denied_env_variable_is_refused_by_the_agent_and_reported(node) -> None:
    runner = node["runner"]
    with pytest.raises(WorkloadRejected, match="LD_PRELOAD"):
        start(runner, 1, "echo ran", env={"LD_PRELOAD": "/tmp/evil.so"})
    status = runner.status_of(runner.records[(1, 0)])
    assert (status.state, status.reason) == ("failed", "rejected")
    assert "LD_PRELOAD" in status.message and runner.records[(1, 0)].pid is None


def test_a_sandbox_that_cannot_be_set_up_fails_the_workload_and_never_runs_it(node, tmp_path) -> None:
    runner = node["runner"]
    marker = tmp_path / "ran"
    with pytest.raises(WorkloadRejected, match="no uid in the sandbox range"):
        start(runner, 1, f"touch {marker}", tenant_id=10**6)
    status = runner.status_of(runner.records[(1, 0)])
    assert (status.state, status.reason) == ("failed", "sandbox_failed")
    # An agent that is not root (or lacks unshare) refuses every workload the same way: never unconfined.
    broken = WorkloadRunner(
        work_dir=tmp_path / "broken",
        sandbox=Sandbox(SandboxConfig(unshare="/nonexistent/unshare"), work_dir=tmp_path / "broken"),
    )
    with pytest.raises(WorkloadRejected, match="unshare"):
        start(broken, 1, f"touch {marker}")
    assert broken.status_of(broken.records[(1, 0)]).reason == "sandbox_failed"
    assert not marker.exists()


def test_a_mount_that_fails_inside_the_sandbox_fails_the_workload(tmp_path) -> None:
    work_dir = tmp_path / "work"
    # Hiding a directory that cannot be made (procfs refuses mkdir) fails inside the init, before the command.
    sandbox = Sandbox(SandboxConfig(hidden_dirs=("/proc/self/no-such-dir",)), work_dir=work_dir)
    runner = WorkloadRunner(work_dir=work_dir, sandbox=sandbox)
    start(runner, 1, f"touch {tmp_path}/ran")
    status = finish(runner, 1)
    assert (status.state, status.reason) == ("failed", "sandbox_failed")
    assert "could not be set up" in status.message
    assert not (tmp_path / "ran").exists()


def test_sandbox_none_is_the_development_mode_and_says_so(tmp_path) -> None:
    sandbox = Sandbox(SandboxConfig(mode=SandboxMode.NONE), work_dir=tmp_path)
    runner = WorkloadRunner(work_dir=tmp_path, sandbox=sandbox)
    assert runner.sandbox_mode == "none" and "unconfined" in sandbox.describe()
    start(runner, 1, "id -u")
    finish(runner, 1)
    assert output(runner, 1).strip() == str(os.getuid())


def test_only_the_jobs_own_gpu_device_nodes_would_stay_visible(monkeypatch) -> None:
    present = {f"/dev/nvidia{i}" for i in range(4)}
    monkeypatch.setattr("nodeagent.sandbox.os.path.exists", lambda path: path in present)
    assert hidden_device_nodes(assigned={1, 2}, indices=[0, 1, 2, 3]) == ["/dev/nvidia0", "/dev/nvidia3"]
    assert hidden_device_nodes(assigned={0}, indices=[0, 1, 7]) == ["/dev/nvidia1"]  # nvidia7 absent


def test_a_job_stopped_by_the_portal_gets_sigterm_through_the_sandbox_init(node) -> None:
    runner = node["runner"]
    start(runner, 1, "trap 'echo got-term; exit 0' TERM; sleep 30 & wait")
    time.sleep(0.5)
    runner.stop(protocol.WorkloadStop(command_id=9, job_id=1, replica=0, grace_s=5))
    status = finish(runner, 1)
    assert status.state == "stopped" and "got-term" in output(runner, 1)
    assert not runner.sandbox.alive_pids(runner.records[(1, 0)].cgroup)


def test_sigkill_ends_every_process_of_the_workload(node) -> None:
    runner = node["runner"]
    # A process that leaves the process group and ignores SIGTERM is still ended: SIGKILL goes to the cgroup.
    start(runner, 1, "trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep 60' & sleep 60")
    time.sleep(0.5)
    record = runner.records[(1, 0)]
    runner.stop(protocol.WorkloadStop(command_id=9, job_id=1, replica=0, grace_s=0.2))
    time.sleep(0.3)
    status = finish(runner, 1)
    assert status.state == "stopped"
    assert not runner.sandbox.alive_pids(record.cgroup)


def test_a_job_cannot_forge_its_exit_code_and_a_restarted_agent_still_reads_the_real_one(node) -> None:
    runner, work_dir = node["runner"], node["work_dir"]
    # The unconfined wrapper's exit_code file lives in the job dir; the sandbox's lives in the hidden control dir.
    start(runner, 1, "printf 0 > exit_code; sleep 1; exit 3")
    runner.close()  # the agent dies; the workload goes on
    restarted = WorkloadRunner(work_dir=work_dir, sandbox=Sandbox(runner.sandbox.config, work_dir=work_dir))
    assert restarted.records[(1, 0)].active  # re-adopted
    status = finish(restarted, 1)
    assert (status.state, status.exit_code) == ("failed", 3)


def test_its_working_dir_and_checkpoint_dirs_are_its_own_and_writable(node) -> None:
    runner, tmp = node["runner"], node["tmp"]
    shared = tmp / "shared" / "ckpt-7"
    start(
        runner, 1, 'touch here && touch "$GPUPOOL_CHECKPOINT_DIR/step"', working_dir="src\\train", checkpoint_dir="ck"
    )
    start(runner, 2, 'touch "$GPUPOOL_CHECKPOINT_DIR/step" && echo ok', checkpoint_dir=str(shared), tenant_id=7)
    assert finish(runner, 1).state == "succeeded", output(runner, 1)
    job_dir = Path(runner.records[(1, 0)].job_dir)
    assert (job_dir / "src" / "train" / "here").exists() and (job_dir / "ck" / "step").exists()
    status = finish(runner, 2)
    assert status.state == "succeeded" and (shared / "step").exists()
    assert shared.stat().st_uid == 200_007
    # Another tenant's job may not be handed that directory.
    with pytest.raises(WorkloadRejected, match="belongs to uid 200007"):
        start(runner, 3, "true", checkpoint_dir=str(shared), tenant_id=8)


def test_a_node_whose_sandbox_cannot_work_says_so_in_its_hello(tmp_path) -> None:
    broken = WorkloadRunner(
        work_dir=tmp_path, sandbox=Sandbox(SandboxConfig(unshare="/nonexistent/unshare"), work_dir=tmp_path)
    )
    assert broken.sandbox_mode == "unavailable"
    assert "UNAVAILABLE" in broken.sandbox.describe()


def test_two_agents_on_one_host_never_share_a_workloads_cgroup(node, tmp_path) -> None:
    # The demo and the resilience tests run several agents on one machine; the same job id on two of them (a
    # requeued job's stale copy and its new run) must not share a cgroup, or one's cleanup kills the other.
    first = node["runner"]
    second = WorkloadRunner(
        work_dir=tmp_path / "second", sandbox=Sandbox(SandboxConfig(pids_max=64), work_dir=tmp_path / "second")
    )
    start(first, 1, "sleep 30")
    start(second, 1, "sleep 0.2")
    assert first.records[(1, 0)].cgroup != second.records[(1, 0)].cgroup
    assert finish(second, 1).state == "succeeded"
    first.poll()
    assert first.records[(1, 0)].state == "running"
    second.close(stop_workloads=True)
