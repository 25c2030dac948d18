#!/usr/bin/env python3
"""gpupool-rsh: how ``mpirun`` on replica 0 of an MPI job starts its daemons on the other replicas' nodes.

Open MPI's ``mpirun`` starts one ``orted`` per remote host through an "rsh agent" (``ssh`` by default); the
MPI Operator runs ``sshd`` in every worker pod for it, Slurm lends ``srun``. A job with ``"launcher": "mpi"``
gets this standard-library script in its job dir instead (the agent copies it there; it imports nothing of
gpupool's, so any ``python3`` on the node runs it as the job's uid), and:

* replica 0 runs ``gpupool-rsh launch -- <the job's command>``: the command (``mpirun …``) with
  ``OMPI_MCA_plm_rsh_agent`` pointing here, while this process holds the replica's own port open as the sign
  that the launcher is alive; it exits with the command's exit code;
* every other replica runs ``gpupool-rsh serve``: it listens on the replica's own port (``GPUPOOL_PORT``) and
  runs what the launcher's ``gpupool-rsh HOST COMMAND…`` calls send (``/bin/sh -c``, as sshd would), streaming
  the output back and then the exit code; it exits once the launcher is gone, with the first non-zero exit
  code of what it ran (0 when all succeeded or nothing was sent);
* ``gpupool-rsh HOST COMMAND…`` (what ``mpirun`` calls) connects to the replica on ``HOST`` (from
  ``TF_CONFIG``'s worker list, which names every replica's address and port), retrying while it starts.

Every call carries the job's ``GPUPOOL_LAUNCH_TOKEN``; a connection without it is closed. The node agents'
network isolation keeps other tenants' jobs from these ports in any case.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

#: How long a call keeps trying to reach a replica whose server is still starting.
CONNECT_RETRY_S = 60.0
#: How often a worker checks that the launcher (replica 0) still runs.
LAUNCHER_POLL_S = 0.5
#: A worker whose launcher never showed up stops waiting after this long.
LAUNCHER_START_S = 120.0
OUTPUT, EXIT = b"o", b"x"
#: Where the launcher and the servers put a copy of this script: the same path on every node (a sandboxed job's
#: private /tmp; ``$TMPDIR`` where one is set).
STABLE_PATH = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"gpupool-{os.getuid()}", "gpupool-rsh")


def _replicas() -> list[tuple[str, int]]:
    """Every replica's (address, port), by replica index (TF_CONFIG's worker list in the launch contract)."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = config.get("cluster", {}).get("worker", [])
    result = []
    for item in workers:
        host, _, port = str(item).rpartition(":")
        result.append((host.strip("[]"), int(port)))
    if not result:
        raise SystemExit("gpupool-rsh: no TF_CONFIG worker list: run it in a gpupool job with launcher 'mpi'")
    return result


def _token() -> bytes:
    token = os.environ.get("GPUPOOL_LAUNCH_TOKEN", "")
    if not token:
        raise SystemExit("gpupool-rsh: GPUPOOL_LAUNCH_TOKEN is not set")
    return token.encode()


def _listen(port: int) -> socket.socket:
    server = socket.socket(socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if server.family == socket.AF_INET6:
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    server.bind(("", port))
    server.listen(64)
    return server


def _frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!I", len(payload)) + payload


def _read_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


# --- replica 0: the launcher ------------------------------------------------------------------------------


def launch(command: list[str]) -> int:
    """Run ``command`` (mpirun) with this script as Open MPI's rsh agent; hold the replica's port meanwhile."""
    if not command:
        raise SystemExit("gpupool-rsh launch: give the command after --")
    port = int(os.environ["GPUPOOL_PORT"])
    server = _listen(port)

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()  # a worker asking whether the launcher is alive

    threading.Thread(target=answer, daemon=True).start()
    process = subprocess.Popen(command)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: process.send_signal(s))
    code = process.wait()
    server.close()
    _say_goodbye()
    return code if code >= 0 else 128 - code


def _say_goodbye() -> None:
    """Tell every other replica's server that the launcher is done, so it exits now rather than at its next
    look (a server that missed this finds the launcher's port closed)."""
    message = json.dumps({"token": _token().decode(), "bye": True}).encode() + b"\n"
    for address, port in _replicas()[1:]:
        try:
            with socket.create_connection((address, port), timeout=2) as conn:
                conn.sendall(message)
        except OSError:
            pass


# --- other replicas: the servers ----------------------------------------------------------------------------


