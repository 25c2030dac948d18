"""The init of one sandboxed workload: runs as root inside fresh mount, PID and IPC namespaces, then runs the
command as the workload's own unprivileged uid and waits for it.

Started by the agent as ``unshare --mount --pid --ipc --fork --kill-child -- python -I -S -c <import this file
and call main> <spec>`` (``nodeagent.sandbox`` writes the spec; this file imports nothing outside the standard
library so that it runs with ``-I -S``, untouched by the job's environment). It runs once per workload, so it
starts cheaply: imported rather than run as a script (its bytecode is cached, not compiled each time), the spec
is ``marshal`` data (``json`` would import ``re`` and ``enum``), the C library is the interpreter's own
(``ctypes.util.find_library`` runs ``ldconfig``) and signals come from ``_signal`` (``signal`` imports ``enum``):
15 ms of CPU instead of 45 on a development machine, where the bare interpreter takes 11. In order:

1. join the workload's cgroups (so not one instruction of the command runs unlimited) and open the exit code
   file, which lives in the agent's control dir that the job will not see;
2. make every mount private, then the whole host read-only (``mount_setattr`` with ``AT_RECURSIVE``, or a
   read-only remount of each mount on kernels before 5.12);
3. hide: a fresh tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm``, the agent's work dir (its credential, state,
   outbox and every other job's directory) and any other configured directory; ``/dev/null`` over hidden files
   and over the GPU device nodes of cards the workload was not given;
4. bind the job's directory (and an absolute checkpoint dir) back, writable, at their own paths;
5. mount a ``/proc`` of the new PID namespace (other workloads' and the agent's processes do not exist here);
6. fork the command: no supplementary groups, the workload's gid and uid, ``no_new_privs`` (no setuid binary
   gives root back), its working dir, its environment;
7. as PID 1, forward SIGTERM/SIGINT/SIGHUP to every process of the namespace, reap orphans, and when the
   command ends write its exit code (128 + signal for a signal, as shells do) and exit with it. When this
   process ends the kernel kills whatever is left in the namespace.

Any failure before the command runs prints ``gpupool-sandbox: <reason>`` and exits 125 (the agent reports the
workload ``failed`` with that reason); the command never runs outside its sandbox.
"""

from __future__ import annotations

import _signal
import ctypes
import errno
import marshal
import os
import sys

SETUP_FAILED = 125
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added after the syscall tables were unified)
PR_SET_NO_NEW_PRIVS = 38
MS_MOVE = 8192
MNT_DETACH = 2
#: pivot_root's syscall number where it differs from the generic table's 41 (aarch64, riscv64, loongarch64).
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203, "s390x": 217}
_FLAG_NAMES = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

#: The C library the interpreter is linked with (dlopen(NULL) finds its symbols).
_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


class _suppress:
    """``contextlib.suppress`` without importing ``contextlib`` (which loads ``collections`` and ``functools``)."""

    def __init__(self, *errors: type[BaseException]) -> None:
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, _value: object, _traceback: object) -> bool:
        return kind is not None and issubclass(kind, self.errors)


#: The control dir's ``sandbox_error`` file, opened before the mounts hide it (the child inherits it until exec).
_error_fd = [-1]


def _fail(reason: str) -> None:
    """Say why the sandbox failed: on stderr (the workload's log) and in the agent's ``sandbox_error`` file."""
    print(f"gpupool-sandbox: {reason}", file=sys.stderr, flush=True)
    if _error_fd[0] >= 0:
        with _suppress(OSError):
            os.write(_error_fd[0], reason.encode())


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if result != 0:
        code = ctypes.get_errno()
        raise SetupError(f"mount {source or fstype or ''} on {target} failed: {os.strerror(code)}")


def _mount_points() -> list[tuple[str, int]]:
    """Every mount point of this namespace with its nosuid/nodev/noexec flags, parents first."""
    points = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            target = fields[4].encode().decode("unicode_escape")
            flags = 0
            for option in fields[5].split(","):
                flags |= _FLAG_NAMES.get(option, 0)
            points.append((target, flags))
    return points


def _make_readonly(root: str) -> None:
    """Make ``root`` and every mount below it read-only (a fresh bind tree: no file is open for writing on it,
    which would make the kernel refuse with EBUSY)."""
    attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY, attr_clr=0, propagation=0, userns_fd=0)
    syscall = _libc.syscall
    syscall.restype = ctypes.c_long
    result = syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(root.encode()),
        ctypes.c_uint(AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if result == 0:
        return
    code = ctypes.get_errno()
    if code not in (errno.ENOSYS, errno.EINVAL):
        raise SetupError(f"cannot make the host file system read-only: {os.strerror(code)}")
    # Kernels before 5.12: remount each mount of the tree read-only, keeping its other flags.
    for target, flags in _mount_points():
        if target != root and not target.startswith(root + "/"):
            continue
        try:
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except SetupError:
            inner = target[len(root) :] or "/"
            if not inner.startswith(("/proc", "/sys", "/dev")):
                raise  # pseudo file systems are replaced or harmless; a real one left writable is not


def _hide_dir(path: str, mode: str) -> None:
    os.makedirs(path, exist_ok=True)
    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")


def _hide_file(path: str) -> None:
    if os.path.lexists(path) and not os.path.isdir(path):
        _mount("/dev/null", path, None, MS_BIND)


def _bind_writable(fd: int, target: str) -> None:
    os.makedirs(target, exist_ok=True)
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)


