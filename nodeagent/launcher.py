"""Launch a workload: check what the portal asks for, make its directories, environment and sandbox, spawn it.

A workload runs in its own process group (``start_new_session``) and its own directory under the agent's work
dir, with its output in ``output.log`` there. Unconfined, a tiny ``/bin/sh`` wrapper records the command's exit
code in ``exit_code`` next to the log, so an agent that was restarted while the workload ran can still tell how it
ended; a command that is not found or not executable exits 127 or 126 from the wrapper. With a
:class:`~nodeagent.sandbox.Sandbox` in mode ``namespaces`` the workload runs in its own sandbox instead (its
tenant's uid, its own namespaces and cgroup, only its own GPU device nodes) and the sandbox's init writes its exit
code into the agent's control dir, where the workload cannot forge it.

The invariant this module keeps: nothing a job asks for reaches outside its own directory, its tenant's part of
the shared storage or a checkpoint dir the portal chose, and the agent's own environment and settings never reach
the workload (its variables come last, so a job cannot widen its own device or fraction limits). A request that
breaks it raises :class:`WorkloadRejected` with the reason, before anything runs.

A SIGTERM that arrives in the instant between the wrapper's fork and the command's exec is lost; the SIGKILL
after the grace period still ends such a workload.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

from nodeagent import protocol
from nodeagent.cgroups import Limits
from nodeagent.containers import container_argv, device_nodes, write_env_file
from nodeagent.journal import WorkloadRecord
from nodeagent.sandbox import ROOT_ENV, Sandbox, SandboxMode, ServedProcess, hidden_device_nodes, own_tree

#: The launcher script of MPI jobs (standard library only: any python3 on the node runs it as the job's uid).
MPI_LAUNCH_SCRIPT = Path(__file__).with_name("mpi_launch.py")

EXIT_CODE_FILE = "exit_code"
LOG_FILE = "output.log"

# The wrapper traps TERM/INT with a no-op: the signal reaches the whole group (the command gets it too), and
# the shell, instead of dying first, waits for the command and writes its exit code. A trap handler, unlike
# an ignored signal, is reset in the command on exec, so the command still sees SIGTERM.
_WRAPPER = (
    'trap : TERM INT; "$@"; code=$?; '
    'printf "%s" "$code" > "$GPUPOOL_EXIT_FILE.tmp" && mv "$GPUPOOL_EXIT_FILE.tmp" "$GPUPOOL_EXIT_FILE"; '
    'exit "$code"'
)


#: A POSIX environment variable name (IEEE Std 1003.1, 8.1): what ``execve`` and every shell accept.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class WorkloadRejected(ValueError):
    """The portal asked for something this agent refuses to run (the ack carries the message)."""


def env_problem(
    env: Mapping[str, str], *, denylist: tuple[str, ...] | None = protocol.DEFAULT_ENV_DENYLIST
) -> str | None:
    """Why ``env`` cannot be passed to a process (names must be POSIX names, values free of NUL, no name on the
    denylist), or None.

    The portal validates this at submit; the agent checks again because ``execve`` would fail on it, and an
    older portal (or a job created around the API) may still send it.
    """
    denied = protocol.env_denied(env, denylist) if denylist else None
    if denied is not None:
        return (
            f"environment variable {denied!r} may not be set by a job (it is on the node's denylist: "
            "LD_*, PATH and other loader and libc variables are the platform's)"
        )
    for key, value in env.items():
        if not ENV_NAME_RE.match(key):
            return (
                f"environment variable name {key!r} is not valid: use letters, digits and '_', not starting "
                "with a digit (no '=', no NUL)"
            )
        if "\0" in value:
            return f"environment variable {key!r} has a NUL character in its value"
    return None


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it does not exist or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def workload_env(
    start: protocol.WorkloadStart,
    *,
    base_env: Mapping[str, str],
    checkpoint_dir: str | None,
    device_indices: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """The environment of a workload: the agent's (without its own GPUPOOL_* settings), the job's, then ours.

    The agent's variables come last so a job cannot widen its own device or fraction limits.
    """
    env = {key: value for key, value in base_env.items() if not key.startswith("GPUPOOL_")}
    env.update(start.env)
    uuids = [device.uuid for device in start.devices]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    if device_indices and uuids and all(uuid.startswith("NPU-") for uuid in uuids):
        env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(str(device_indices[uuid]) for uuid in uuids)
    fractions = [device for device in start.devices if device.millis < 1000]
    if fractions:
        # MPS takes one thread percentage per client; the smallest share is the safe one. HAMi-core reads
        # CUDA_DEVICE_SM_LIMIT / CUDA_DEVICE_MEMORY_LIMIT(_<i>) inside the process.
        percent = max(1, min(device.millis for device in fractions) // 10)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
        env["CUDA_DEVICE_SM_LIMIT"] = str(percent)
        limits = [(i, d) for i, d in enumerate(start.devices) if d.memory_mib]  # 0/None means "no limit"
        if limits:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{d.uuid}={d.memory_mib}M" for _, d in limits)
            env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{min(d.memory_mib for _, d in limits)}m"
            for i, device in limits:
                env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.memory_mib}m"
    env["GPUPOOL_JOB_ID"] = str(start.job_id)
    env["GPUPOOL_REPLICA"] = str(start.replica)
    if checkpoint_dir:
        env["GPUPOOL_CHECKPOINT_DIR"] = checkpoint_dir
    return env


#: The job's hostfile in its job dir (``workload.start``'s ``hostfile``).
HOSTFILE = "hostfile"


def write_hostfile(job_dir: Path, text: str) -> dict[str, str]:
    """Write the job's hostfile into ``job_dir`` (readable by the workload) and return the variables that point
    the launchers at it: ``GPUPOOL_HOSTFILE``, Open MPI 4's ``OMPI_MCA_orte_default_hostfile`` and Open MPI 5's
    ``PRTE_MCA_prte_default_hostfile`` (so a bare ``mpirun`` uses it)."""
    path = job_dir / HOSTFILE
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(path.lstat().st_mode):  # a link left by an earlier run of the workload
            path.unlink()
    temporary = job_dir / f".{HOSTFILE}.tmp"
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)
    return {
        "GPUPOOL_HOSTFILE": str(path),
        "OMPI_MCA_orte_default_hostfile": str(path),
        "PRTE_MCA_prte_default_hostfile": str(path),
    }


def make_tree_without_links(root: Path, relative: Path, uid: int, *, mode: int = 0o700) -> None:
    """Make ``root/relative`` one directory at a time, never following a link (a tenant owns what it wrote in its
    part of the shared storage, links included): each new directory gets ``uid`` and ``mode``; an existing one is
    kept as it is. Raises WorkloadRejected where a part is a link or not a directory."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(root, flags)
    except OSError as exc:
        raise WorkloadRejected(f"{root} cannot be opened: {exc.strerror or exc}") from exc
    try:
        for part in relative.parts:
            try:
                os.mkdir(part, mode, dir_fd=descriptor)
                created = True
            except FileExistsError:
                created = False
            try:
                child = os.open(part, flags, dir_fd=descriptor)
            except OSError as exc:
                raise WorkloadRejected(f"{root / relative}: {part!r} is a link or not a directory") from exc
            os.close(descriptor)
            descriptor = child
            if created:  # through the descriptor: a link put there meanwhile is never followed
                os.fchown(descriptor, uid, uid)
                os.fchmod(descriptor, mode)
    finally:
        os.close(descriptor)


