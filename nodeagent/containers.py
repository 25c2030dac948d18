"""Jobs that name an OCI image, run by the node's podman or docker with the same uid, limits and devices.

A node advertises a runtime in its hello labels (``gpupool.io/oci: "true"``, ``gpupool.io/oci-runtime``); the
portal gives image jobs a node selector on that label, so a node without a runtime never gets one (the job's
pending reason names the selector). The container gets what the sandbox would give the plain command: the
tenant's uid and gid, the job's CPU, memory and pids limits, only its own GPU device nodes, its job dir (and
checkpoint dir) mounted at the same paths, no capabilities and ``no-new-privileges``. The job's environment goes
in an env file in the agent's control dir, never into the runtime client's own environment.

Not covered (the runtime owns the container): a re-adopted container after an agent restart is reported
``lost`` when it ends (its exit code is the client's), and an OOM kill is reported as the exit code 137.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nodeagent.cgroups import Limits

RUNTIMES = ("podman", "docker")
OCI_LABEL = "gpupool.io/oci"
OCI_RUNTIME_LABEL = "gpupool.io/oci-runtime"
#: Device nodes every CUDA process needs besides its cards' own.
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def find_runtime() -> str | None:
    """The first container runtime on PATH (podman preferred: daemonless, no root socket), or None."""
    for name in RUNTIMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def runtime_labels(runtime: str | None) -> dict[str, str]:
    if runtime is None:
        return {OCI_LABEL: "false"}
    return {OCI_LABEL: "true", OCI_RUNTIME_LABEL: Path(runtime).name}


def write_env_file(path: Path, env: dict[str, str]) -> None:
    """``KEY=value`` lines, mode 0600 (the runtimes read one variable per line; a value cannot hold a newline)."""
    lines = []
    for key, value in env.items():
        if "\n" in value:
            raise ValueError(f"environment variable {key!r} has a newline, which a container env file cannot hold")
        lines.append(f"{key}={value}\n")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.writelines(lines)


def container_argv(
    *,
    runtime: str,
    name: str,
    image: str,
    command: list[str],
    env_file: Path,
    uid: int,
    gid: int,
    working_dir: Path,
    mounts: list[Path],
    limits: Limits,
    device_nodes: list[str],
) -> list[str]:
    """The ``<runtime> run`` command line of one workload."""
    argv = [runtime, "run", "--rm", "--name", name, "--init", "--user", f"{uid}:{gid}"]
    argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--network", "host"]
    argv += ["--env-file", str(env_file), "--workdir", str(working_dir)]
    for path in mounts:
        argv += ["--volume", f"{path}:{path}:rw"]
    if limits.cpu_cores is not None:
        argv += ["--cpus", f"{limits.cpu_cores:g}"]
    if limits.memory_mib is not None:
        # Swap equal to memory: no swap on top of the limit.
        argv += ["--memory", f"{limits.memory_mib}m", "--memory-swap", f"{limits.memory_mib}m"]
    if limits.pids_max is not None:
        argv += ["--pids-limit", str(limits.pids_max)]
    for node in device_nodes:
        argv += ["--device", node]
    return [*argv, image, *command]


def device_nodes(*, assigned: set[int], npu: bool = False) -> list[str]:
    """The device nodes a container needs for its cards (present ones only)."""
    pattern = "/dev/davinci{index}" if npu else "/dev/nvidia{index}"
    nodes = [pattern.format(index=index) for index in sorted(assigned)]
    if not npu:
        nodes += list(NVIDIA_CONTROL_NODES)
    return [node for node in nodes if os.path.exists(node)]
