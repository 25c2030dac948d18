"""A sandbox per workload: its own uid, namespaces, file system view, cgroup limits and device nodes.

The agent runs as root in production; a workload never does. Mode ``namespaces`` (the default of
``gpupool-agent run``) starts each workload as::

    unshare --mount --pid --ipc --fork --kill-child -- <python> -I -S -c <import sandbox_init, run it> <spec>

or, the same steps without a new ``unshare`` and interpreter per workload (about 15 ms of CPU less each), forked by
the agent's init server (:class:`InitServer`, ``sandbox_init.serve``); the command line above is what the agent
falls back to when the server cannot be used.

``sandbox_init`` (root inside the new namespaces) joins the workload's cgroups, makes the host read-only, hides
the agent's work dir, credential and every other job's directory, binds the job's own directory back writable,
mounts a private ``/tmp`` and a ``/proc`` of its PID namespace, and runs the command as the workload's uid with
``no_new_privs``. Mode ``none`` runs the command as the agent's own user with nothing of this (development
only; the node shows it in the console and the API).

**One uid per tenant**, ``uid_base + tenant id`` (gid the same), from a configured range. Per tenant rather than
per job because files outlive jobs: a checkpoint written on shared storage by one run must be readable by the
job's next run (often on another node) and by the tenant's other jobs, with the same owner on every node, and a
uid is never handed to a second tenant who could then read what the first left behind. Jobs of one tenant on
one node are still kept apart by their namespaces: neither sees the other's processes (PID namespace) or
directory (mount namespace).

A sandbox that cannot be set up (not root, no ``unshare``, no writable cgroups, a tenant outside the uid range,
a mount that fails) makes the workload ``failed`` with the reason; the command never runs unconfined.
"""

from __future__ import annotations

import array
import hashlib
import logging
import marshal
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from nodeagent.cgroups import CgroupError, Cgroups, Limits, detect

INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
#: What the interpreter runs: ``sandbox_init`` imported from its directory (appended to ``sys.path``, after the
#: standard library, so no module of the agent's shadows one) rather than run as a script, so that its cached
#: bytecode is used instead of compiling it for every workload.
INIT_BOOTSTRAP = (
    f"import sys; sys.path.append({str(INIT_SCRIPT.parent)!r}); import sandbox_init; "
    "sys.exit(sandbox_init.main(sys.argv))"
)
#: What the init server runs (:class:`InitServer`): ``sandbox_init.serve`` on the socket whose fd is its argument.
SERVER_BOOTSTRAP = (
    f"import sys; sys.path.append({str(INIT_SCRIPT.parent)!r}); import sandbox_init; "
    "sys.exit(sandbox_init.serve(int(sys.argv[1])))"
)
#: How long the agent waits for the init server to say it started a workload before it starts it the slow way.
SERVER_ANSWER_S = 10.0
#: After the init server failed, workloads start the slow way for this long before it is tried again.
SERVER_RETRY_S = 60.0
#: The environment of the processes that run as root outside the workload (``unshare``, the init, its server).
ROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
#: The spec ``sandbox_init`` reads, in its control dir; ``marshal`` data (loads without importing anything).
SPEC_FILE = "spec.marshal"
#: marshal's format version of the spec: version 4 is read by every Python 3.4 and later.
SPEC_MARSHAL_VERSION = 4
#: Exit code of ``sandbox_init`` when the sandbox could not be set up (the reason is in ``sandbox_error``).
SETUP_FAILED = 125
DEFAULT_UID_BASE = 200_000
DEFAULT_UID_COUNT = 65_536
#: Processes and threads one workload may have at once when the node sets no other limit.
DEFAULT_PIDS_MAX = 4096
#: GPU device nodes by card index: NVIDIA's, and Ascend's for ``NPU-`` cards.
DEVICE_NODE_PATTERNS = {"nvidia": "/dev/nvidia{index}", "npu": "/dev/davinci{index}"}


log = logging.getLogger(__name__)


class SandboxMode(StrEnum):
    NAMESPACES = "namespaces"
    NONE = "none"


class SandboxError(RuntimeError):
    """This workload's sandbox cannot be made; the workload fails with this message."""


