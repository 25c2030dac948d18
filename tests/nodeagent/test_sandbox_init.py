"""The sandbox's init starts cheaply (one interpreter per workload) and still finds and runs the command."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodeagent import protocol, sandbox_init
from nodeagent.agent import Agent, AgentSettings
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.journal import WorkloadRecord
from nodeagent.sandbox import INIT_SCRIPT, Sandbox, SandboxConfig, ServedProcess, write_spec
from nodeagent.workloads import WorkloadRunner
from tests.nodeagent.sandboxing import SANDBOX_AVAILABLE

#: What the init must not import: slow to load (``json`` pulls in ``re`` and ``enum``; ``ctypes.util`` runs
#: ``ldconfig``), or loaded lazily after the switch to the workload's uid, which may not be able to read the
#: interpreter's library any more (``os.execvpe`` imports ``warnings``).
HEAVY = {"json", "re", "enum", "functools", "collections", "contextlib", "ctypes.util", "signal", "warnings"}


def test_the_init_imports_only_what_it_needs_and_nothing_lazily() -> None:
    code = f"import sys; sys.path.append({str(INIT_SCRIPT.parent)!r}); import sandbox_init; print(*sys.modules)"

    result = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)

    modules = set(result.stdout.split())
    assert "sandbox_init" in modules and "ctypes" in modules
    assert modules & HEAVY == set()


def test_the_spec_reads_back_as_written_and_only_root_may_read_it(tmp_path: Path) -> None:
    spec = {"uid": 200_001, "command": ["sh", "-c", "echo é"], "env": {"A": "1"}, "hidden_files": [], "x": None}
    path = tmp_path / "spec.marshal"

    write_spec(path, spec)

    assert sandbox_init.load_spec(str(path)) == spec
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def _exec_in_child(file: str, path: str) -> int:
    """Run ``sandbox_init._execvpe(file, ...)`` in a forked child; its exit code (126/127 for the errors)."""
    child = os.fork()
    if child == 0:
        try:
            sandbox_init._execvpe(file, [file, "-c", "exit 7"], {"PATH": path})
        except FileNotFoundError:
            os._exit(127)
        except PermissionError:
            os._exit(126)
        finally:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])


def test_the_command_is_searched_in_the_jobs_path_like_execvpe(tmp_path: Path) -> None:
    not_executable = tmp_path / "noexec"
    not_executable.mkdir()
    (not_executable / "sh").write_text("#!/bin/sh\nexit 3\n")
    shell_dir = str(Path("/bin/sh").resolve().parent)

    assert _exec_in_child("sh", f"{tmp_path}/missing:{shell_dir}") == 7
    assert _exec_in_child("sh", f"{not_executable}:{shell_dir}") == 7  # permission denied, then found later
    assert _exec_in_child("sh", str(not_executable)) == 126  # only a file it may not run: that error
    assert _exec_in_child("no-such-command-gpupool", f"{tmp_path}:{shell_dir}") == 127
    assert _exec_in_child("/bin/sh", "") == 7  # a path is run as it is


@pytest.mark.skipif(not SANDBOX_AVAILABLE, reason="the sandbox needs root and util-linux unshare")
def test_a_sandboxed_command_is_found_in_path_as_the_workloads_uid(tmp_path: Path) -> None:
    sandbox = Sandbox(SandboxConfig(pids_max=64), work_dir=tmp_path / "work")
    runner = WorkloadRunner(work_dir=tmp_path / "work", sandbox=sandbox)
    try:
        for job_id, command in ((1, ["true"]), (2, ["no-such-command-gpupool"])):
            runner.start(protocol.WorkloadStart(command_id=job_id, job_id=job_id, replica=0, command=command))
        deadline = time.monotonic() + 20
        while any(record.active for record in runner.records.values()):
            assert time.monotonic() < deadline, "the workloads did not finish"
            runner.poll()
            time.sleep(0.02)
        found, missing = runner.records[(1, 0)], runner.records[(2, 0)]
        assert (found.state, found.exit_code) == ("succeeded", 0)
        assert (missing.state, missing.exit_code, missing.reason) == ("failed", 127, "")
        assert "command not found" in (Path(missing.job_dir) / "output.log").read_text()
    finally:
        runner.close(stop_workloads=True, grace_s=2)


# --- the init server ------------------------------------------------------------------------------------------

#: What a workload can tell of how it was started: descriptors, signal dispositions, identity, its PID namespace.
PROBE = (
    "ls /proc/self/fd | wc -l; readlink /proc/self/fd/0; grep -E '^(Sig(Blk|Ign|Cgt)|Uid|Gid|Groups|CapEff|CapBnd"
    "|NoNewPrivs)' /proc/self/status; echo pid=$$ ppid=$PPID; umask; ulimit -n"
)


def _runner(tmp_path: Path, name: str, **config) -> WorkloadRunner:
    work_dir = tmp_path / name
    return WorkloadRunner(work_dir=work_dir, sandbox=Sandbox(SandboxConfig(pids_max=64, **config), work_dir=work_dir))


def _finish(runner: WorkloadRunner, job_id: int) -> WorkloadRecord:
    deadline = time.monotonic() + 20
    while runner.records[(job_id, 0)].active:
        assert time.monotonic() < deadline, f"job {job_id} did not finish"
        runner.poll()
        time.sleep(0.02)
    return runner.records[(job_id, 0)]


def _start(runner: WorkloadRunner, job_id: int, script: str) -> None:
    runner.start(protocol.WorkloadStart(command_id=job_id, job_id=job_id, replica=0, command=["/bin/sh", "-c", script]))


@pytest.mark.skipif(not SANDBOX_AVAILABLE, reason="the sandbox needs root and util-linux unshare")
def test_the_init_server_gives_a_workload_the_same_sandbox_as_unshare(tmp_path: Path) -> None:
    seen = {}
    for server in (True, False):
        runner = _runner(tmp_path, f"server-{server}", init_server=server)
        try:
            _start(runner, 1, PROBE)
            assert isinstance(runner._popen[(1, 0)], ServedProcess) is server
            record = _finish(runner, 1)
            assert (record.state, record.exit_code) == ("succeeded", 0)
            seen[server] = (Path(record.job_dir) / "output.log").read_text()
        finally:
            runner.close(stop_workloads=True, grace_s=2)

    assert seen[True] == seen[False]
    assert "pid=2 ppid=1" in seen[True] and "NoNewPrivs:\t1" in seen[True]


@pytest.mark.skipif(not SANDBOX_AVAILABLE, reason="the sandbox needs root and util-linux unshare")
def test_a_workload_outlives_its_init_server_and_the_next_one_gets_a_new_server(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "work")
    try:
        _start(runner, 1, "sleep 0.5; exit 3")
        server = runner.sandbox._server
        assert server is not None and server._process is not None
        server._process.kill()  # the server dies (an OOM kill, a bug); the workload runs on

        first = _finish(runner, 1)
        _start(runner, 2, "exit 4")
        assert isinstance(runner._popen[(2, 0)], ServedProcess)
        second = _finish(runner, 2)
    finally:
        runner.close(stop_workloads=True, grace_s=2)

    assert (first.state, first.exit_code) == ("failed", 3)  # read from its exit code file
    assert (second.state, second.exit_code) == ("failed", 4)


@pytest.mark.skipif(not SANDBOX_AVAILABLE, reason="the sandbox needs root and util-linux unshare")
def test_a_server_that_cannot_start_leaves_the_workload_to_unshare(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("nodeagent.sandbox.SERVER_BOOTSTRAP", "import sys; sys.exit(3)")
    runner = _runner(tmp_path, "work")
    try:
        _start(runner, 1, "id -u")
        assert isinstance(runner._popen[(1, 0)], subprocess.Popen)
        record = _finish(runner, 1)
        _start(runner, 2, "true")  # for a while the server is not tried again (no second interpreter per job)
        assert isinstance(runner._popen[(2, 0)], subprocess.Popen)
        assert runner.sandbox._server._process is None
        assert _finish(runner, 2).state == "succeeded"
    finally:
        runner.close(stop_workloads=True, grace_s=2)

    assert (record.state, record.exit_code) == ("succeeded", 0)
    assert (Path(record.job_dir) / "output.log").read_text().strip() == str(record.uid)


class _AgentKilled(BaseException):
    """Stands for a SIGKILL of the agent at one line of its code (not an Exception: nothing catches it)."""


@pytest.mark.skipif(not SANDBOX_AVAILABLE, reason="the sandbox needs root and util-linux unshare")
@pytest.mark.parametrize("killed_at", ["state.json", "the cleanup"])
def test_an_agent_killed_while_recording_a_workloads_end_reports_the_same_end_after_a_restart(
    tmp_path: Path, killed_at: str
) -> None:
    """Found by CI (stop 19): the agent cleaned the sandbox (its exit code file too) before saving the end in
    ``state.json``; killed in between, the next agent found the workload active, no exit code, and said "lost"."""
    runner = _runner(tmp_path, "work")
    _start(runner, 1, "exit 5")

    def die(*args, **kwargs) -> None:
        raise _AgentKilled

    if killed_at == "state.json":
        runner._save = die
    else:
        runner.sandbox.cleanup = die
    try:
        with pytest.raises(_AgentKilled):
            _finish(runner, 1)
    finally:
        runner.sandbox.close()  # its init server; nothing else of the killed agent runs on
    assert [report.state for report in runner.outbox][-1] == "failed"  # reported before it was killed

    again = WorkloadRunner(
        work_dir=runner.work_dir, sandbox=Sandbox(SandboxConfig(pids_max=64), work_dir=runner.work_dir)
    )
    try:
        record = again.records[(1, 0)]
        assert (record.state, record.exit_code) == ("failed", 5)
        assert [(report.state, report.exit_code) for report in again.outbox][-1] == ("failed", 5)
        assert not (again.sandbox.control_dir / record.cgroup).exists()  # the job's spec (its environment) gone
    finally:
        again.close(stop_workloads=True, grace_s=2)


# --- the agent wakes when a workload ends ---------------------------------------------------------------------


class _IdleConnection:
    """A connection on which nothing arrives: ``wait`` sleeps its whole timeout, as a quiet WebSocket does."""

    closed = False

    async def wait(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)


def _waits_until_it_ends(runner: WorkloadRunner) -> float:
    """How long the agent's loop sleeps, asked to sleep a minute, while job 1 (``sleep 0.3``) runs."""
    agent = Agent(
        settings=AgentSettings(node_name="wake-00"),
        backend=SimulatedBackend(node_name="wake-00", cards=1),
        runner=runner,
        connector=None,
    )
    agent.connection = _IdleConnection()

    async def wait() -> float:
        started = time.monotonic()
        await agent._wait(60.0, asyncio.Event())
        return time.monotonic() - started

    _start(runner, 1, "sleep 0.3")
    return asyncio.run(wait())