def _pivot_into(root: str) -> None:
    """Make ``root`` the namespace's ``/`` and detach the old root entirely (``pivot_root(".", ".")``, as runc
    does); where the syscall number is unknown, move the tree onto ``/`` and chroot (switch_root's way; the
    command, without CAP_SYS_CHROOT, cannot climb out of it)."""
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None:
        if _libc.syscall(ctypes.c_long(number), b".", b".") != 0:
            raise SetupError(f"pivot_root failed: {os.strerror(ctypes.get_errno())}")
        if _libc.umount2(b".", MNT_DETACH) != 0:
            raise SetupError(f"cannot detach the old root: {os.strerror(ctypes.get_errno())}")
    else:
        _mount(root, "/", None, MS_MOVE)
        os.chroot(".")
    os.chdir("/")


def _write_oom_score_adj(value: str) -> None:
    """Best effort: lowering a score needs CAP_SYS_RESOURCE, which a containerised agent may lack."""
    with _suppress(OSError), open("/proc/self/oom_score_adj", "w") as handle:
        handle.write(value)


def load_spec(path: str) -> dict:
    """The spec the agent wrote (``nodeagent.sandbox.write_spec``): a marshalled dict."""
    with open(path, "rb") as handle:
        spec = marshal.load(handle)
    if not isinstance(spec, dict):
        raise ValueError(f"{path} does not hold a sandbox spec")
    return spec


def setup(spec: dict) -> int:
    """Steps 1-5; returns the fd of the exit code file."""
    for procs in spec["cgroup_procs"]:
        try:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))
        except OSError as exc:
            raise SetupError(f"cannot join the cgroup {procs}: {exc.strerror or exc}") from exc
    # The kernel's OOM killer takes the command, not this init (the command's own score is reset at fork).
    _write_oom_score_adj("-1000")
    exit_fd = os.open(spec["exit_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    _error_fd[0] = os.open(spec["error_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    binds = []
    for path in spec["writable"]:
        try:
            binds.append((os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), path))
        except OSError as exc:
            raise SetupError(f"cannot open {path}: {exc.strerror or exc}") from exc

    # The new root: a recursive bind of the host's tree (new mounts, so none has a file open for writing),
    # made read-only, then changed below before it becomes "/".
    root = spec["root"]
    os.makedirs(root, exist_ok=True)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("/", root, None, MS_BIND | MS_REC)
    _make_readonly(root)
    for path in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(root + path):
            _hide_dir(root + path, "1777")
    for path in spec["hidden_dirs"]:
        _hide_dir(root + path, "0755")
    for path in spec["hidden_files"]:
        _hide_file(root + path)
    for fd, path in binds:
        _bind_writable(fd, root + path)
        os.close(fd)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _pivot_into(root)
    return exit_fd


def run_command(spec: dict) -> None:
    """The child: drop to the workload's identity and exec the command (never returns)."""
    try:
        os.setsid()
        _write_oom_score_adj("0")
        os.setgroups([])
        os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SetupError("cannot set no_new_privs")
        if os.getuid() == 0 or os.geteuid() == 0:
            raise SetupError("still root after dropping privileges")
        os.chdir(spec["working_dir"])
    except (OSError, SetupError) as exc:
        _fail(f"cannot drop to uid {spec['uid']}: {exc}")
        os._exit(SETUP_FAILED)
    command, env = spec["command"], spec["env"]
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec: reset them so that a
    # job's ``yes | head`` ends quietly, as it does outside the sandbox.
    for signum in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(signum, _signal.SIG_DFL)
    try:
        _execvpe(command[0], command, env)
    except FileNotFoundError:
        print(f"gpupool-sandbox: {command[0]}: command not found", file=sys.stderr, flush=True)
        os._exit(127)
    except OSError as exc:
        print(f"gpupool-sandbox: {command[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        os._exit(126)


def _execvpe(file: str, args: list[str], env: dict[str, str]) -> None:
    """``os.execvpe`` without its lazy ``import warnings``: after the uid switch the interpreter's own library
    may be unreadable (a pyenv under ``/root``). Searches ``PATH`` of ``env`` the same way: the first directory
    where the file exists wins; an error other than "not there" is raised if no directory had the file."""
    if "/" in file:
        os.execve(file, args, env)
    saved = last = None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory, file), args, env)
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = exc
        except OSError as exc:
            last = exc
            saved = saved or exc
    raise saved or last or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), file)


def supervise(child: int, exit_fd: int) -> int:
    """PID 1's loop: forward stop signals to the namespace, reap everything, return the command's exit code."""

    def forward(signum: int, _frame: object) -> None:
        with _suppress(ProcessLookupError):
            os.kill(-1, signum)  # from PID 1: every other process of this PID namespace

    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(signum, forward)
    code = None
    while code is None:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            code = SETUP_FAILED
            break
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            if code < 0:
                code = 128 - code
    os.write(exit_fd, str(code).encode())
    os.close(exit_fd)
    return code


