"""Run the portal's workloads as local processes, and never lose or double-start one.

Each workload runs in its own process group (``start_new_session``) and its own directory under the agent's
work dir, with its output in ``output.log`` there. A tiny ``/bin/sh`` wrapper records the command's exit code
in ``exit_code`` next to the log, so an agent that was restarted while the workload ran can still tell how it
ended. ``state.json`` in the work dir lists every active workload with its pid and the kernel's start time of
that pid; a restarted agent reads it and re-adopts the processes that still run (same pid *and* start time, so
a recycled pid is not mistaken for ours), and reports the others as finished (exit code file present) or lost.
Finished workloads (kept a day, so a repeated start is recognised) are appended to ``finished.jsonl`` instead,
a line per change, the newest line of a run winning; it is compacted when it holds twice the lines it needs.
So the file rewritten at every start and end stays as small as the node's running work, not a day of it.

The runner never sleeps: :meth:`WorkloadRunner.poll` does one step (reap exits, enforce ``max_runtime_s``,
escalate SIGTERM to SIGKILL after the grace period) and the agent calls it every tick. Status changes go to
the durable :attr:`WorkloadRunner.outbox` (``nodeagent.outbox``) until the portal acknowledges them. A final
status is journalled there before the workload's finished line is appended to ``finished.jsonl``, and that
line before ``state.json`` drops the workload, so an agent killed in between re-settles the workload and
reports it again rather than never, or finds it finished.

A workload that cannot start — a bad environment variable name, a working dir that cannot be made, a
missing interpreter, permission denied — is recorded as ``failed`` with the reason and reported like any
other end, so its job fails and its devices are released; a command that is not found or not executable
exits 127 or 126 from the wrapper and is reported ``failed`` with that explanation.

A SIGTERM that arrives in the instant between the wrapper's fork and the command's exec is lost; the SIGKILL
after the grace period still ends such a workload.

With a :class:`~nodeagent.sandbox.Sandbox` in mode ``namespaces`` (``gpupool-agent run``'s default) each workload
runs in its own sandbox instead of as the agent's user: its tenant's uid, its own mount, PID and IPC namespaces,
the host read-only, the agent's files and other jobs' directories hidden, CPU, memory and pids limits from its
cgroup, and only its own GPU device nodes. Its exit code is then written by the sandbox's init into the agent's
control dir (``<work dir>/control/<job>-<replica>/exit_code``), where the workload cannot forge it. A workload
killed by the kernel for exceeding its memory limit is reported ``failed`` with reason ``oom_killed``; one whose
sandbox could not be made, ``failed`` with reason ``sandbox_failed`` — it never runs unconfined.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from nodeagent import protocol
from nodeagent.backends.base import WorkloadLoad
from nodeagent.cgroups import Limits
from nodeagent.containers import container_argv, device_nodes, write_env_file
from nodeagent.logstream import open_output
from nodeagent.netpolicy import IsolationMode, NetworkIsolation, NetworkPolicyError
from nodeagent.outbox import OUTBOX_FILE, ReportOutbox
from nodeagent.outputs import OutputCollector
from nodeagent.sandbox import ROOT_ENV, Sandbox, SandboxError, SandboxMode, ServedProcess, hidden_device_nodes, own_tree

log = logging.getLogger(__name__)

#: The launcher script of MPI jobs (standard library only: any python3 on the node runs it as the job's uid).
MPI_LAUNCH_SCRIPT = Path(__file__).with_name("mpi_launch.py")

STATE_FILE = "state.json"
FINISHED_FILE = "finished.jsonl"
EXIT_CODE_FILE = "exit_code"
LOG_FILE = "output.log"
#: Grace between SIGTERM and SIGKILL when a workload exceeds its ``max_runtime_s``.
MAX_RUNTIME_GRACE_S = 30.0
#: How often a running workload's checkpoint dir is looked at for a newer checkpoint to report.
CHECKPOINT_SCAN_S = 5.0
#: Finished workloads are kept (``finished.jsonl``) this long, so a repeated start for them is recognised.
FINISHED_RETENTION_S = 24 * 3600.0
#: How often the finished workloads are looked at for those past FINISHED_RETENTION_S (not at every step).
FORGET_EVERY_S = 60.0
LOG_TAIL_LINES = 40
LOG_TAIL_BYTES = 16 * 1024

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
#: Shell exit codes of a command that could not be run (the wrapper is ``/bin/sh``).
_SHELL_EXIT_MEANINGS = {
    126: "the command is not executable (permission denied)",
    127: "the command was not found",
}


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


@dataclass
class WorkloadRecord:
    command_id: int
    job_id: int
    replica: int
    job_dir: str
    working_dir: str
    checkpoint_dir: str | None
    devices: list[dict] = field(default_factory=list)
    pid: int | None = None
    pid_start_time: int | None = None
    started_at: float = 0.0
    max_runtime_s: int | None = None
    state: str = "starting"
    exit_code: int | None = None
    stop_reason: str | None = None
    term_sent_at: float | None = None
    kill_after: float | None = None
    finished_at: float | None = None
    message: str = ""
    #: The newest checkpoint time already reported to the portal (``checkpointed`` status).
    reported_checkpoint_at: str | None = None
    #: ``oom_killed``, ``sandbox_failed``, ``rejected`` when the final state has such a cause (``reason`` of the
    #: status report).
    reason: str = ""
    #: The sandbox it runs in: ``none`` or ``namespaces``, with the uid, the cgroup name and the exit code file
    #: in the agent's control dir (None: ``exit_code`` in the job dir, written by the wrapper).
    sandbox: str = "none"
    uid: int | None = None
    cgroup: str | None = None
    exit_file: str | None = None
    #: The container's name when the job named an OCI image (run by ``container_runtime``).
    container: str | None = None
    #: Live logs (``nodeagent.logstream``): this run's output starts at byte ``log_start_pos`` of ``output.log``
    #: (a rerun on this node appends to it), which is offset ``log_base`` of the replica's log on the portal;
    #: the portal has acknowledged it up to ``log_acked``. ``log_inode`` is (st_dev, st_ino) of the file the agent
    #: opened; None for a workload that never started (nothing is streamed for it).
    log_base: int = 0
    log_start_pos: int = 0
    log_acked: int = 0
    log_inode: list[int] | None = None
    #: The job's output dir on this node (``workload.start``'s ``output_dir`` in its job dir) and the most bytes it
    #: may hold; collected when the workload ends (``nodeagent.outputs``).
    output_dir: str | None = None
    output_max_bytes: int = 0
    #: The addresses of the nodes the job runs on (``workload.start``'s ``peer_addresses``): the only machines
    #: whose connections reach this workload's sockets (``nodeagent.netpolicy``).
    peer_addresses: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.replica)

    @property
    def active(self) -> bool:
        return self.state not in protocol.WORKLOAD_FINAL_STATES


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


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _give_path(root: Path, path: Path, uid: int, gid: int) -> None:
    """Hand every directory from ``root`` (exclusive) down to ``path`` to the workload's uid."""
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            raise WorkloadRejected(f"{current} is a symbolic link; the job's directories must be plain directories")
        os.chown(current, uid, gid)