@pytest.mark.parametrize(
    "sandboxed",
    [
        pytest.param(
            {"init_server": True},
            id="init-server",
            marks=pytest.mark.skipif(not SANDBOX_AVAILABLE, reason="the sandbox needs root and util-linux unshare"),
        ),
        pytest.param(
            {"init_server": False},
            id="unshare",
            marks=pytest.mark.skipif(not SANDBOX_AVAILABLE, reason="the sandbox needs root and util-linux unshare"),
        ),
        pytest.param(None, id="no-sandbox"),
    ],
)
def test_the_agents_loop_wakes_when_a_workload_ends_not_at_its_next_step(tmp_path: Path, sandboxed) -> None:
    # Before, an ended workload was noticed at the next step, up to MAX_TICK_DELAY_S later (a second), and its
    # job's cards stayed held that long: for short jobs, most of the time a card was taken.
    runner = WorkloadRunner(work_dir=tmp_path / "work") if sandboxed is None else _runner(tmp_path, "work", **sandboxed)
    try:
        slept = _waits_until_it_ends(runner)
        runner.poll()
        record = runner.records[(1, 0)]
        assert runner.exit_fds() == []  # nothing left to wake for
    finally:
        runner.close(stop_workloads=True, grace_s=2)

    assert slept < 30, f"the loop slept {slept:.1f} s of its 60 s although the workload ended after 0.3 s"
    assert (record.state, record.exit_code) == ("succeeded", 0)
