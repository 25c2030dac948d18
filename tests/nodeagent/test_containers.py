"""Jobs that name an OCI image: the runtime's command line carries the sandbox's uid, limits and devices; a node
without a runtime refuses them (and says so in its labels). No container runtime is installed on CI: a fake
``podman`` that records its arguments stands in, and the test with a real one is skipped where none exists."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

import pytest

from nodeagent import protocol
from nodeagent.cgroups import Limits
from nodeagent.containers import OCI_LABEL, container_argv, find_runtime, runtime_labels
from nodeagent.launcher import WorkloadRejected
from nodeagent.workloads import WorkloadRunner


def test_the_runtime_command_line_has_the_uid_limits_mounts_and_devices(tmp_path: Path) -> None:
    argv = container_argv(
        runtime="/usr/bin/podman",
        name="gpupool-x-job-1-0",
        image="docker.io/library/python:3.12",
        command=["python", "-c", "print(1)"],
        env_file=tmp_path / "env",
        uid=200_003,
        gid=200_003,
        working_dir=tmp_path / "jobs" / "1-0",
        mounts=[tmp_path / "jobs" / "1-0", Path("/ckpt/acme/run")],
        limits=Limits(cpu_cores=2.5, memory_mib=4096, pids_max=512),
        device_nodes=["/dev/nvidia1", "/dev/nvidiactl"],
    )
    text = " ".join(argv)
    assert argv[:3] == ["/usr/bin/podman", "run", "--rm"]
    assert "--user 200003:200003" in text and "--cap-drop ALL" in text and "no-new-privileges" in text
    assert "--cpus 2.5" in text and "--memory 4096m --memory-swap 4096m" in text and "--pids-limit 512" in text
    assert f"--volume {tmp_path}/jobs/1-0:{tmp_path}/jobs/1-0:rw" in text and "/ckpt/acme/run:/ckpt/acme/run:rw" in text
    assert "--device /dev/nvidia1 --device /dev/nvidiactl" in text
    assert argv[-4:] == ["docker.io/library/python:3.12", "python", "-c", "print(1)"]


def test_a_node_without_a_runtime_refuses_image_jobs_and_says_so_in_its_labels(tmp_path: Path) -> None:
    assert runtime_labels(None) == {OCI_LABEL: "false"}
    assert runtime_labels("/usr/bin/docker") == {OCI_LABEL: "true", "gpupool.io/oci-runtime": "docker"}
    runner = WorkloadRunner(work_dir=tmp_path, container_runtime=None)
    with pytest.raises(WorkloadRejected, match="no container runtime"):
        runner.start(protocol.WorkloadStart(command_id=1, job_id=1, replica=0, command=["true"], image="busybox"))
    assert runner.records[(1, 0)].state == "failed" and runner.records[(1, 0)].pid is None


def test_the_runner_starts_an_image_job_through_the_runtime_with_its_env_in_a_file(tmp_path: Path) -> None:
    record_file = tmp_path / "podman-args.json"
    fake = tmp_path / "podman"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "env_file = args[args.index('--env-file') + 1]\n"
        f"json.dump({{'args': args, 'env': open(env_file).read()}}, open({str(record_file)!r}, 'w'))\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    runner = WorkloadRunner(work_dir=tmp_path / "work", container_runtime=str(fake))
    runner.start(
        protocol.WorkloadStart(
            command_id=1,
            job_id=5,
            replica=0,
            command=["python", "train.py"],
            env={"EPOCHS": "3"},
            image="docker.io/pytorch/pytorch:2.3.0",
            cpu_cores=4,
            host_memory_mib=1024,
        )
    )
    deadline = time.monotonic() + 10
    while runner.records[(5, 0)].active:
        assert time.monotonic() < deadline
        runner.poll()
        time.sleep(0.02)
    assert runner.records[(5, 0)].state == "succeeded"
    seen = json.loads(record_file.read_text())
    assert seen["args"][-3:] == ["docker.io/pytorch/pytorch:2.3.0", "python", "train.py"]
    assert "--cpus" in seen["args"] and "1024m" in seen["args"]
    assert f"{os.getuid()}:{os.getgid()}" in seen["args"]  # --sandbox none: the agent's own user
    assert "EPOCHS=3\n" in seen["env"] and "GPUPOOL_JOB_ID=5\n" in seen["env"]


@pytest.mark.skipif(find_runtime() is None or shutil.which("podman") is None, reason="no podman on this machine")
def test_a_real_podman_runs_an_image_job(tmp_path: Path) -> None:  # pragma: no cover - needs a runtime
    runner = WorkloadRunner(work_dir=tmp_path, container_runtime=find_runtime())
    runner.start(
        protocol.WorkloadStart(command_id=1, job_id=1, replica=0, command=["sh", "-c", "id -u"], image="busybox")
    )
    deadline = time.monotonic() + 120
    while runner.records[(1, 0)].active:
        assert time.monotonic() < deadline
        runner.poll()
        time.sleep(0.2)
    assert runner.records[(1, 0)].state == "succeeded"