def read_log_tail(path: Path, *, lines: int = LOG_TAIL_LINES, inode: list[int] | None = None) -> str:
    """The last ``lines`` lines of a workload's output; "" when the file is missing, or is a link or another file
    than the one the agent created (``inode``): a sandboxed workload owns its job dir and could put a link to
    one of the agent's files there."""
    descriptor = open_output(path, inode)
    if descriptor is None:
        return ""
    try:
        size = os.fstat(descriptor).st_size
        data = os.pread(descriptor, LOG_TAIL_BYTES, max(0, size - LOG_TAIL_BYTES))
    except OSError:
        return ""
    finally:
        os.close(descriptor)
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def open_output_for_append(path: Path) -> int:
    """A descriptor appending to the workload's output file, created if missing. Whatever a previous run of the
    workload left in its place that is not a plain file (a link to a file of the agent's) is removed first."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(path.lstat().st_mode):
            path.unlink()
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)


class _Records(dict):
    """The runner's workloads by (job, replica), remembering which were put since the last save (new, or a new run
    of a replica), and which may still have output for the log shipper: so that a step, a save and the shipper
    look at the active workloads and those, not at a day of finished ones."""

    def __init__(self) -> None:
        super().__init__()
        self.put_since_save: set[tuple[int, int]] = set()
        self.log_watch: set[tuple[int, int]] = set()

    def __setitem__(self, key: tuple[int, int], record: WorkloadRecord) -> None:
        super().__setitem__(key, record)
        self.put_since_save.add(key)
        self.log_watch.add(key)


class WorkloadRunner:
    def __init__(
        self,
        *,
        work_dir: Path,
        clock: Callable[[], float] = time.time,
        base_env: Mapping[str, str] | None = None,
        device_indices: Mapping[str, int] | None = None,
        max_runtime_grace_s: float = MAX_RUNTIME_GRACE_S,
        checkpoint_scan_s: float = CHECKPOINT_SCAN_S,
        sandbox: Sandbox | None = None,
        env_denylist: tuple[str, ...] | None = protocol.DEFAULT_ENV_DENYLIST,
        container_runtime: str | None = None,
        network: NetworkIsolation | None = None,
        shared_storage: Path | None = None,
        outputs: OutputCollector | None = None,
        job_dir_retention_s: float = FINISHED_RETENTION_S,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        #: None: workloads run as the agent's own user (``--sandbox none``, and library users such as tests).
        self.sandbox = sandbox if sandbox is not None and sandbox.mode == SandboxMode.NAMESPACES else None
        self.env_denylist = env_denylist
        #: podman or docker for jobs that name an image (``nodeagent.containers.find_runtime``); None: refused.
        self.container_runtime = container_runtime
        self.clock = clock
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.device_indices = dict(device_indices or {})
        self.max_runtime_grace_s = max_runtime_grace_s
        self.checkpoint_scan_s = checkpoint_scan_s
        self._next_checkpoint_scan: dict[tuple[int, int], float] = {}
        #: Starts waiting for an earlier run of the same replica to end (:meth:`_supersede`); in memory only: after a
        #: restart the portal's reconcile requeues a run the node no longer has.
        self._deferred: dict[tuple[int, int], protocol.WorkloadStart] = {}
        self.records: _Records = _Records()
        self._popen: dict[tuple[int, int], subprocess.Popen | ServedProcess] = {}
        #: Each record's line (in ``state.json`` or ``finished.jsonl``) with the field values it was encoded from.
        self._state_lines: dict[tuple[int, int], tuple[tuple, str, WorkloadRecord | None]] = {}
        self._journal_lines = 0  # lines in finished.jsonl now (compacted when twice what it needs)
        self._active_keys: set[tuple[int, int]] = set()  # records whose saved line is in state.json
        self._next_forget_at = float("-inf")
        #: Status reports the portal has not acknowledged yet, kept on disk (``outbox.jsonl``).
        self.outbox = ReportOutbox(self.work_dir / OUTBOX_FILE, clock=clock)
        #: Keeps other tenants' jobs from this node's workloads' sockets; only sandboxed workloads (own uid) are
        #: isolated. None: nothing (``--network-isolation none``, and library users such as tests).
        self.network = network if network is not None and network.mode != IsolationMode.NONE else None
        #: The shared file system mounted on every node (``--shared-storage``); a sandboxed workload sees only its
        #: tenant's part of it (the sandbox hides the rest). None: this node has none.
        self.shared_storage = Path(shared_storage).resolve() if shared_storage else None
        #: Uploads ended replicas' output dirs to the portal (``nodeagent.outputs``); None: none collected.
        self.outputs = outputs
        #: How long a finished workload's job dir is kept on the node (its logs and outputs are on the portal).
        self.job_dir_retention_s = job_dir_retention_s
        self._adopt()
        self._clean_leftovers()
        if self.outputs is not None:  # what a previous agent still owed the portal
            self.outputs.resume([(r.job_id, r.replica, Path(r.job_dir)) for r in self.records.values() if not r.active])
        with contextlib.suppress(NetworkPolicyError):  # logged; each start tries again, and fails if it must
            self._sync_network()

    # --- persistence -------------------------------------------------------------------------------------

    @property
    def sandbox_mode(self) -> str:
        """``namespaces``, ``none``, or ``unavailable`` (namespaces asked for, but this node cannot make them:
        every workload fails until it is fixed) — what the hello tells the portal."""
        if self.sandbox is None:
            return SandboxMode.NONE
        return "unavailable" if self.sandbox.problem else SandboxMode.NAMESPACES

    @property
    def state_path(self) -> Path:
        return self.work_dir / STATE_FILE

    def save(self, keys: Iterable[tuple[int, int]] | None = None) -> None:
        """Write the state now, with the workloads of ``keys`` looked at besides the active ones (the agent names
        those whose acknowledged log offsets moved); every workload when ``keys`` is None."""
        if keys is None:
            self._save(everything=True)
            return
        self.records.put_since_save.update(key for key in keys if key in self.records)
        self._save()

    def active_records(self) -> list[WorkloadRecord]:
        """The workloads not finished, without looking at the finished ones (an active one was saved as active,
        or was put since the last save)."""
        records = self.records
        found = (records.get(key) for key in self._active_keys | records.put_since_save)
        return [record for record in found if record is not None and record.active]

    def log_sources(self) -> list[WorkloadRecord]:
        """The workloads whose output may still have to be shipped: all but those the log shipper said are done
        (:meth:`log_done`) and those forgotten."""
        records = self.records
        records.log_watch.difference_update([key for key in records.log_watch if key not in records])  # forgotten
        return [records[key] for key in records.log_watch]

    def log_done(self, key: tuple[int, int]) -> None:
        """The log shipper has shipped all of this run's output (or was refused): not offered again."""
        self.records.log_watch.discard(key)

    def _save(self, *, everything: bool = False) -> None:
        """Write ``state.json`` (``{"version": 1, "workloads": [...]}``, one active workload per line) after
        appending to ``finished.jsonl`` the finished workloads that changed since the last save.

        Each record's line is kept and encoded again only when one of its fields changed (fields are replaced,
        never changed in place: lists included), and the C encoder is used (``indent`` would bypass it). Only
        the active workloads and new ones are looked at, unless ``everything``: the runner changes a finished
        one only through :meth:`save` (log offsets) and :meth:`_forget_old`, so a start or an end costs the same
        whatever a day of finished workloads holds.
        """
        lines = self._state_lines
        active = self._active_keys
        if everything:
            for key in [key for key in lines if key not in self.records]:
                del lines[key]
                active.discard(key)
            keys = list(self.records)
        else:
            # The active ones, and those put since the last save: new, or a new run of a replica (another object).
            keys = [key for key in active | self.records.put_since_save if key in self.records]
        appended = []
        for key in keys:
            record = self.records[key]
            values = tuple(vars(record).values())
            cached = lines.get(key)
            if cached is None or cached[2] is not record or cached[0] != values:
                lines[key] = (values, json.dumps(vars(record)), record)
                if not record.active:
                    appended.append(lines[key][1])
            if record.active:
                active.add(key)
            else:
                active.discard(key)
        self.records.put_since_save.clear()  # once `active` holds those that are
        if appended:
            # Before state.json drops them: killed in between, the next agent finds them here, finished.
            with self.finished_path.open("a", encoding="utf-8") as journal:
                journal.write("\n".join(appended) + "\n")
            self._journal_lines += len(appended)
        if self._journal_lines > 2 * (len(lines) - len(active)) + 64:
            self._compact_journal()
        body = ",\n".join(lines[key][1] for key in sorted(active))
        _replace_file(self.state_path, f'{{"version": 1, "workloads": [\n{body}\n]}}\n')

    @property
    def finished_path(self) -> Path:
        return self.work_dir / FINISHED_FILE

    def _compact_journal(self) -> None:
        """Rewrite ``finished.jsonl`` with one line per finished workload kept."""
        body = "".join(line + "\n" for key, (_, line, _) in self._state_lines.items() if key not in self._active_keys)
        _replace_file(self.finished_path, body)
        self._journal_lines = body.count("\n")

    def _load_journal(self) -> None:
        """The finished workloads of ``finished.jsonl``, the newest line of each replica winning."""
        try:
            text = self.finished_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("workloads: cannot read %s (%s); finished workloads forgotten", self.finished_path, exc)
            return
        for line in text.splitlines():
            if not line.strip():
                continue
            self._journal_lines += 1
            try:
                record = WorkloadRecord(**json.loads(line))
            except (ValueError, TypeError) as exc:  # a line cut short by a crash while appending
                log.warning("workloads: skipping a bad line of %s (%s)", self.finished_path, exc)
                continue
            self.records[record.key] = record
            self._state_lines[record.key] = (tuple(vars(record).values()), line, record)
        self.records.put_since_save.clear()  # their lines are the journal's: nothing to save

    def _adopt(self) -> None:
        """Load the state file of a previous run: re-adopt live workloads, settle the ones that ended."""
        self._load_journal()
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error("workloads: cannot read %s (%s); starting with no known workloads", self.state_path, exc)
            return
        for raw in data.get("workloads", []):
            record = WorkloadRecord(**raw)
            known = self.records.get(record.key)
            if known is not None and known.command_id == record.command_id and not known.active:
                continue  # the agent stopped between appending its end to the journal and rewriting state.json
            self.records[record.key] = record
            if not record.active:
                continue  # a state.json of an older agent, which listed finished workloads too
            if record.pid is not None and process_start_time(record.pid) == record.pid_start_time:
                log.info("workloads: re-adopted job %s replica %s (pid %s)", record.job_id, record.replica, record.pid)
                continue
            self._settle(record, lost_message="the process vanished while the agent was not running")
        self._save(everything=True)

    def _clean_leftovers(self) -> None:
        """Clean up the sandboxes no active workload owns: the previous agent was killed after saving a
        workload's end and before its cleanup (or between making a sandbox and saving the workload)."""
        if self.sandbox is None:
            return
        active = {record.cgroup for record in self.records.values() if record.active}
        for name in self.sandbox.leftovers():
            if name not in active:
                self.sandbox.cleanup(name)

    # --- commands from the portal ------------------------------------------------------------------------

    def start(self, start: protocol.WorkloadStart) -> None:
        """Start a workload. Raises :class:`WorkloadRejected` for a request the agent refuses or cannot run.

        A refused or failed start is also recorded as a ``failed`` workload and reported (through the
        outbox) with the reason, so the portal ends the job and releases its devices. A repeated start (the
        portal resends unacked commands after a reconnect) for a workload that is already running, or that
        already ran for the same command, starts nothing and re-reports its state.
        """
        key = (start.job_id, start.replica)
        existing = self.records.get(key)
        if existing is not None and 0 not in (existing.command_id, start.command_id):
            if start.command_id < existing.command_id:
                # The portal numbers its commands in order: this run was replaced here before it arrived.
                log.info("workloads: job %s replica %s: an older start (command %s) ignored", *key, start.command_id)
                return
            if existing.active and start.command_id > existing.command_id:
                self._supersede(existing, start)
                return
        if existing is not None and (existing.active or existing.command_id == start.command_id):
            log.info("workloads: job %s replica %s already known (%s); not started again", *key, existing.state)
            self._report(existing)
            if existing.state == "failed" and existing.pid is None:
                raise WorkloadRejected(existing.message)  # it never started: the repeated ack says so again
            return
        job_dir = self.work_dir / "jobs" / f"{start.job_id}-{start.replica}"
        try:
            self._spawn(start, job_dir)
        except (WorkloadRejected, SandboxError, OSError, ValueError) as exc:
            # OSError: the working dir cannot be made, permission denied, no /bin/sh; ValueError: what Popen
            # says of an environment execve cannot take (checked first, but a backstop costs nothing).
            if isinstance(exc, SandboxError):
                reason, cause = f"sandbox: {exc}", "sandbox_failed"
            elif isinstance(exc, WorkloadRejected):
                reason, cause = str(exc), "rejected"
            else:
                reason, cause = f"could not start: {exc}", "rejected"
            if self.sandbox is not None:
                self.sandbox.cleanup(self.sandbox.workload_name(start.job_id, start.replica))
            log.warning("workloads: job %s replica %s cannot start: %s", *key, reason)
            record = WorkloadRecord(
                command_id=start.command_id,
                job_id=start.job_id,
                replica=start.replica,
                job_dir=str(job_dir),
                working_dir=str(job_dir),
                checkpoint_dir=None,
                devices=[asdict(device) for device in start.devices],
                message=reason,
                reason=cause,
                sandbox=self.sandbox_mode,
            )
            self.records[key] = record
            self._finish(record, "failed", None)
            raise WorkloadRejected(reason) from exc

    def _supersede(self, old: WorkloadRecord, start: protocol.WorkloadStart) -> None:
        """A new run of a replica whose earlier run still runs here: the portal ended the old run's allocation (the
        node was declared lost, or the job was requeued) and has placed the replica here again. The old run is
        stopped and the new one starts once it has gone (they share the job's directory). The old run's reports
        carry its own command id, so the portal does not take them for the new run's."""
        log.warning(
            "workloads: job %s replica %s: a new run (command %s) replaces the one still running (command %s); "
            "stopping the old one first",
            start.job_id,
            start.replica,
            start.command_id,
            old.command_id,
        )
        if old.term_sent_at is None:
            old.stop_reason = "superseded"
        self._terminate(old, grace_s=self.max_runtime_grace_s)
        self._deferred[old.key] = start

    def _start_deferred(self) -> None:
        for key, start in list(self._deferred.items()):
            record = self.records.get(key)
            if record is not None and record.active:
                continue
            del self._deferred[key]
            try:
                self.start(start)
            except WorkloadRejected:
                pass  # recorded as failed and reported by start()
            except Exception:  # a bug or a full disk must not take the runner down; the portal requeues it
                log.exception("workloads: the deferred start of job %s replica %s failed", *key)

    def _spawn(self, start: protocol.WorkloadStart, job_dir: Path) -> None:
        key = (start.job_id, start.replica)
        if not start.command:
            raise WorkloadRejected("workload.start has an empty command")
        working_dir = self._resolve_inside(job_dir, start.working_dir, "working_dir")
        shared_dir = self._tenant_shared_dir(start) if start.shared_dir else None
        checkpoint_dir = None
        on_shared = False
        if start.checkpoint_dir and shared_dir is not None and _inside(Path(start.checkpoint_dir), shared_dir):
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
                        if checkpoint_dir and not on_shared and not _inside(checkpoint_dir, job_dir)
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
                if folder is not None and _inside(folder, job_dir):
                    _give_path(job_dir, folder, plan.uid, plan.gid)
            record.uid, record.cgroup, record.exit_file = plan.uid, plan.cgroup, str(plan.exit_file)
            self._sync_network(also=record)  # before the command runs: it is never reachable by other tenants
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
        record.started_at = self.clock()
        record.state = "running"
        self.records[key] = record
        self._popen[key] = process
        # state.json first: a workload the agent forgot after a crash would run unseen; a lost "running"
        # report is made good by the next hello, which lists the running workloads.
        self._save()
        log.info(
            "workloads: started job %s replica %s as pid %s in %s (sandbox %s%s)",
            *key,
            process.pid,
            working_dir,
            record.sandbox,
            f", uid {record.uid}" if record.uid is not None else "",
        )
        self._report(record)

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
        mounts = [job_dir, *([checkpoint_dir] if checkpoint_dir and not _inside(checkpoint_dir, job_dir) else [])]
        if self.sandbox is not None:
            uid = gid = self.sandbox.uid_for(start.tenant_id)
            for path in mounts:
                own_tree(path, uid, gid)
            for folder in (working_dir, checkpoint_dir):
                if folder is not None and _inside(folder, job_dir):
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
        if _inside(resolved, self.work_dir) and not _inside(resolved, job_dir):
            raise WorkloadRejected(
                f"checkpoint_dir {str(checkpoint)!r} is inside the agent's work dir {self.work_dir} but not the job's "
                "own directory"
            )
        if self.sandbox is not None:
            hidden = [Path(path) for path in (*self.sandbox.config.hidden_files, *self.sandbox.config.hidden_dirs)]
            for path in hidden:
                if _inside(resolved, path) or _inside(resolved, path.parent):
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
            or not _inside(requested, self.shared_storage)
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
        if not _inside(resolved, self.work_dir):
            raise WorkloadRejected(f"{name} {str(requested)!r} is outside the agent's work dir {self.work_dir}")
        # Not another job's directory (another tenant's output.log) nor the agent's own files (state.json).
        if not _inside(resolved, job_dir.resolve()):
            raise WorkloadRejected(f"{name} {str(requested)!r} is outside the job's directory {job_dir}")
        return resolved

    def stop(self, stop: protocol.WorkloadStop) -> None:
        """SIGTERM the workload's process group now and SIGKILL it ``grace_s`` later if it still runs."""
        record = self.records.get((stop.job_id, stop.replica))
        if record is None:
            log.info("workloads: stop for unknown job %s replica %s ignored", stop.job_id, stop.replica)
            return
        if not record.active:
            self._report(record)
            return
        if record.stop_reason != protocol.FENCED:  # a fenced stop stays one: the portal requeues its job
            record.stop_reason = stop.reason
        self._terminate(record, grace_s=stop.grace_s)

    def fence(self, *, grace_s: float, silent_s: float) -> list[tuple[int, int]]:
        """Stop every running workload because the agent has lost the portal (``nodeagent.fencing``): SIGTERM now
        (the checkpoint signal), SIGKILL ``grace_s`` later; each ends ``stopped`` with reason ``fenced``. Returns
        the (job, replica) pairs it began to stop; those already stopping for this reason are left as they are."""
        fenced = []
        deadline = self.clock() + max(0.0, grace_s)
        for record in self.active_records():
            if record.stop_reason == protocol.FENCED:
                continue
            if record.term_sent_at is not None:
                # Already stopping for its own reason (preempted, cancelled, max runtime), which it keeps; but it
                # is killed by the fence's deadline at the latest.
                if record.kill_after is not None and record.kill_after > deadline:
                    self._terminate(record, grace_s=grace_s)
                continue
            record.stop_reason = protocol.FENCED
            record.message = f"stopped by the node's agent: no answer from the portal for {silent_s:.0f} s"
            self._terminate(record, grace_s=grace_s)
            fenced.append(record.key)
        return fenced

    def _terminate(self, record: WorkloadRecord, *, grace_s: float) -> None:
        now = self.clock()
        if record.term_sent_at is None:
            record.term_sent_at = now
            self._signal(record, signal.SIGTERM)
        deadline = now + max(0.0, grace_s)
        record.kill_after = deadline if record.kill_after is None else min(record.kill_after, deadline)
        self._save()

    def _signal(self, record: WorkloadRecord, signum: int) -> None:
        """Signal the workload's process group; a sandbox's init passes SIGTERM on to every process of its PID
        namespace, and a SIGKILL also goes to every process in its cgroup (those that left the group too)."""
        if record.pid is None:
            return
        try:
            os.killpg(record.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            log.error("workloads: cannot signal job %s (pid %s): %s", record.job_id, record.pid, exc)
        if signum == signal.SIGKILL and record.cgroup and self.sandbox is not None:
            self.sandbox.kill(record.cgroup, signum)
        if signum == signal.SIGKILL and record.container and self.container_runtime:
            # Killing the runtime's client does not end the container; the runtime does.
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [self.container_runtime, "kill", record.container], capture_output=True, timeout=15, check=False
                )

    # --- the step ----------------------------------------------------------------------------------------

    def poll(self) -> None:
        """One step: reap finished workloads, enforce max runtime, SIGKILL after grace; queue status changes."""
        now = self.clock()
        for record in self.active_records():
            if not self._alive(record):
                self._settle(record)
                continue
            if record.max_runtime_s and record.term_sent_at is None and now >= record.started_at + record.max_runtime_s:
                record.message = f"max runtime of {record.max_runtime_s} s exceeded"
                record.stop_reason = "max_runtime"
                self._terminate(record, grace_s=self.max_runtime_grace_s)
            if record.kill_after is not None and now >= record.kill_after:
                log.warning("workloads: job %s replica %s ignored SIGTERM; SIGKILL", record.job_id, record.replica)
                self._signal(record, signal.SIGKILL)
                record.kill_after = None
                record.message = (record.message + "; " if record.message else "") + "killed after the grace period"
                self._save()
            self._report_checkpoint(record, now)
        self._start_deferred()
        self._forget_old(now)

    def _report_checkpoint(self, record: WorkloadRecord, now: float) -> None:
        """Queue a ``checkpointed`` status when the workload wrote a newer checkpoint than last reported.

        Without it the portal learns of checkpoints only when the workload starts or ends, so the job of a node
        that dies without a goodbye would be requeued with no checkpoint pointer.
        """
        if not record.checkpoint_dir or record.state != "running" or record.term_sent_at is not None:
            return
        if now < self._next_checkpoint_scan.get(record.key, float("-inf")):
            return
        self._next_checkpoint_scan[record.key] = now + self.checkpoint_scan_s
        newest = self.last_checkpoint_at(record)
        if newest is None or newest == record.reported_checkpoint_at:
            return
        record.reported_checkpoint_at = newest
        self.outbox.add(
            protocol.WorkloadStatus(
                job_id=record.job_id,
                replica=record.replica,
                state="checkpointed",
                last_checkpoint_at=newest,
                command_id=record.command_id,
            )
        )
        self._save()

    def _alive(self, record: WorkloadRecord) -> bool:
        process = self._popen.get(record.key)
        if isinstance(process, ServedProcess) and process.orphaned:
            # Its init server is gone: followed like a workload adopted after a restart, by pid and exit file.
            del self._popen[record.key]
            process = None
        if process is not None:
            return process.poll() is None
        return record.pid is not None and process_start_time(record.pid) == record.pid_start_time

    def _settle(self, record: WorkloadRecord, *, lost_message: str = "") -> None:
        """The process is gone: decide how it ended from its exit code file (or the Popen), else lost."""
        process = self._popen.pop(record.key, None)
        exit_code = None
        exit_file = Path(record.exit_file) if record.exit_file else Path(record.job_dir) / EXIT_CODE_FILE
        try:
            exit_code = int(exit_file.read_text().strip())
        except (OSError, ValueError):
            if process is not None:
                exit_code = process.returncode  # negative: killed by that signal before the wrapper could write
        sandbox = self.sandbox if record.cgroup else None
        setup_error = sandbox.setup_error(record.cgroup) if sandbox is not None and record.cgroup else ""
        oom = sandbox is not None and record.cgroup is not None and sandbox.oom_killed(record.cgroup)
        if exit_code is None and process is None and record.term_sent_at is None and not (setup_error or oom):
            record.message = lost_message or "the process vanished"
            self._finish(record, "lost", None)
            return
        if setup_error:
            # Only the init's own word counts: a command may exit 125 itself (docker run does).
            state = "failed"
            record.reason = "sandbox_failed"
            record.message = f"sandbox: {setup_error}"
        elif oom and record.stop_reason in (None, "max_runtime"):
            state = "failed"
            record.reason = "oom_killed"
            record.message = "killed by the kernel: out of memory (the job's host_memory_mib limit)"
        elif record.stop_reason == "max_runtime":
            state = "failed"
        elif record.stop_reason is not None:
            state = "stopped"
            if record.stop_reason == protocol.FENCED:
                record.reason = protocol.FENCED
        else:
            state = "succeeded" if exit_code == 0 else "failed"
        if state == "failed" and not record.message and exit_code is not None:
            meaning = _SHELL_EXIT_MEANINGS.get(exit_code)
            record.message = f"exited with code {exit_code}" + (f": {meaning}" if meaning else "")
        self._finish(record, state, exit_code)

    def _finish(self, record: WorkloadRecord, state: str, exit_code: int | None) -> None:
        record.state = state
        record.exit_code = exit_code
        record.finished_at = self.clock()
        record.kill_after = None
        self._next_checkpoint_scan.pop(record.key, None)
        log.info("workloads: job %s replica %s %s (exit code %s)", record.job_id, record.replica, state, exit_code)
        if self.outputs is not None and record.output_dir and state in ("succeeded", "failed"):
            self.outputs.collect(
                job_id=record.job_id,
                replica=record.replica,
                job_dir=Path(record.job_dir),
                output_dir=Path(record.output_dir),
                max_bytes=record.output_max_bytes,
            )
        # The outbox before state.json: killed in between, the next agent finds the workload still active,
        # settles it again and reports it again (a duplicate the portal ignores) instead of never.
        self._report(record)
        self._save()
        # The sandbox's cleanup removes the exit code file, so only once the end is saved: killed before that,
        # the next agent reads the same exit code again (not "lost"); killed after, it cleans up (:meth:`_adopt`).
        self._clean_sandbox(record)
        with contextlib.suppress(NetworkPolicyError):  # logged; the next change tries again
            self._sync_network()

    def _sync_network(self, *, also: WorkloadRecord | None = None) -> None:
        """The node's isolation rules for the tenants whose workloads run here (and ``also``, about to start):
        uid → the addresses of every node their jobs run on. Raises :class:`NetworkPolicyError` when the rules
        cannot be written (a start then fails with the reason: never reachable by every tenant)."""
        if self.network is None:
            return
        tenants: dict[int, set[str]] = {}
        for record in [*self.active_records(), *([also] if also is not None else [])]:
            if record.uid is not None:
                tenants.setdefault(record.uid, set()).update(record.peer_addresses)
        try:
            self.network.sync(tenants)
        except NetworkPolicyError as exc:
            log.error("workloads: %s", exc)
            if also is not None:
                raise SandboxError(str(exc)) from exc
            raise

    def _clean_sandbox(self, record: WorkloadRecord) -> None:
        if record.cgroup and self.sandbox is not None:
            self.sandbox.cleanup(record.cgroup)

    def _forget_old(self, now: float) -> None:
        if now < self._next_forget_at:
            return
        self._next_forget_at = now + min(FORGET_EVERY_S, max(1.0, self.job_dir_retention_s / 2))
        self._remove_old_job_dirs(now)
        old = [
            key
            for key, record in self.records.items()
            if not record.active and record.finished_at is not None and now - record.finished_at > FINISHED_RETENTION_S
        ]
        for key in old:
            del self.records[key]
        if old:
            self._save(everything=True)

    def _remove_old_job_dirs(self, now: float) -> None:
        """Remove the job dirs of workloads that ended more than ``job_dir_retention_s`` ago (their logs were
        shipped to the portal, their outputs uploaded: one still owed keeps its dir). A dir a newer run of the
        replica uses is the active record's, and is kept."""
        active_dirs = {record.job_dir for record in self.active_records()}
        for record in list(self.records.values()):
            if record.active or record.finished_at is None or now - record.finished_at <= self.job_dir_retention_s:
                continue
            job_dir = Path(record.job_dir)
            if record.job_dir in active_dirs or not _inside(job_dir, self.work_dir / "jobs") or not job_dir.exists():
                continue
            if self.outputs is not None and self.outputs.pending(job_dir):
                continue
            shutil.rmtree(job_dir, ignore_errors=True)  # never follows a link the job left (fd-based on Linux)
            log.info(
                "workloads: removed the dir of job %s replica %s (ended %.0f s ago)",
                *record.key,
                now - record.finished_at,
            )

    # --- reports -----------------------------------------------------------------------------------------

    def last_checkpoint_at(self, record: WorkloadRecord) -> str | None:
        if not record.checkpoint_dir:
            return None
        try:
            mtimes = [entry.stat().st_mtime for entry in Path(record.checkpoint_dir).rglob("*") if entry.is_file()]
        except OSError:
            return None
        if not mtimes:
            return None
        return protocol.format_time(datetime.fromtimestamp(max(mtimes), UTC))

    def status_of(self, record: WorkloadRecord) -> protocol.WorkloadStatus:
        final = not record.active
        return protocol.WorkloadStatus(
            job_id=record.job_id,
            replica=record.replica,
            state=record.state,  # type: ignore[arg-type]
            exit_code=record.exit_code,
            last_checkpoint_at=self.last_checkpoint_at(record),
            message=record.message,
            log_tail=read_log_tail(Path(record.job_dir) / LOG_FILE, inode=record.log_inode) if final else "",
            reason=record.reason if final else "",
            command_id=record.command_id,
        )

    def _report(self, record: WorkloadRecord) -> None:
        self.outbox.add(self.status_of(record))

    def running(self) -> list[protocol.RunningWorkload]:
        """Every workload still running, for the hello frame."""
        return [
            protocol.RunningWorkload(job_id=r.job_id, replica=r.replica, pid=r.pid, state=r.state)  # type: ignore[arg-type]
            for r in self.active_records()
        ]

    def known(self) -> list[protocol.RunningWorkload]:
        """What the hello frame says the node has: every running workload, and every finished one whose report
        the portal has not acknowledged yet (the report itself follows the hello from the outbox)."""
        unacked = self.outbox.keys()
        known = [
            protocol.RunningWorkload(
                job_id=r.job_id,
                replica=r.replica,
                pid=r.pid,
                state=r.state,  # type: ignore[arg-type]
                command_id=r.command_id,
                exit_code=r.exit_code,
            )
            for r in self.records.values()
            if r.active or r.key in unacked
        ]
        listed = {(w.job_id, w.replica) for w in known}
        # Reports of workloads no longer in state.json (finished over a day ago): the newest state of each.
        orphans = {(s.job_id, s.replica): s for s in self.outbox if (s.job_id, s.replica) not in listed}
        known += [
            protocol.RunningWorkload(job_id=s.job_id, replica=s.replica, pid=None, state=s.state, exit_code=s.exit_code)
            for s in orphans.values()
        ]
        return known

    def loads(self) -> list[WorkloadLoad]:
        return [
            WorkloadLoad(uuid=device["uuid"], millis=device["millis"], memory_mib=device.get("memory_mib"), pid=r.pid)
            for r in self.active_records()
            for device in r.devices
        ]

    def close(self, *, stop_workloads: bool = False, grace_s: float = 5.0) -> None:
        """Forget the Popen handles: workloads keep running, to be re-adopted by the next agent.

        With ``stop_workloads`` (the demo's agents, tests) they are stopped first: SIGTERM, then SIGKILL for
        those still running after ``grace_s`` seconds of real time.
        """
        if stop_workloads:
            active = self.active_records()
            for record in active:
                record.stop_reason = record.stop_reason or "agent_shutdown"
                self._signal(record, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while any(self._alive(record) for record in active) and time.monotonic() < deadline:
                time.sleep(0.05)
            for record in active:
                if self._alive(record):
                    self._signal(record, signal.SIGKILL)
            deadline = time.monotonic() + 1.0
            while any(self._alive(record) for record in active) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.poll()
        self._popen.clear()
        if self.sandbox is not None:
            self.sandbox.close()


def _replace_file(path: Path, text: str) -> None:
    """Write ``path`` whole: a reader sees the old file or the new one, never half of one."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