@dataclass(frozen=True)
class SandboxConfig:
    mode: SandboxMode = SandboxMode.NAMESPACES
    uid_base: int = DEFAULT_UID_BASE
    uid_count: int = DEFAULT_UID_COUNT
    pids_max: int | None = DEFAULT_PIDS_MAX
    #: Files the workload must not see (the agent's credential file); bound over with /dev/null.
    hidden_files: tuple[str, ...] = ()
    #: Directories the workload must not see; an empty tmpfs goes over each.
    hidden_dirs: tuple[str, ...] = ()
    unshare: str = "unshare"
    python: str = field(default_factory=lambda: sys.executable)
    #: Start workloads through one long-lived init server (:class:`InitServer`) rather than an ``unshare`` and a
    #: new interpreter each; the same sandbox either way, about 15 ms less CPU per workload.
    init_server: bool = True


@dataclass(frozen=True)
class SandboxPlan:
    """What the runner needs to start and later settle one sandboxed workload."""

    argv: list[str]
    uid: int
    gid: int
    cgroup: str
    exit_file: Path
    error_file: Path
    spec_file: Path


def parse_uid_range(text: str) -> tuple[int, int]:
    """``"200000-265535"`` → (base, count); the range must not include root or the usual system/user uids."""
    start, sep, end = text.partition("-")
    try:
        base, last = int(start), int(end if sep else start)
    except ValueError:
        raise ValueError(f"sandbox uid range {text!r} must look like 200000-265535") from None
    if base < 1000 or last < base:
        raise ValueError(f"sandbox uid range {text!r} must start at 1000 or above and not end before it starts")
    return base, last - base + 1


