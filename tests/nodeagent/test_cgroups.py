"""The workload cgroups for both cgroup versions, against a fake cgroup file system (plain files in a tmp dir).

The real v1 hierarchy (CI's) is exercised with real processes in tests/security/test_sandbox.py; v2 cannot be
mounted there, so these tests hold its file-level protocol: the agent moves into a leaf, controllers are
delegated, the limits land in ``cpu.max`` / ``memory.max`` / ``memory.swap.max`` / ``pids.max`` with
``memory.oom.group``, an OOM kill is read from ``memory.events``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent import cgroups
from nodeagent.cgroups import CgroupError, CgroupsV1, CgroupsV2, Limits


def fake_v2(root: Path, *, own: str = "/system.slice/agent.service", procs: str = "100\n101\n") -> Path:
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    service = root / own.lstrip("/")
    service.mkdir(parents=True)
    (service / "cgroup.controllers").write_text("cpu memory pids\n")
    (service / "cgroup.procs").write_text(procs)
    (service / "cgroup.subtree_control").write_text("")
    return service


class FakeV2(CgroupsV2):
    """Plain directories do not sprout interface files on mkdir as cgroupfs does: add the ones written."""

    def create(self, name: str, limits: Limits) -> list[str]:
        self._setup()
        group = self.workloads / name
        group.mkdir(exist_ok=True)
        for file in ("memory.swap.max", "memory.oom.group"):
            (group / file).touch()
        return super().create(name, limits)


def test_v2_moves_the_agent_into_a_leaf_delegates_and_writes_the_limits(tmp_path: Path) -> None:
    service = fake_v2(tmp_path)
    (service / "agent").mkdir()
    (service / "workloads").mkdir()
    v2 = FakeV2(mount=tmp_path, own_path="/system.slice/agent.service")
    procs = v2.create("job-7-0", Limits(cpu_cores=1.5, memory_mib=512, pids_max=100))

    group = service / "workloads" / "job-7-0"
    assert procs == [str(group / "cgroup.procs")]
    assert (service / "agent" / "cgroup.procs").read_text() == "101"  # each pid written in turn (last shown)
    assert (service / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (service / "workloads" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (group / "cpu.max").read_text() == "150000 100000"
    assert (group / "memory.max").read_text() == str(512 * 1024 * 1024)
    assert (group / "memory.swap.max").read_text() == "0"
    assert (group / "memory.oom.group").read_text() == "1"
    assert (group / "pids.max").read_text() == "100"


def test_v2_no_limit_is_max_and_an_oom_kill_is_read_from_memory_events(tmp_path: Path) -> None:
    service = fake_v2(tmp_path, procs="")
    (service / "workloads").mkdir()
    v2 = FakeV2(mount=tmp_path, own_path="/system.slice/agent.service")
    v2.create("job-1-0", Limits())
    group = service / "workloads" / "job-1-0"
    assert (group / "cpu.max").read_text() == "max 100000"
    assert (group / "memory.max").read_text() == "max"
    assert (group / "pids.max").read_text() == "max"
    assert not v2.oom_killed("job-1-0")
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert v2.oom_killed("job-1-0")


def test_v2_without_delegated_controllers_says_how_to_fix_it(tmp_path: Path) -> None:
    service = fake_v2(tmp_path)
    (service / "cgroup.controllers").write_text("cpu\n")
    with pytest.raises(CgroupError, match=r"memory, pids.*Delegate=yes"):
        CgroupsV2(mount=tmp_path, own_path="/system.slice/agent.service").create("job-1-0", Limits())


def test_v1_nests_under_the_agents_own_cgroup_per_controller(tmp_path: Path) -> None:
    mounts = {name: tmp_path / name for name in ("cpu", "memory", "pids")}
    own = {"cpu": "/", "memory": "/process_api/abc", "pids": "/"}
    v1 = CgroupsV1(mounts=mounts, own=own)
    assert v1.bases["memory"] == tmp_path / "memory" / "process_api" / "abc" / "gpupool"
    assert v1.bases["cpu"] == tmp_path / "cpu" / "gpupool"
    memory = v1.bases["memory"] / "job-2-0"
    memory.mkdir(parents=True)
    (memory / "memory.memsw.limit_in_bytes").write_text("")
    v1.create("job-2-0", Limits(cpu_cores=0.25, memory_mib=64, pids_max=10))
    assert (v1.bases["cpu"] / "job-2-0" / "cpu.cfs_quota_us").read_text() == "25000"
    assert (memory / "memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(64 << 20)  # no escape into swap
    assert (v1.bases["pids"] / "job-2-0" / "pids.max").read_text() == "10"
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert v1.oom_killed("job-2-0")


def test_v1_needs_the_cpu_memory_and_pids_hierarchies(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="pids"):
        CgroupsV1(mounts={"cpu": tmp_path, "memory": tmp_path}, own={})


def test_detect_picks_v2_only_where_the_unified_hierarchy_is_the_mount_itself(tmp_path: Path) -> None:
    fake_v2(tmp_path)
    assert isinstance(cgroups.detect(mount=tmp_path), CgroupsV2)


def test_v1_mounts_are_read_from_proc_mounts(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
        "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    )
    assert cgroups._v1_mounts(mounts) == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory"),
        "pids": Path("/sys/fs/cgroup/pids"),
    }
