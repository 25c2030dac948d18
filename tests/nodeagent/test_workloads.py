"""The workload runner with real processes: env, process groups, grace, max runtime, re-adoption."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from nodeagent import protocol
from nodeagent.launcher import WorkloadRejected, process_start_time, workload_env
from nodeagent.workloads import WorkloadRunner

H100_A = "GPU-4b0e5f1c-2d3a-8e9f-0000-0a1b2c3d4e5f"
H100_B = "GPU-4b0e5f1c-2d3a-8e9f-0001-0a1b2c3d4e5f"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _start(job_id: int = 1, command: list[str] | None = None, **fields) -> protocol.WorkloadStart:
    return protocol.WorkloadStart(
        command_id=fields.pop("command_id", 100 + job_id),
        job_id=job_id,
        replica=fields.pop("replica", 0),
        command=command or [sys.executable, "-c", "print('hello')"],
        **fields,
    )


# A SIGTERM that lands between fork and exec is lost (the SIGKILL after the grace period covers that in real
# life), so tests signal a workload only once it says it runs.
READY_THEN_SLEEP = "import time; print('ready', flush=True); time.sleep(60)"


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _wait_for(predicate, timeout_s: float = 10.0) -> None:
    """Poll for a process-side effect; processes give no event to await."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def _run_until_final(runner: WorkloadRunner, job_id: int = 1, replica: int = 0) -> protocol.WorkloadStatus:
    def final() -> bool:
        runner.poll()
        return not runner.records[(job_id, replica)].active

    _wait_for(final)
    return runner.outbox[-1]


def _ack_all(runner: WorkloadRunner) -> None:
    """The portal acknowledged every report so far."""
    for status in list(runner.outbox):
        runner.outbox.ack(status.report_id)


def _log(runner: WorkloadRunner, job_id: int = 1, replica: int = 0) -> str:
    path = runner.work_dir / "jobs" / f"{job_id}-{replica}" / "output.log"
    return path.read_text() if path.exists() else ""


@pytest.fixture
def runner(tmp_path: Path):
    runner = WorkloadRunner(
        work_dir=tmp_path / "work", base_env={"PATH": os.environ["PATH"], "GPUPOOL_CREDENTIAL": "s"}
    )
    yield runner
    runner.close(stop_workloads=True)


def test_workload_gets_devices_fraction_limits_and_job_env(runner: WorkloadRunner) -> None:
    start = _start(
        command=_python("import json, os; print(json.dumps(dict(os.environ)))"),
        env={"EPOCHS": "3", "CUDA_VISIBLE_DEVICES": "all"},
        devices=[
            protocol.DeviceAssignment(uuid=H100_A, millis=500, memory_mib=40000),
            protocol.DeviceAssignment(uuid=H100_B, millis=250, memory_mib=20000),
        ],
        checkpoint_dir="ckpt",
    )

    runner.start(start)
    status = _run_until_final(runner)

    env = json.loads(_log(runner).strip().splitlines()[-1])
    assert status.state == "succeeded"
    assert status.exit_code == 0
    assert env["CUDA_VISIBLE_DEVICES"] == f"{H100_A},{H100_B}"  # the job cannot override its devices
    assert env["EPOCHS"] == "3"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{H100_A}=40000M,{H100_B}=20000M"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "20000m"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "40000m"
    assert env["GPUPOOL_JOB_ID"] == "1"
    assert env["GPUPOOL_CHECKPOINT_DIR"] == str(runner.work_dir / "jobs" / "1-0" / "ckpt")
    assert Path(env["GPUPOOL_CHECKPOINT_DIR"]).is_dir()
    assert "GPUPOOL_CREDENTIAL" not in env  # the agent's own settings do not leak into jobs