#: Where an MPI job's launcher script is put in its job dir (``launcher: mpi``).
RSH_AGENT = ".gpupool/gpupool-rsh"


def mpi_command(start: protocol.WorkloadStart, job_dir: Path, env: dict[str, str]) -> list[str]:
    """An MPI job's replica runs ``nodeagent/mpi_launch.py`` (copied into its job dir, where its uid reads it):
    replica 0 launches the job's command (``mpirun …``) with it as Open MPI's rsh agent, the others serve the
    daemons mpirun starts there. Sets the rsh agent variables of Open MPI 4 and 5 in ``env``."""
    script = job_dir / RSH_AGENT
    folder = script.parent
    # An earlier run of the job owned its job dir: what it left at this name may be a link elsewhere.
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.unlink()
    elif folder.is_dir() and folder.stat().st_uid != os.geteuid():
        shutil.rmtree(folder)
    folder.mkdir(mode=0o755, exist_ok=True)
    temporary = folder / ".gpupool-rsh.tmp"
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o755)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(MPI_LAUNCH_SCRIPT.read_bytes())
    os.replace(temporary, script)
    env["OMPI_MCA_plm_rsh_agent"] = str(script)
    env["PRTE_MCA_plm_ssh_agent"] = str(script)
    python = ["/usr/bin/env", "python3", str(script)]
    if start.replica == 0:
        return [*python, "launch", "--", *start.command]
    return [*python, "serve"]


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` is ``root`` or below it (by name: resolve first where a link may be in the way)."""
    return path == root or path.is_relative_to(root)


def _give_path(root: Path, path: Path, uid: int, gid: int) -> None:
    """Hand every directory from ``root`` (exclusive) down to ``path`` to the workload's uid."""
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            raise WorkloadRejected(f"{current} is a symbolic link; the job's directories must be plain directories")
        os.chown(current, uid, gid)


def open_output_for_append(path: Path) -> int:
    """A descriptor appending to the workload's output file, created if missing. Whatever a previous run of the
    workload left in its place that is not a plain file (a link to a file of the agent's) is removed first."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(path.lstat().st_mode):
            path.unlink()
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)


class Launcher:
    """Turns a ``workload.start`` into a running process: the one place that knows the node's sandbox, container
    runtime, shared storage and devices, and the agent's own environment, as they bear on a launch."""

    def __init__(
        self,
        *,
        work_dir: Path,
        sandbox: Sandbox | None,
        base_env: Mapping[str, str],
        device_indices: Mapping[str, int],
        env_denylist: tuple[str, ...] | None,
        container_runtime: str | None,
        shared_storage: Path | None,
    ) -> None:
        self.work_dir = work_dir
        #: None: workloads run as the agent's own user (``--sandbox none``, and library users such as tests).
        self.sandbox = sandbox
        self.base_env = dict(base_env)
        self.device_indices = dict(device_indices)
        self.env_denylist = env_denylist
        #: podman or docker for jobs that name an image (``nodeagent.containers.find_runtime``); None: refused.
        self.container_runtime = container_runtime
        #: The shared file system mounted on every node (``--shared-storage``); a sandboxed workload sees only its
        #: tenant's part of it (the sandbox hides the rest). None: this node has none.
        self.shared_storage = shared_storage

    @property
    def sandbox_mode(self) -> str:
        """``namespaces``, ``none``, or ``unavailable`` (namespaces asked for, but this node cannot make them:
        every workload fails until it is fixed) — what the hello tells the portal."""
        if self.sandbox is None:
            return SandboxMode.NONE
        return "unavailable" if self.sandbox.problem else SandboxMode.NAMESPACES

    def spawn(
        self, start: protocol.WorkloadStart, job_dir: Path, *, before_run: Callable[[WorkloadRecord], None]
    ) -> tuple[WorkloadRecord, subprocess.Popen | ServedProcess]:
        """Spawn ``start``'s workload in ``job_dir``: its record (with the pid, not yet ``running``) and process.

        ``before_run`` is called with the record of a sandboxed workload once its uid is known and before its
        command runs (the runner brings the node's network isolation up to date with it). Raises
        :class:`WorkloadRejected` for a request the agent refuses, and :class:`~nodeagent.sandbox.SandboxError`,
        ``OSError`` or ``ValueError`` where it cannot be run.
        """
        if not start.command:
            raise WorkloadRejected("workload.start has an empty command")
        working_dir = self._resolve_inside(job_dir, start.working_dir, "working_dir")
        shared_dir = self._tenant_shared_dir(start) if start.shared_dir else None
        checkpoint_dir = None
        on_shared = False
        if start.checkpoint_dir and shared_dir is not None and inside(Path(start.checkpoint_dir), shared_dir):
            # One per job, in the tenant's part of the shared storage: made below as the tenant's, never through a
            # link the tenant left there.
            checkpoint_dir, on_shared = Path(os.path.normpath(start.checkpoint_dir)), True
        elif start.checkpoint_dir:
            # An absolute checkpoint dir is shared storage chosen by the portal (under the tenant's configured
            # prefixes); a relative one lives in the job dir.
            checkpoint = Path(start.checkpoint_dir)
            checkpoint_dir = (
                self._shared_checkpoint_dir(checkpoint, job_dir, start.tenant_id)
                if checkpoint.is_absolute()
                else self._resolve_inside(job_dir, checkpoint, "checkpoint_dir")
            )
        # The job's variables only: the agent's own environment may hold names execve takes but POSIX does not
        # (bash exports functions as BASH_FUNC_name%%), and refusing every workload for them would be wrong.
        problem = env_problem(start.env, denylist=self.env_denylist)
        if problem is not None:
            raise WorkloadRejected(problem)
        for folder in (job_dir, working_dir, None if on_shared else checkpoint_dir):
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
        if on_shared:
            assert shared_dir is not None and checkpoint_dir is not None
            owner = self.sandbox.uid_for(start.tenant_id) if self.sandbox is not None else os.geteuid()
            make_tree_without_links(shared_dir, checkpoint_dir.relative_to(shared_dir), owner)
        record = WorkloadRecord(
            command_id=start.command_id,
            job_id=start.job_id,
            replica=start.replica,
            job_dir=str(job_dir),
            working_dir=str(working_dir),
            checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
            devices=[asdict(device) for device in start.devices],
            max_runtime_s=start.max_runtime_s or None,  # 0 means "no limit"
            sandbox=self.sandbox_mode,
        )
        env = workload_env(
            start,
            base_env=self._base_env(job_dir),
            checkpoint_dir=record.checkpoint_dir,
            device_indices=self.device_indices,
        )
        if shared_dir is not None:
            env["GPUPOOL_SHARED_DIR"] = str(shared_dir)
        if start.output_dir:
            output_dir = self._resolve_inside(job_dir, start.output_dir, "output_dir")
            output_dir.mkdir(parents=True, exist_ok=True)
            record.output_dir, record.output_max_bytes = str(output_dir), start.output_max_bytes
            env["GPUPOOL_OUTPUT_DIR"] = str(output_dir)
        record.peer_addresses = list(start.peer_addresses)
        if start.hostfile:
            env.update(write_hostfile(job_dir, start.hostfile))
        if start.launcher == "mpi":
            start = dataclasses.replace(start, command=mpi_command(start, job_dir, env))
        elif start.launcher:
            raise WorkloadRejected(f"launcher {start.launcher!r} is not known to this agent; upgrade it")
        plan = None
        if start.image:
            argv, cwd, popen_env = self._container(start, record, job_dir, working_dir, checkpoint_dir, env)
        elif self.sandbox is None:
            exit_file = job_dir / EXIT_CODE_FILE
            exit_file.unlink(missing_ok=True)
            env["GPUPOOL_EXIT_FILE"] = str(exit_file)
            argv = ["/bin/sh", "-c", _WRAPPER, "gpupool-workload", *start.command]
            cwd, popen_env = working_dir, env
        else:
            name = self.sandbox.workload_name(start.job_id, start.replica)
            plan = self.sandbox.prepare(
                name=name,
                tenant_id=start.tenant_id,
                working_dir=working_dir,
                writable=[
                    job_dir,
                    *([shared_dir] if shared_dir is not None else []),
                    *(
                        [checkpoint_dir]
                        if checkpoint_dir and not on_shared and not inside(checkpoint_dir, job_dir)
                        else []
                    ),
                ],
                command=list(start.command),
                env=env,
                limits=Limits(
                    cpu_cores=start.cpu_cores or None,  # 0 means "no limit"
                    memory_mib=start.host_memory_mib or None,
                    pids_max=self.sandbox.config.pids_max,
                ),
                hidden_devices=self._hidden_devices(start),
            )
            output_dir = Path(record.output_dir) if record.output_dir else None
            for folder in (working_dir, checkpoint_dir, output_dir):
                if folder is not None and inside(folder, job_dir):
                    _give_path(job_dir, folder, plan.uid, plan.gid)
            record.uid, record.cgroup, record.exit_file = plan.uid, plan.cgroup, str(plan.exit_file)
            before_run(record)  # before the command runs: it is never reachable by other tenants
            # The job's environment goes to the sandbox in its spec file, never to unshare and the init, which
            # run as root: a job's LD_PRELOAD must not reach them even if the denylist were emptied.
            argv, cwd, popen_env = plan.argv, "/", dict(ROOT_ENV)
        with os.fdopen(open_output_for_append(job_dir / LOG_FILE), "ab") as log_file:
            info = os.fstat(log_file.fileno())
            record.log_inode = [info.st_dev, info.st_ino]
            record.log_start_pos = info.st_size
            record.log_base = record.log_acked = start.log_offset
            process = self.sandbox.spawn(plan, log_file.fileno()) if plan is not None else None
            if process is None:
                process = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=popen_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        record.pid = process.pid
        record.pid_start_time = process_start_time(process.pid)
        return record, process

    def _container(
        self,
        start: protocol.WorkloadStart,
        record: WorkloadRecord,
        job_dir: Path,
        working_dir: Path,
        checkpoint_dir: Path | None,
        env: dict[str, str],
    ) -> tuple[list[str], str, dict[str, str]]:
        """The runtime command line of a job that names an image (``nodeagent.containers``)."""
        if self.container_runtime is None:
            raise WorkloadRejected(
                f"the job runs image {start.image!r} but this node has no container runtime (podman or docker); "
                "install one, or submit the job without an image"
            )
        key = hashlib.sha256(str(self.work_dir).encode()).hexdigest()[:10]
        name = f"gpupool-{key}-job-{start.job_id}-{start.replica}"
        control = self.work_dir / "control" / name
        control.mkdir(parents=True, exist_ok=True, mode=0o700)
        mounts = [job_dir, *([checkpoint_dir] if checkpoint_dir and not inside(checkpoint_dir, job_dir) else [])]
        if self.sandbox is not None:
            uid = gid = self.sandbox.uid_for(start.tenant_id)
            for path in mounts:
                own_tree(path, uid, gid)
            for folder in (working_dir, checkpoint_dir):
                if folder is not None and inside(folder, job_dir):
                    _give_path(job_dir, folder, uid, gid)
            pids_max = self.sandbox.config.pids_max
        else:
            uid, gid, pids_max = os.getuid(), os.getgid(), None
        env_file = control / "env"
        write_env_file(env_file, env)
        given = {self.device_indices[d.uuid] for d in start.devices if d.uuid in self.device_indices}
        argv = container_argv(
            runtime=self.container_runtime,
            name=name,
            image=start.image or "",
            command=list(start.command),
            env_file=env_file,
            uid=uid,
            gid=gid,
            working_dir=working_dir,
            mounts=mounts,
            limits=Limits(
                cpu_cores=start.cpu_cores or None, memory_mib=start.host_memory_mib or None, pids_max=pids_max
            ),
            device_nodes=device_nodes(assigned=given, npu=any(u.startswith("NPU-") for u in self.device_indices)),
        )
        record.container, record.uid = name, uid
        client_env = {"PATH": self.base_env.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
        if "HOME" in self.base_env:
            client_env["HOME"] = self.base_env["HOME"]
        return argv, "/", client_env

    def _base_env(self, job_dir: Path) -> dict[str, str]:
        """What a workload inherits before the job's own variables: the agent's environment when unconfined;
        in a sandbox only a plain PATH, the locale and a HOME in the job's directory (root's HOME, the agent's
        settings and anything else of the agent's stay with the agent)."""
        if self.sandbox is None:
            return self.base_env
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(job_dir), "TMPDIR": "/tmp"}
        for name in ("LANG", "LC_ALL", "TZ"):
            if name in self.base_env:
                env[name] = self.base_env[name]
        return env

    def _hidden_devices(self, start: protocol.WorkloadStart) -> list[str]:
        """The device nodes of the node's cards this workload was not given (present ones only)."""
        given = {self.device_indices[d.uuid] for d in start.devices if d.uuid in self.device_indices}
        indices = list(self.device_indices.values())
        npu = any(uuid.startswith("NPU-") for uuid in self.device_indices)
        return hidden_device_nodes(assigned=given, indices=indices, npu=npu)

    def _shared_checkpoint_dir(self, checkpoint: Path, job_dir: Path, tenant_id: int | None) -> Path:
        """An absolute checkpoint dir: never the agent's own files or another job's directory, and (sandboxed)
        never a directory of another owner that the workload would be handed."""
        resolved = Path(os.path.normpath(checkpoint))
        if ".." in checkpoint.parts or "\\" in str(checkpoint):
            raise WorkloadRejected(f"checkpoint_dir {str(checkpoint)!r} must be a plain absolute path (no '..')")
        if inside(resolved, self.work_dir) and not inside(resolved, job_dir):
            raise WorkloadRejected(
                f"checkpoint_dir {str(checkpoint)!r} is inside the agent's work dir {self.work_dir} but not the job's "
                "own directory"
            )
        if self.sandbox is not None:
            hidden = [Path(path) for path in (*self.sandbox.config.hidden_files, *self.sandbox.config.hidden_dirs)]
            for path in hidden:
                if inside(resolved, path) or inside(resolved, path.parent):
                    raise WorkloadRejected(f"checkpoint_dir {str(checkpoint)!r} is next to the agent's own files")
            if resolved.exists():
                uid, owner = self.sandbox.uid_for(tenant_id), resolved.stat().st_uid
                if owner != uid and (owner != 0 or any(resolved.iterdir())):
                    # It would be handed to the workload's uid: only an empty root-owned one, or the tenant's own.
                    raise WorkloadRejected(
                        f"checkpoint_dir {str(checkpoint)!r} belongs to uid {owner}, not this tenant's uid {uid}"
                    )
        return resolved

    def _tenant_shared_dir(self, start: protocol.WorkloadStart) -> Path:
        """The tenant's part of the shared storage, made if missing (owned by the tenant's uid, mode 0700; its
        parents by root). Refused when this node has no shared storage or the portal names a path outside it."""
        requested = Path(os.path.normpath(start.shared_dir))
        if self.shared_storage is None:
            raise WorkloadRejected(
                f"the job uses shared storage ({start.shared_dir}) but this node has none: start the agent with "
                "--shared-storage, mounted where the portal's GPUPOOL_SHARED_STORAGE says"
            )
        if (
            ".." in Path(start.shared_dir).parts
            or not inside(requested, self.shared_storage)
            or (requested == self.shared_storage)
        ):
            raise WorkloadRejected(f"shared dir {start.shared_dir!r} is not inside {self.shared_storage}")
        if not self.shared_storage.is_dir():
            raise WorkloadRejected(f"the shared storage {self.shared_storage} is not mounted on this node")
        owner = self.sandbox.uid_for(start.tenant_id) if self.sandbox is not None else os.geteuid()
        parent = requested.parent
        make_tree_without_links(self.shared_storage, parent.relative_to(self.shared_storage), 0, mode=0o755)
        make_tree_without_links(parent, Path(requested.name), owner)
        return requested

    def _resolve_inside(self, job_dir: Path, requested: str | Path | None, name: str) -> Path:
        if requested is None or str(requested) == "":
            return job_dir
        # A Windows-style separator is a separator here too: "..\\..\\x" must not pass as one odd file name.
        path = Path(str(requested).replace("\\", "/"))
        resolved = (path if path.is_absolute() else job_dir / path).resolve()
        if not inside(resolved, self.work_dir):
            raise WorkloadRejected(f"{name} {str(requested)!r} is outside the agent's work dir {self.work_dir}")
        # Not another job's directory (another tenant's output.log) nor the agent's own files (state.json).
        if not inside(resolved, job_dir.resolve()):
            raise WorkloadRejected(f"{name} {str(requested)!r} is outside the job's directory {job_dir}")
        return resolved