def main(argv: list[str]) -> int:
    try:
        spec = load_spec(argv[1])
        exit_fd = setup(spec)
    except (OSError, SetupError, KeyError, ValueError, EOFError, TypeError, IndexError) as exc:
        if _error_fd[0] < 0:
            with _suppress(OSError, IndexError):
                _error_fd[0] = os.open(
                    os.path.join(os.path.dirname(argv[1]), "sandbox_error"), os.O_WRONLY | os.O_CREAT, 0o600
                )
        _fail(f"the sandbox could not be set up: {exc}")
        return SETUP_FAILED
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        run_command(spec)
    return supervise(child, exit_fd)


# --- the init server ------------------------------------------------------------------------------------------

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
#: The largest request the server reads: ``spawn <number> <spec path>``.
REQUEST_BYTES = 8192


def _unshare_and_run(spec_path: str) -> int:
    """What ``unshare --mount --pid --ipc --fork --kill-child`` does, then :func:`main` as the namespace's PID 1:
    this process waits for the init with SIGTERM and SIGINT blocked (the workload's process group gets them; only
    the init acts on them), the init is SIGKILLed if this process dies, and this process ends as the init did."""
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC) != 0:
        with _suppress(OSError):
            _error_fd[0] = os.open(
                os.path.join(os.path.dirname(spec_path), "sandbox_error"), os.O_WRONLY | os.O_CREAT, 0o600
            )
        _fail(f"the sandbox could not be set up: unshare failed: {os.strerror(ctypes.get_errno())}")
        return SETUP_FAILED
    stop_signals = {_signal.SIGINT, _signal.SIGTERM}
    _signal.pthread_sigmask(_signal.SIG_SETMASK, stop_signals)
    init = os.fork()
    if init == 0:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, set())
        _libc.prctl(PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)
        os._exit(main(["sandbox_init", spec_path]))
    while True:
        try:
            _, status = os.waitpid(init, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        _signal.signal(signum, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
    return os.waitstatus_to_exitcode(status)


def _close_inherited_fds() -> None:
    """Close every descriptor above stderr: those open now, listed by the kernel (``closerange`` up to a high bound
    would be a million system calls where Python was built without ``close_range``)."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            with _suppress(OSError):  # the listing's own descriptor, already closed
                os.close(int(name))


def _start_workload(spec_path: str, output_fd: int) -> int:
    """Fork the process the agent tracks for one workload (its own session, output to ``output_fd``); its pid."""
    pid = os.fork()
    if pid != 0:
        return pid
    code = SETUP_FAILED
    try:
        os.setsid()
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        _close_inherited_fds()  # the server's socket, its copies of the output and /dev/null
        code = _unshare_and_run(spec_path)
    finally:
        os._exit(code)


def serve(fd: int) -> int:
    """The init server (``nodeagent.sandbox.InitServer``): one interpreter per agent that has loaded this module
    and forks the sandbox of each workload, instead of an ``unshare`` and a new interpreter per workload.

    On the SOCK_SEQPACKET socket ``fd`` it reads ``spawn <n> <spec path>`` with the workload's output file as an
    SCM_RIGHTS descriptor, answers ``started <n> <pid>``, and ``exit <n> <code>`` (negative: killed by that signal,
    as ``subprocess`` says) when that process ends. It ends when the agent closes the socket; workloads still
    running go on (reparented), as they do when the agent itself ends.
    """
    import array
    import socket

    server = socket.socket(fileno=fd)
    children: dict[int, int] = {}  # pid -> request number

    def reap(_signum: int, _frame: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            number = children.pop(pid, None)
            if number is not None:
                with _suppress(OSError):
                    server.send(f"exit {number} {os.waitstatus_to_exitcode(status)}".encode())

    _signal.signal(_signal.SIGCHLD, reap)
    descriptor_bytes = array.array("i").itemsize
    while True:
        request, ancillary, _flags, _address = server.recvmsg(REQUEST_BYTES, socket.CMSG_SPACE(4 * descriptor_bytes))
        received = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received.frombytes(data[: len(data) - len(data) % descriptor_bytes])
        if not request:
            return 0  # the agent is gone
        number = "0"
        try:
            parts = request.decode().split(" ", 2)
            if len(parts) != 3 or parts[0] != "spawn" or len(received) != 1:
                raise ValueError(f"bad request {request[:80]!r}")
            number, spec_path = parts[1], parts[2]
            # SIGCHLD waits until the child is registered: an exit is never reported before its start.
            _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGCHLD})
            try:
                pid = _start_workload(spec_path, received[0])
                children[pid] = int(number)
                server.send(f"started {number} {pid}".encode())
            finally:
                _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGCHLD})
        except (OSError, ValueError) as exc:
            with _suppress(OSError):
                server.send(f"failed {number} {exc}".encode())
        finally:
            for descriptor in received:
                with _suppress(OSError):
                    os.close(descriptor)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