def test_whole_devices_get_no_fraction_limits_and_zero_memory_is_no_limit() -> None:
    whole = workload_env(
        _start(devices=[protocol.DeviceAssignment(uuid=H100_A, millis=1000, memory_mib=81559)]),
        base_env={},
        checkpoint_dir=None,
    )
    unlimited = workload_env(
        _start(devices=[protocol.DeviceAssignment(uuid=H100_A, millis=300, memory_mib=0)]),
        base_env={},
        checkpoint_dir=None,
    )

    assert whole["CUDA_VISIBLE_DEVICES"] == H100_A
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in whole
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in whole
    assert unlimited["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in unlimited  # never "0m"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in unlimited


def test_failing_command_reports_exit_code_and_log_tail(runner: WorkloadRunner) -> None:
    runner.start(
        _start(command=_python("import sys; print('step 1'); print('CUDA OOM', file=sys.stderr); sys.exit(3)"))
    )

    status = _run_until_final(runner)

    assert [s.state for s in runner.outbox] == ["running", "failed"]
    assert status.exit_code == 3
    assert "step 1" in status.log_tail
    assert "CUDA OOM" in status.log_tail
    assert "code 3" in status.message


def test_working_dir_outside_the_work_dir_is_refused_and_reported_failed(runner: WorkloadRunner) -> None:
    with pytest.raises(WorkloadRejected, match="outside the agent's work dir"):
        runner.start(_start(working_dir="../../../etc"))
    with pytest.raises(WorkloadRejected):
        runner.start(_start(job_id=2, working_dir="/tmp"))

    # Nothing ran, but each refusal is a failed workload with its reason, reported so the job ends.
    assert {key: (r.state, r.pid) for key, r in runner.records.items()} == {
        (1, 0): ("failed", None),
        (2, 0): ("failed", None),
    }
    assert [(s.job_id, s.state) for s in runner.outbox] == [(1, "failed"), (2, "failed")]
    assert "outside the agent's work dir" in runner.outbox[0].message
    assert not (runner.work_dir.parent / "etc").exists()


def test_working_dir_inside_the_job_dir_is_used(runner: WorkloadRunner) -> None:
    runner.start(_start(command=_python("import os; print(os.getcwd())"), working_dir="src/train"))

    _run_until_final(runner)

    assert _log(runner).strip() == str(runner.work_dir / "jobs" / "1-0" / "src" / "train")


def test_stop_kills_the_whole_process_group_after_the_grace_period(tmp_path: Path) -> None:
    clock = FakeClock()
    runner = WorkloadRunner(work_dir=tmp_path / "work", clock=clock)
    pid_file = tmp_path / "grandchild.pid"
    stubborn = (
        "import signal, subprocess, sys, time;"
        f"child = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w').write(str(child.pid));"
        "signal.signal(signal.SIGTERM, lambda *a: print('SIGTERM ignored', flush=True));"
        "print('ready', flush=True); time.sleep(60)"
    )
    runner.start(_start(command=_python(stubborn)))
    _wait_for(lambda: "ready" in _log(runner))
    grandchild = int(pid_file.read_text())

    runner.stop(protocol.WorkloadStop(command_id=9, job_id=1, replica=0, grace_s=5, reason="preempted"))
    _wait_for(lambda: "SIGTERM ignored" in _log(runner))
    runner.poll()
    assert runner.records[(1, 0)].active  # still within the grace period

    clock.now += 6
    status = _run_until_final(runner)

    assert status.state == "stopped"
    assert "killed after the grace period" in status.message
    _wait_for(lambda: process_start_time(grandchild) is None)  # the grandchild died with the group


def test_workload_that_exits_on_sigterm_is_stopped_with_its_exit_code(runner: WorkloadRunner) -> None:
    graceful = "import signal, sys; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0));" + READY_THEN_SLEEP
    runner.start(_start(command=_python(graceful)))
    _wait_for(lambda: "ready" in _log(runner))

    runner.stop(protocol.WorkloadStop(command_id=9, job_id=1, replica=0, grace_s=30))
    status = _run_until_final(runner)

    assert (status.state, status.exit_code) == ("stopped", 0)


def test_a_stop_with_a_drain_keeps_the_workload_untouched_until_the_drain_ends(tmp_path: Path) -> None:
    # A serving replica the proxy has just dropped still answers requests routed to it before: its SIGTERM waits.
    clock = FakeClock()
    runner = WorkloadRunner(work_dir=tmp_path / "work", clock=clock)
    noting = "import signal, sys; signal.signal(signal.SIGTERM, lambda *a: (print('term', flush=True), sys.exit(0)));"
    runner.start(_start(command=_python(noting + READY_THEN_SLEEP)))
    _wait_for(lambda: "ready" in _log(runner))

    runner.stop(protocol.WorkloadStop(command_id=9, job_id=1, replica=0, grace_s=30, reason="scale_down", drain_s=2))
    clock.now += 1.5
    runner.poll()
    time.sleep(0.2)
    runner.poll()
    assert runner.records[(1, 0)].active and "term" not in _log(runner)
    assert runner.records[(1, 0)].term_sent_at is None

    # A second stop (the portal resending it) does not postpone the first one's signal.
    runner.stop(protocol.WorkloadStop(command_id=9, job_id=1, replica=0, grace_s=30, reason="scale_down", drain_s=2))
    clock.now += 0.6
    status = _run_until_final(runner)
    assert (status.state, status.exit_code) == ("stopped", 0)
    assert "term" in _log(runner)


def test_the_drain_survives_an_agent_restart_and_the_kill_follows_it(tmp_path: Path) -> None:
    clock = FakeClock()
    work = tmp_path / "work"
    first = WorkloadRunner(work_dir=work, clock=clock)
    stubborn = "import signal; signal.signal(signal.SIGTERM, lambda *a: print('SIGTERM ignored', flush=True));"
    first.start(_start(command=_python(stubborn + READY_THEN_SLEEP)))
    _wait_for(lambda: "ready" in _log(first))
    first.stop(protocol.WorkloadStop(command_id=9, job_id=1, replica=0, grace_s=5, drain_s=3))

    second = WorkloadRunner(work_dir=work, clock=clock)  # the agent restarted during the drain
    second.poll()
    assert second.records[(1, 0)].term_sent_at is None and second.records[(1, 0)].active
    clock.now += 3
    second.poll()
    _wait_for(lambda: "SIGTERM ignored" in _log(second))
    assert second.records[(1, 0)].active  # the grace period runs from the SIGTERM, not from the stop
    clock.now += 5
    status = _run_until_final(second)
    assert status.state == "stopped" and "killed after the grace period" in status.message


def test_max_runtime_is_enforced(tmp_path: Path) -> None:
    clock = FakeClock()
    runner = WorkloadRunner(work_dir=tmp_path / "work", clock=clock, max_runtime_grace_s=1)
    runner.start(_start(command=_python(READY_THEN_SLEEP), max_runtime_s=5))
    _wait_for(lambda: "ready" in _log(runner))
    runner.poll()
    assert runner.records[(1, 0)].active

    clock.now += 6
    status = _run_until_final(runner)

    assert status.state == "failed"
    assert "max runtime of 5 s exceeded" in status.message


def test_restarted_agent_re_adopts_a_running_workload_and_does_not_start_it_twice(tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = WorkloadRunner(work_dir=work)
    start = _start(command=_python("import time; print('ready', flush=True); time.sleep(60)"))
    first.start(start)
    pid = first.records[(1, 0)].pid
    _ack_all(first)
    first.close()  # the agent exits; the workload keeps running

    second = WorkloadRunner(work_dir=work)
    second.start(start)  # the portal resends the unacked start after the reconnect
    second.poll()

    assert [(w.job_id, w.pid, w.state) for w in second.running()] == [(1, pid, "running")]
    assert [s.state for s in second.outbox] == ["running"]
    assert second.records[(1, 0)].pid == pid
    assert len(list((work / "jobs").iterdir())) == 1

    second.stop(protocol.WorkloadStop(command_id=9, job_id=1, replica=0, grace_s=0))
    status = _run_until_final(second)
    assert status.state == "stopped"


def test_restarted_agent_reports_a_workload_that_finished_meanwhile(tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = WorkloadRunner(work_dir=work)
    first.start(_start(command=_python("import sys; print('done'); sys.exit(4)")))
    _ack_all(first)
    first.close()
    _wait_for(lambda: (work / "jobs" / "1-0" / "exit_code").exists())

    second = WorkloadRunner(work_dir=work)
    status = _run_until_final(second)  # the wrapper may still be exiting when the agent comes back

    assert [(s.state, s.exit_code) for s in second.outbox] == [("failed", 4)]
    assert "done" in status.log_tail
    assert second.running() == []


def test_restarted_agent_reports_a_vanished_workload_as_lost(tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = WorkloadRunner(work_dir=work)
    first.start(_start(command=["sleep", "60"]))
    record = first.records[(1, 0)]
    os.killpg(record.pid, 9)  # killed with its wrapper: no exit code written
    _wait_for(lambda: process_start_time(record.pid) is None)
    _ack_all(first)
    first.close()

    second = WorkloadRunner(work_dir=work)

    assert [s.state for s in second.outbox] == ["lost"]


def test_pid_reused_by_another_process_is_not_adopted(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "jobs" / "1-0").mkdir(parents=True)
    me = os.getpid()
    state = {
        "version": 1,
        "workloads": [
            {
                "command_id": 1,
                "job_id": 1,
                "replica": 0,
                "job_dir": str(work / "jobs" / "1-0"),
                "working_dir": str(work / "jobs" / "1-0"),
                "checkpoint_dir": None,
                "pid": me,
                "pid_start_time": (process_start_time(me) or 0) + 1,
                "state": "running",
            }
        ],
    }
    (work / "state.json").write_text(json.dumps(state))

    runner = WorkloadRunner(work_dir=work)

    assert [s.state for s in runner.outbox] == ["lost"]


def test_repeated_start_of_a_finished_command_reports_instead_of_rerunning(runner: WorkloadRunner) -> None:
    start = _start(command=_python("print('once')"))
    runner.start(start)
    _run_until_final(runner)

    runner.start(start)

    assert _log(runner).count("once") == 1
    assert runner.outbox[-1].state == "succeeded"


def _journal(runner: WorkloadRunner) -> list[dict]:
    return [json.loads(line) for line in (runner.work_dir / "finished.jsonl").read_text().splitlines()]


def test_state_json_lists_the_active_workloads_and_the_journal_each_change_of_a_finished_one(
    runner: WorkloadRunner,
) -> None:
    for job_id in (1, 2):
        runner.start(_start(job_id, command=_python("print('hi')")))
        _run_until_final(runner, job_id)
    runner.start(_start(3, command=["sleep", "60"]))
    first = runner.records[(1, 0)]
    first.log_acked = 3  # a field of a finished workload changes (the portal acknowledged its log)
    runner.save()
    state_path = runner.work_dir / "state.json"

    lines = state_path.read_text().splitlines()
    saved = {(raw["job_id"], raw["replica"]): raw for raw in json.loads(state_path.read_text())["workloads"]}

    assert len(lines) == 2 + 1 and list(saved) == [(3, 0)]  # only the running workload, a line each
    journal = _journal(runner)
    assert [(raw["job_id"], raw["state"], raw["log_acked"]) for raw in journal] == [
        (1, "succeeded", 0),
        (2, "succeeded", 0),
        (1, "succeeded", 3),  # appended when it changed; the newest line wins
    ]
    first.message, first.devices = "changed", [{"uuid": H100_A, "millis": 1000, "memory_mib": None}]
    runner.save()
    again = WorkloadRunner(work_dir=runner.work_dir)
    assert again.records[(1, 0)] == first and again.records[(2, 0)] == runner.records[(2, 0)]
    assert again.records[(3, 0)].active
    assert len(_journal(again)) == 4  # reading it back appends nothing


def test_an_agent_stopped_between_the_journal_and_state_json_finds_the_workload_finished(
    runner: WorkloadRunner,
) -> None:
    runner.start(_start(command=_python("print('hi')")))
    state_before_the_end = (runner.work_dir / "state.json").read_text()  # still lists it as running
    _run_until_final(runner)
    (runner.work_dir / "state.json").write_text(state_before_the_end)  # as if killed before the rewrite
    reports = len(runner.outbox)

    again = WorkloadRunner(work_dir=runner.work_dir)

    assert again.records[(1, 0)].state == "succeeded"
    assert len(again.outbox) == reports  # settled from the journal: not reported a second time


def test_a_new_run_of_a_finished_replica_is_in_state_json_and_adopted_after_a_restart(
    runner: WorkloadRunner,
) -> None:
    runner.start(_start(command=_python("print('first run')")))
    _run_until_final(runner)
    runner.start(_start(command=["sleep", "60"], command_id=201))  # rescheduled here after a preemption

    saved = json.loads((runner.work_dir / "state.json").read_text())["workloads"]
    again = WorkloadRunner(work_dir=runner.work_dir)

    assert [(raw["command_id"], raw["state"]) for raw in saved] == [(201, "running")]
    assert again.records[(1, 0)].command_id == 201 and again.records[(1, 0)].active


def test_a_step_and_a_save_look_at_the_active_workloads_not_at_the_finished_ones(runner: WorkloadRunner) -> None:
    """An agent keeps a day of finished workloads; its step and its saves cost the same whatever that holds
    (``benchmarks/agent_job_cpu.py --finished``): only active workloads and those put since the last save are
    looked at. A finished one changed behind the runner's back (no ``save(keys=…)``) is therefore not saved."""
    for job_id in (1, 2):
        runner.start(_start(job_id, command=_python("print('hi')")))
        _run_until_final(runner, job_id)
    runner.start(_start(3, command=["sleep", "60"], devices=[protocol.DeviceAssignment(uuid=H100_A, millis=500)]))
    first, second = runner.records[(1, 0)], runner.records[(2, 0)]

    assert runner.active_records() == [runner.records[(3, 0)]]
    assert [load.pid for load in runner.loads()] == [runner.records[(3, 0)].pid]
    first.log_acked = second.log_acked = 3  # the portal acknowledged both logs; the agent names only the first
    runner.poll()
    runner.save(keys=[(1, 0)])

    again = WorkloadRunner(work_dir=runner.work_dir)
    assert again.records[(1, 0)].log_acked == 3
    assert again.records[(2, 0)].log_acked == 0
    assert [record.key for record in again.active_records()] == [(3, 0)]


def test_the_log_shipper_is_offered_a_run_until_it_is_done_and_a_new_run_of_it_again(runner: WorkloadRunner) -> None:
    runner.start(_start(command=_python("print('hi')")))
    _run_until_final(runner)
    assert [record.key for record in runner.log_sources()] == [(1, 0)]

    runner.log_done((1, 0))
    assert runner.log_sources() == []
    restarted = WorkloadRunner(work_dir=runner.work_dir)  # offered again: it may have output not yet shipped
    assert [record.key for record in restarted.log_sources()] == [(1, 0)]

    runner.start(_start(command=["sleep", "60"], command_id=201))  # placed here again after a preemption
    assert [(record.key, record.command_id) for record in runner.log_sources()] == [((1, 0), 201)]


def test_the_journal_is_compacted_and_a_line_cut_short_is_skipped(runner: WorkloadRunner) -> None:
    runner.start(_start(command=_python("print('hi')")))
    _run_until_final(runner)
    record = runner.records[(1, 0)]
    for offset in range(1, 80):
        record.log_acked = offset
        runner.save()
    assert len(_journal(runner)) < 70  # compacted: a line per finished workload, plus what came since

    with (runner.work_dir / "finished.jsonl").open("a") as journal:
        journal.write('{"command_id": 9, "job_id"')  # a crash while appending
    again = WorkloadRunner(work_dir=runner.work_dir)
    assert again.records[(1, 0)].log_acked == 79


def test_loads_describe_running_workloads_for_the_simulator(runner: WorkloadRunner) -> None:
    runner.start(_start(command=["sleep", "60"], devices=[protocol.DeviceAssignment(uuid=H100_A, millis=500)]))

    (load,) = runner.loads()

    assert (load.uuid, load.millis, load.pid) == (H100_A, 500, runner.records[(1, 0)].pid)


def test_closing_with_stop_workloads_ends_them_even_if_they_ignore_sigterm(tmp_path: Path) -> None:
    runner = WorkloadRunner(work_dir=tmp_path / "work")
    runner.start(_start(job_id=1, command=_python(READY_THEN_SLEEP)))
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN);" + READY_THEN_SLEEP
    runner.start(_start(job_id=2, command=_python(stubborn)))
    _wait_for(lambda: "ready" in _log(runner, 1) and "ready" in _log(runner, 2))
    pids = [runner.records[(job, 0)].pid for job in (1, 2)]

    runner.close(stop_workloads=True, grace_s=0.5)

    assert [runner.records[(job, 0)].state for job in (1, 2)] == ["stopped", "stopped"]
    assert all(process_start_time(pid) is None for pid in pids)


def test_unacknowledged_reports_survive_a_restart_with_their_report_ids(tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = WorkloadRunner(work_dir=work)
    first.start(_start(command=_python("import sys; sys.exit(2)")))
    _run_until_final(first)
    reports = [(s.report_id, s.state) for s in first.outbox]
    first.outbox.ack(reports[0][0])  # the portal acknowledged "running" only
    first.close()

    second = WorkloadRunner(work_dir=work)

    assert [(s.report_id, s.state) for s in second.outbox] == reports[1:]
    assert reports[0][0] < reports[1][0]
    # The hello lists the finished workload whose report is unacknowledged, with its exit code.
    assert [(w.job_id, w.state, w.exit_code) for w in second.known()] == [(1, "failed", 2)]
    second.outbox.ack(reports[1][0])
    assert second.known() == []
    assert second.start(_start(job_id=2, command=_python("pass"))) is None
    assert second.outbox[-1].report_id > reports[1][0]


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"A=B": "1"}, "'A=B' is not valid"),
        ({"1ABC": "1"}, "'1ABC' is not valid"),
        ({"A\0B": "1"}, "is not valid"),
        ({"GOOD": "a\0b"}, "NUL character"),
    ],
)
def test_a_bad_environment_is_refused_and_reported_failed_with_the_reason(
    runner: WorkloadRunner, env: dict, reason: str
) -> None:
    with pytest.raises(WorkloadRejected, match=reason):
        runner.start(_start(env=env))

    [status] = list(runner.outbox)
    assert (status.state, status.job_id) == ("failed", 1)
    assert reason in status.message


def test_a_missing_command_or_working_dir_that_cannot_be_made_is_reported_failed(runner: WorkloadRunner) -> None:
    runner.start(_start(command=["/nonexistent/binary"]))
    status = _run_until_final(runner)
    assert (status.state, status.exit_code) == ("failed", 127)
    assert "not found" in status.message

    (runner.work_dir / "jobs" / "2-0").mkdir(parents=True)
    (runner.work_dir / "jobs" / "2-0" / "src").write_text("a file where a directory should be")
    with pytest.raises(WorkloadRejected, match="could not start"):
        runner.start(_start(job_id=2, working_dir="src/train"))
    assert runner.outbox[-1].state == "failed" and "could not start" in runner.outbox[-1].message