class Sandbox:
    """Makes, and cleans up after, the sandboxes of one agent's workloads."""

    def __init__(self, config: SandboxConfig, *, work_dir: Path, cgroups: Cgroups | None = None) -> None:
        self.config = config
        self.work_dir = Path(work_dir)
        self.control_dir = self.work_dir / "control"
        # Several agents may share one host (the demo, tests): their workloads' cgroups must never share a name,
        # or one agent's cleanup would kill the other's workload. The work dir tells agents apart.
        self.agent_key = hashlib.sha256(str(self.work_dir.resolve()).encode()).hexdigest()[:10]
        self._cgroups = cgroups
        #: Why sandboxes cannot be made on this node at all (checked once, at start); None when they can.
        self.problem: str | None = None
        if config.mode == SandboxMode.NAMESPACES:
            self.problem = self._probe()
        self._server = InitServer(config.python) if config.init_server and self.problem is None else None
        self._server_retry_at = float("-inf")

    @property
    def mode(self) -> SandboxMode:
        return self.config.mode

    @property
    def cgroup_version(self) -> int | None:
        return self._cgroups.version if self._cgroups is not None else None

    def _probe(self) -> str | None:
        if os.geteuid() != 0:
            return (
                "the sandbox needs the agent to run as root (it switches each workload to its own uid); run the "
                "agent as root, or pass --sandbox none on a development machine"
            )
        if shutil.which(self.config.unshare) is None:
            return f"{self.config.unshare!r} (util-linux) is not installed; install util-linux"
        if not INIT_SCRIPT.is_file():
            return f"the sandbox init script {INIT_SCRIPT} is missing; reinstall gpupool-agent"
        if self._cgroups is None:
            try:
                self._cgroups = detect()
            except (CgroupError, OSError) as exc:
                return f"cgroups are not usable: {exc}"
        return None

    def workload_name(self, job_id: int, replica: int) -> str:
        """The name of a workload's cgroups and control dir, unique on the host."""
        return f"{self.agent_key}-job-{job_id}-{replica}"

    def uid_for(self, tenant_id: int | None) -> int:
        offset = tenant_id or 0  # 0: a portal that does not say the tenant; such jobs share the range's first uid
        if offset >= self.config.uid_count:
            last = self.config.uid_base + self.config.uid_count - 1
            raise SandboxError(
                f"tenant {tenant_id} has no uid in the sandbox range {self.config.uid_base}-{last}; widen the agent's "
                "--sandbox-uids range"
            )
        return self.config.uid_base + offset

    def prepare(
        self,
        *,
        name: str,
        tenant_id: int | None,
        working_dir: Path,
        writable: list[Path],
        command: list[str],
        env: dict[str, str],
        limits: Limits,
        hidden_devices: list[str],
    ) -> SandboxPlan:
        """Make the workload's cgroups, own its directories, write its spec; returns the argv to start."""
        if self.problem is not None:
            raise SandboxError(f"the sandbox cannot be set up on this node: {self.problem}")
        assert self._cgroups is not None
        uid = self.uid_for(tenant_id)
        gid = uid
        control = self.control_dir / name
        control.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.control_dir, 0o700)
        for path in writable:
            own_tree(path, uid, gid)
        try:
            procs = self._cgroups.create(name, limits)
        except (CgroupError, OSError) as exc:
            raise SandboxError(f"the workload's cgroup cannot be made: {exc}") from exc
        exit_file = control / "exit_code"
        error_file = control / "sandbox_error"
        for stale in (exit_file, error_file):
            stale.unlink(missing_ok=True)
        spec = {
            "uid": uid,
            "gid": gid,
            "command": command,
            "env": env,
            "working_dir": str(working_dir),
            "writable": [str(path) for path in writable],
            "hidden_dirs": [str(self.work_dir), *self.config.hidden_dirs],
            "hidden_files": [*self.config.hidden_files, *hidden_devices],
            "cgroup_procs": procs,
            "exit_file": str(exit_file),
            "error_file": str(error_file),
            "root": str(control / "root"),
        }
        spec_file = control / SPEC_FILE
        write_spec(spec_file, spec)
        argv = [
            self.config.unshare,
            "--mount",
            "--pid",
            "--ipc",
            "--fork",
            "--kill-child",
            "--",
            self.config.python,
            "-I",
            "-S",
            "-c",
            INIT_BOOTSTRAP,
            str(spec_file),
        ]
        return SandboxPlan(
            argv=argv, uid=uid, gid=gid, cgroup=name, exit_file=exit_file, error_file=error_file, spec_file=spec_file
        )

    def spawn(self, plan: SandboxPlan, output_fd: int) -> ServedProcess | None:
        """Start the workload of ``plan`` through the init server, its output going to ``output_fd``; None when
        there is no server or it failed (the caller then runs ``plan.argv``: the same sandbox, started slower)."""
        if self._server is None or time.monotonic() < self._server_retry_at:
            return None
        try:
            return self._server.spawn(plan.spec_file, output_fd)
        except (OSError, SandboxError) as exc:
            log.warning(
                "sandbox: the init server could not start %s (%s); workloads start with unshare for %.0f s",
                plan.cgroup,
                exc,
                SERVER_RETRY_S,
            )
            self._server.close()
            self._server_retry_at = time.monotonic() + SERVER_RETRY_S
            return None

    def exit_fd(self) -> int | None:
        """A descriptor that turns readable when a workload the init server started ends (its answer socket);
        None without a server. What it holds is read by the next poll of the workload's process."""
        return self._server.fileno() if self._server is not None else None

    def close(self) -> None:
        """Stop the init server (running workloads go on; a later :meth:`spawn` starts a new server)."""
        if self._server is not None:
            self._server.close()

    def setup_error(self, name: str) -> str:
        """What ``sandbox_init`` said when it could not set the sandbox up ('' when it did)."""
        try:
            return (self.control_dir / name / "sandbox_error").read_text(errors="replace").strip()
        except OSError:
            return ""

    def oom_killed(self, name: str) -> bool:
        return self._cgroups is not None and self._cgroups.oom_killed(name)

    def kill(self, name: str, signum: int) -> None:
        if self._cgroups is not None:
            self._cgroups.kill(name, signum)

    def alive_pids(self, name: str) -> list[int]:
        return self._cgroups.pids(name) if self._cgroups is not None else []

    def leftovers(self) -> list[str]:
        """The names of the workloads whose control dir is still here (cleaned up only once their end is saved)."""
        try:
            return sorted(entry.name for entry in self.control_dir.iterdir() if entry.is_dir())
        except FileNotFoundError:
            return []

    def cleanup(self, name: str) -> None:
        """After the workload ended (its exit code and setup error read): kill stragglers, remove its cgroups
        and its control dir (the spec held the job's environment)."""
        if self._cgroups is not None:
            self._cgroups.kill(name)
            self._cgroups.remove(name)
        shutil.rmtree(self.control_dir / name, ignore_errors=True)

    def describe(self) -> str:
        """One line for the agent's log and the hello label."""
        if self.mode == SandboxMode.NONE:
            return "none (workloads run as the agent's user, unconfined: development only)"
        if self.problem:
            return f"namespaces, UNAVAILABLE: {self.problem}"
        return (
            f"namespaces (mount/PID/IPC, cgroup v{self.cgroup_version}, uids {self.config.uid_base}-"
            f"{self.config.uid_base + self.config.uid_count - 1})"
        )


class ServedProcess:
    """A workload's process started by the :class:`InitServer`, with what ``WorkloadRunner`` uses of a Popen."""

    def __init__(self, server: InitServer, number: int, pid: int) -> None:
        self.server = server
        self.number = number
        self.pid = pid
        self.returncode: int | None = None

    @property
    def orphaned(self) -> bool:
        """The server ended before this process: its end can only be told from its pid and exit code file."""
        return self.returncode is None and self.server.lost_for(self.number)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.number)
        return self.returncode