class _Server:
    def __init__(self) -> None:
        self.token = _token()
        self.replicas = _replicas()
        self.codes: list[int] = []
        self.running = 0
        self.heard = False  # the launcher has called
        self.done = False  # the launcher said it is done
        self.lock = threading.Lock()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30)
                header = b""
                while not header.endswith(b"\n") and len(header) < 1 << 20:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    header += chunk
                request = json.loads(header)
                if not hmac.compare_digest(str(request.get("token", "")).encode(), self.token):
                    return
                conn.settimeout(None)
            except (OSError, ValueError):
                return
            self.heard = True  # only the launcher knows the token
            if request.get("bye"):
                self.done = True
                return
            with self.lock:
                self.running += 1
            process = subprocess.Popen(
                ["/bin/sh", "-c", str(request["command"])],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            watcher = threading.Thread(target=self._kill_when_closed, args=(conn, process), daemon=True)
            watcher.start()
            try:
                for chunk in iter(lambda: process.stdout.read1(65536), b""):
                    conn.sendall(_frame(OUTPUT, chunk))
            except OSError:
                pass
            code = process.wait()
            code = code if code >= 0 else 128 - code
            with contextlib.suppress(OSError):
                conn.sendall(_frame(EXIT, struct.pack("!i", code)))
            with self.lock:
                self.running -= 1
                self.codes.append(code)

    @staticmethod
    def _kill_when_closed(conn: socket.socket, process: subprocess.Popen) -> None:
        """The caller (mpirun's rsh child) went away: end what it started, as sshd does."""
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)

    def launcher_alive(self) -> bool:
        host, port = self.replicas[0]
        try:
            with socket.create_connection((host, port), timeout=2):
                return True
        except OSError:
            return False


def serve() -> int:
    """Run commands for the launcher until it has gone; exit with the first failure's code, else 0."""
    state = _Server()
    listener = _listen(int(os.environ["GPUPOOL_PORT"]))

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=state.handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    started = time.monotonic()
    seen = False
    while True:
        time.sleep(LAUNCHER_POLL_S)
        with state.lock:
            busy = state.running > 0
        if busy:
            continue
        if state.done:
            break
        alive = state.launcher_alive()
        seen = seen or alive or state.heard
        if seen and not alive:
            break
        if not seen and time.monotonic() - started > LAUNCHER_START_S:
            print("gpupool-rsh: the launcher (replica 0) never answered", file=sys.stderr)
            return 1
    listener.close()
    failures = [code for code in state.codes if code != 0]
    return failures[0] if failures else 0


# --- the rsh agent: what mpirun calls -----------------------------------------------------------------------


def call(host: str, words: list[str]) -> int:
    """Run ``words`` (a remote shell command, as ssh takes it) on the replica at ``host``; its exit code."""
    replicas = _replicas()
    targets = [(address, port) for index, (address, port) in enumerate(replicas) if index and address == host]
    if not targets:
        print(f"gpupool-rsh: no replica of this job runs on {host!r}", file=sys.stderr)
        return 255
    address, port = targets[0]
    deadline = time.monotonic() + CONNECT_RETRY_S
    while True:
        try:
            conn = socket.create_connection((address, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                print(f"gpupool-rsh: the replica at {address}:{port} does not answer", file=sys.stderr)
                return 255
            time.sleep(0.5)
    with conn:
        conn.settimeout(None)
        request = {"token": _token().decode(), "command": " ".join(words)}
        conn.sendall(json.dumps(request).encode() + b"\n")
        out = sys.stdout.buffer
        try:
            while True:
                kind = _read_exact(conn, 1)
                (size,) = struct.unpack("!I", _read_exact(conn, 4))
                payload = _read_exact(conn, size)
                if kind == OUTPUT:
                    out.write(payload)
                    out.flush()
                elif kind == EXIT:
                    return struct.unpack("!i", payload)[0]
        except ConnectionError:
            return 255


def _install_stable_copy() -> None:
    """Copy this script to :data:`STABLE_PATH` and point Open MPI at it there: mpirun passes its rsh agent's path
    on to every daemon, and each replica's job dir has another path, while ``/tmp`` (the sandbox's own) is the
    same path on every node. Tree spawn is off: only mpirun calls the agent."""
    folder = os.path.dirname(STABLE_PATH)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    temporary = f"{STABLE_PATH}.{os.getpid()}.tmp"
    with open(__file__, "rb") as source, open(temporary, "wb") as target:
        target.write(source.read())
    os.chmod(temporary, 0o755)
    os.replace(temporary, STABLE_PATH)
    for name in ("OMPI_MCA_plm_rsh_agent", "PRTE_MCA_plm_ssh_agent"):
        os.environ[name] = STABLE_PATH
    os.environ["OMPI_MCA_PLM_RSH_NO_TREE_SPAWN"] = "1"


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] in ("serve", "launch"):
        _install_stable_copy()
    if len(argv) >= 2 and argv[1] == "serve":
        return serve()
    if len(argv) >= 2 and argv[1] == "launch":
        rest = argv[2:]
        return launch(rest[1:] if rest[:1] == ["--"] else rest)
    if len(argv) >= 3:
        return call(argv[1], argv[2:])
    print("usage: gpupool-rsh serve | gpupool-rsh launch -- COMMAND... | gpupool-rsh HOST COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
