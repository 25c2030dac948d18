"""CPU, host-memory and pids limits for one workload: a cgroup per workload, v1 or v2, detected at start.

The agent makes its workloads' cgroups below its *own* cgroup (what ``/proc/self/cgroup`` says), so a node whose
agent runs in a systemd unit (``Delegate=yes``) or a container keeps every workload inside the agent's budget,
and nothing outside that subtree is touched.

- **cgroup v2** (``/sys/fs/cgroup/cgroup.controllers`` exists): a cgroup that holds processes cannot hand
  controllers to its children ("no internal processes"), so the agent's processes move into a leaf
  ``<own>/agent`` and workloads get ``<own>/workloads/<name>``. Limits: ``cpu.max``, ``memory.max`` with
  ``memory.swap.max = 0`` and ``memory.oom.group = 1`` (an OOM kill ends the whole workload), ``pids.max``; an
  OOM kill shows in ``memory.events`` (``oom_kill``); ``cgroup.kill`` ends everything in it.
- **cgroup v1** (a hierarchy per controller, ``/sys/fs/cgroup/<controller>``): ``<controller mount>/<own>/gpupool/
  <name>`` in the ``cpu``, ``memory`` and ``pids`` hierarchies. Limits: ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us``, ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap accounting
  is on, so the limit cannot be dodged into swap), ``pids.max``; an OOM kill shows in ``memory.oom_control``
  (``oom_kill``, kernel 4.13+) or, failing that, ``memory.failcnt`` together with a SIGKILL.

The workload joins its cgroups itself (the sandbox's init writes its pid into each ``cgroup.procs`` before it
forks the command), so not one instruction of the command runs unconfined.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_MOUNT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("cpu", "memory", "pids")


class CgroupError(RuntimeError):
    """A workload cgroup cannot be made or limited; the workload must not run unconfined."""


@dataclass(frozen=True)
class Limits:
    """What one workload may use; None means no limit (the spec's 0)."""

    cpu_cores: float | None = None
    memory_mib: int | None = None
    pids_max: int | None = None


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from exc


def _read_counters(path: Path) -> dict[str, int]:
    counters: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                counters[key] = int(value)
    return counters


def _own_cgroups(proc_cgroup: Path = Path("/proc/self/cgroup")) -> dict[str, str]:
    """Controller (or ``""`` for the v2 hierarchy) → this process's cgroup path, from ``/proc/self/cgroup``."""
    own: dict[str, str] = {}
    for line in proc_cgroup.read_text().splitlines():
        _hierarchy, controllers, path = line.split(":", 2)
        if not controllers:
            own[""] = path
        for controller in controllers.split(","):
            if controller:
                own[controller] = path
    return own


class Cgroups:
    """One version's way of making, limiting, watching and removing workload cgroups."""

    version: int = 0

    def create(self, name: str, limits: Limits) -> list[str]:
        """Make the workload's cgroups with ``limits``; returns the ``cgroup.procs`` files its init joins."""
        raise NotImplementedError

    def oom_killed(self, name: str) -> bool:
        raise NotImplementedError

    def pids(self, name: str) -> list[int]:
        raise NotImplementedError

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        """Signal every process in the workload's cgroup (those that left its process group too)."""
        for pid in self.pids(name):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def remove(self, name: str) -> None:
        raise NotImplementedError


class CgroupsV2(Cgroups):
    version = 2

    def __init__(self, *, mount: Path = CGROUP_MOUNT, own_path: str | None = None) -> None:
        self.mount = mount
        own = own_path if own_path is not None else _own_cgroups().get("", "/")
        self.root = mount / own.lstrip("/")
        self.workloads = self.root / "workloads"
        self._ready = False

    def _setup(self) -> None:
        """Move the agent into a leaf and hand cpu, memory and pids to the workloads' parent (once)."""
        if self._ready:
            return
        available = set((self.root / "cgroup.controllers").read_text().split())
        missing = {"cpu", "memory", "pids"} - available
        if missing:
            raise CgroupError(
                f"cgroup v2: {self.root} does not offer the {', '.join(sorted(missing))} controller(s); run the "
                "agent in a cgroup with them delegated (systemd: Delegate=yes in the unit)"
            )
        procs = self.root / "cgroup.procs"
        if self.root != self.mount and procs.read_text().split():
            leaf = self.root / "agent"
            leaf.mkdir(exist_ok=True)
            for pid in procs.read_text().split():
                with contextlib.suppress(OSError):  # a process that exited meanwhile
                    (leaf / "cgroup.procs").write_text(pid)
        _write(self.root / "cgroup.subtree_control", "+cpu +memory +pids")
        self.workloads.mkdir(exist_ok=True)
        _write(self.workloads / "cgroup.subtree_control", "+cpu +memory +pids")
        self._ready = True

    def create(self, name: str, limits: Limits) -> list[str]:
        self._setup()
        group = self.workloads / name
        try:
            group.mkdir(exist_ok=True)
        except OSError as exc:
            raise CgroupError(f"cannot make the cgroup {group}: {exc.strerror or exc}") from exc
        quota = "max" if limits.cpu_cores is None else str(max(1000, round(limits.cpu_cores * CPU_PERIOD_US)))
        _write(group / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        _write(group / "memory.max", "max" if limits.memory_mib is None else str(limits.memory_mib * 1024 * 1024))
        if (group / "memory.swap.max").exists():
            _write(group / "memory.swap.max", "0" if limits.memory_mib is not None else "max")
        if (group / "memory.oom.group").exists():
            _write(group / "memory.oom.group", "1")
        _write(group / "pids.max", "max" if limits.pids_max is None else str(limits.pids_max))
        return [str(group / "cgroup.procs")]

    def oom_killed(self, name: str) -> bool:
        events = _read_counters(self.workloads / name / "memory.events")
        return events.get("oom_kill", 0) > 0 or events.get("oom_group_kill", 0) > 0

    def pids(self, name: str) -> list[int]:
        try:
            return [int(pid) for pid in (self.workloads / name / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        kill_file = self.workloads / name / "cgroup.kill"
        if signum == signal.SIGKILL and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
                return
        super().kill(name, signum)

    def remove(self, name: str) -> None:
        with contextlib.suppress(OSError):
            (self.workloads / name).rmdir()


class CgroupsV1(Cgroups):
    version = 1

    def __init__(self, *, mounts: dict[str, Path] | None = None, own: dict[str, str] | None = None) -> None:
        mounts = mounts if mounts is not None else _v1_mounts()
        own = own if own is not None else _own_cgroups()
        missing = [controller for controller in V1_CONTROLLERS if controller not in mounts]
        if missing:
            raise CgroupError(f"cgroup v1: no hierarchy for {', '.join(missing)} is mounted under {CGROUP_MOUNT}")
        self.bases = {
            controller: mounts[controller] / own.get(controller, "/").lstrip("/") / "gpupool"
            for controller in V1_CONTROLLERS
        }

    def _group(self, controller: str, name: str) -> Path:
        return self.bases[controller] / name

    def create(self, name: str, limits: Limits) -> list[str]:
        groups = {}
        for controller in V1_CONTROLLERS:
            group = self._group(controller, name)
            try:
                group.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CgroupError(f"cannot make the cgroup {group}: {exc.strerror or exc}") from exc
            groups[controller] = group
        cpu = groups["cpu"]
        _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        quota = -1 if limits.cpu_cores is None else max(1000, round(limits.cpu_cores * CPU_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(quota))
        memory = groups["memory"]
        limit = "-1" if limits.memory_mib is None else str(limits.memory_mib * 1024 * 1024)
        swap_limit = memory / "memory.memsw.limit_in_bytes"
        if limit == "-1" and swap_limit.exists():
            _write(swap_limit, "-1")  # memsw must be raised before memory (memsw >= memory always)
        _write(memory / "memory.limit_in_bytes", limit)
        if limit != "-1" and swap_limit.exists():
            _write(swap_limit, limit)
        _write(groups["pids"] / "pids.max", "max" if limits.pids_max is None else str(limits.pids_max))
        return [str(group / "cgroup.procs") for group in groups.values()]

    def oom_killed(self, name: str) -> bool:
        memory = self._group("memory", name)
        control = _read_counters(memory / "memory.oom_control")
        if "oom_kill" in control:
            return control["oom_kill"] > 0
        # Kernels before 4.13 do not count kills; a limit that was hit is the best evidence left.
        return _failcnt(memory) > 0

    def pids(self, name: str) -> list[int]:
        found: set[int] = set()
        for controller in V1_CONTROLLERS:
            with contextlib.suppress(OSError):
                found.update(int(pid) for pid in (self._group(controller, name) / "cgroup.procs").read_text().split())
        return sorted(found)

    def remove(self, name: str) -> None:
        for controller in V1_CONTROLLERS:
            with contextlib.suppress(OSError):
                self._group(controller, name).rmdir()


def _failcnt(memory: Path) -> int:
    try:
        return int((memory / "memory.failcnt").read_text().strip())
    except (OSError, ValueError):
        return 0


def _v1_mounts(mounts_file: Path = Path("/proc/self/mounts")) -> dict[str, Path]:
    """Controller → mount point of its v1 hierarchy (``cpu`` and ``cpuacct`` may share one)."""
    found: dict[str, Path] = {}
    for line in mounts_file.read_text().splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] != "cgroup":
            continue
        for option in fields[3].split(","):
            if option in V1_CONTROLLERS and option not in found:
                found[option] = Path(fields[1])
    return found


def detect(*, mount: Path = CGROUP_MOUNT) -> Cgroups:
    """The node's cgroup flavour: v2 when the unified hierarchy is mounted at ``mount`` itself, else v1.

    A hybrid host (v1 controllers, an empty v2 tree at ``/sys/fs/cgroup/unified``) is v1: the controllers
    are where they are bound. Raises :class:`CgroupError` saying what is missing.
    """
    if (mount / "cgroup.controllers").exists():
        return CgroupsV2(mount=mount)
    if not mount.is_dir():
        raise CgroupError(f"no cgroup file system at {mount}")
    return CgroupsV1()