class InitServer:
    """One interpreter per agent, started at the first workload, that has loaded ``sandbox_init`` and forks each
    workload's sandbox (``sandbox_init.serve``): what ``unshare`` and the init do, without starting ``unshare`` and
    a new interpreter for every workload. The agent sends it the spec path and the output file on a socketpair;
    it answers with the pid (the workload's process group, as with ``unshare``) and later that process's exit code.

    Runs as root with the environment of ``unshare`` (:data:`ROOT_ENV`), never the job's. If it dies, the
    workloads it started go on and are followed by pid and exit code file, like those of a restarted agent.
    """

    def __init__(self, python: str) -> None:
        self.python = python
        self._socket: socket.socket | None = None
        self._process: subprocess.Popen | None = None
        self._next_number = 0
        #: Request numbers below this belong to a server that has gone.
        self._first_live_number = 0
        self._answers: dict[int, tuple[str, str]] = {}
        self._exits: dict[int, int] = {}

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [self.python, "-I", "-S", "-c", SERVER_BOOTSTRAP, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                cwd="/",
                env=ROOT_ENV,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._socket = ours
        self._first_live_number = self._next_number
        return ours

    def fileno(self) -> int | None:
        """The socket the server answers on (readable when a workload it started has ended); None when none
        runs."""
        return self._socket.fileno() if self._socket is not None else None

    def lost_for(self, number: int) -> bool:
        self._collect()
        return number < self._first_live_number and number not in self._exits

    def spawn(self, spec_file: Path, output_fd: int) -> ServedProcess:
        sock = self._socket or self._start()
        number = self._next_number
        self._next_number += 1
        request = f"spawn {number} {spec_file}".encode()
        descriptors = array.array("i", [output_fd])
        try:
            sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, descriptors)])
        except OSError:
            self._gone()
            raise
        deadline = time.monotonic() + SERVER_ANSWER_S
        while number not in self._answers:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
                raise SandboxError(f"the init server gave no answer in {SERVER_ANSWER_S:.0f} s")
            self._collect()
            if self._socket is None:
                raise SandboxError("the init server ended")
        verb, detail = self._answers.pop(number)
        if verb != "started":
            raise SandboxError(f"the init server could not start it: {detail}")
        return ServedProcess(self, number, int(detail))

    def returncode(self, number: int) -> int | None:
        self._collect()
        return self._exits.pop(number, None)

    def _collect(self) -> None:
        """Read every answer that has arrived, without waiting."""
        while self._socket is not None:
            try:
                message = self._socket.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if not message:
                self._gone()
                return
            try:
                verb, number, detail = message.decode(errors="replace").split(" ", 2)
                if verb == "exit":
                    self._exits[int(number)] = int(detail)
                else:
                    self._answers[int(number)] = (verb, detail)
            except ValueError:
                log.error("sandbox: ignoring a garbled answer of the init server: %r", message[:200])

    def _gone(self) -> None:
        """The server ended (or is ended): what it started from now on is followed by pid only."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._first_live_number = self._next_number
        if self._process is not None:
            try:
                self._process.wait(timeout=2.0)  # it ends when it reads the closed socket
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def close(self) -> None:
        if self._socket is not None:
            self._collect()
        self._gone()


def write_spec(path: Path, spec: dict) -> None:
    """Write a workload's spec for ``sandbox_init`` (mode 0600: it holds the job's environment)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(marshal.dumps(spec, SPEC_MARSHAL_VERSION))


def hidden_device_nodes(*, assigned: set[int], indices: list[int], npu: bool = False) -> list[str]:
    """The GPU device nodes of the node's other cards (present ones only), to be hidden from a workload."""
    pattern = DEVICE_NODE_PATTERNS["npu" if npu else "nvidia"]
    nodes = []
    for index in sorted(set(indices) - assigned):
        path = pattern.format(index=index)
        if os.path.exists(path):
            nodes.append(path)
    return nodes


def own_tree(path: Path, uid: int, gid: int) -> None:
    """Make ``path`` (and its missing parents) and give it to the workload's uid; mode 0700."""
    path.mkdir(parents=True, exist_ok=True)
    stat = path.stat()
    if (stat.st_uid, stat.st_gid) != (uid, gid):
        os.chown(path, uid, gid)
    os.chmod(path, 0o700)
