"""Run the portal's workloads as local processes, and never lose or double-start one: the runner that steps them.

The runner holds the node's workloads (:class:`~nodeagent.journal.WorkloadRecord`, by job and replica) and answers
the portal's ``workload.start`` and ``workload.stop``. Its two helpers each keep one invariant of their own:
:class:`~nodeagent.launcher.Launcher` makes and spawns a workload (nothing it runs reaches outside what its job was
given), :class:`~nodeagent.journal.Journal` keeps ``state.json`` and ``finished.jsonl`` (an agent restarted while a
workload ran re-adopts it: same pid *and* start time, so a recycled pid is not mistaken for ours; it reports the
others as finished, from their exit code file, or lost).

The runner never sleeps: :meth:`WorkloadRunner.poll` does one step (reap exits, enforce ``max_runtime_s``,
escalate SIGTERM to SIGKILL after the grace period) and the agent calls it every tick. Status changes go to
the durable :attr:`WorkloadRunner.outbox` (``nodeagent.outbox``) until the portal acknowledges them. The invariant
the runner keeps: a final status is journalled in the outbox before the workload's finished line is appended to
``finished.jsonl``, and that line before ``state.json`` drops the workload, so an agent killed in between
re-settles the workload and reports it again rather than never, or finds it finished.

A workload that cannot start — a bad environment variable name, a working dir that cannot be made, a
missing interpreter, permission denied — is recorded as ``failed`` with the reason and reported like any
other end, so its job fails and its devices are released; a command that is not found or not executable
exits 127 or 126 from the wrapper and is reported ``failed`` with that explanation.

A sandboxed workload (``gpupool-agent run``'s default) killed by the kernel for exceeding its memory limit is
reported ``failed`` with reason ``oom_killed``; one whose sandbox could not be made, ``failed`` with reason
``sandbox_failed`` — it never runs unconfined.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from nodeagent import protocol
from nodeagent.backends.base import WorkloadLoad
from nodeagent.journal import Journal, Records, WorkloadRecord
from nodeagent.launcher import (
    EXIT_CODE_FILE,
    LOG_FILE,
    Launcher,
    WorkloadRejected,
    inside,
    process_start_time,
)
from nodeagent.logstream import open_output
from nodeagent.netpolicy import IsolationMode, NetworkIsolation, NetworkPolicyError
from nodeagent.outbox import OUTBOX_FILE, ReportOutbox
from nodeagent.outputs import OutputCollector
from nodeagent.sandbox import Sandbox, SandboxError, SandboxMode, ServedProcess

log = logging.getLogger(__name__)

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

#: Shell exit codes of a command that could not be run (the wrapper is ``/bin/sh``).
_SHELL_EXIT_MEANINGS = {
    126: "the command is not executable (permission denied)",
    127: "the command was not found",
}


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


class WorkloadRunner:
    """The node's workloads and the step that follows them: starts through :attr:`launcher`, every change saved
    through :attr:`journal` and reported through :attr:`outbox`. The in-memory maps it keeps (process handles,
    deferred starts, checkpoint scan times) have different lifetimes and none survives a restart."""

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
        #: podman or docker for jobs that name an image (``nodeagent.containers.find_runtime``); None: refused.
        self.container_runtime = container_runtime
        self.clock = clock
        self.launcher = Launcher(
            work_dir=self.work_dir,
            sandbox=self.sandbox,
            base_env=os.environ if base_env is None else base_env,
            device_indices=device_indices or {},
            env_denylist=env_denylist,
            container_runtime=container_runtime,
            shared_storage=Path(shared_storage).resolve() if shared_storage else None,
        )
        self.max_runtime_grace_s = max_runtime_grace_s
        self.checkpoint_scan_s = checkpoint_scan_s
        #: When each running workload's checkpoint dir is looked at next (:meth:`_report_checkpoint`).
        self._next_checkpoint_scan: dict[tuple[int, int], float] = {}
        #: Starts waiting for an earlier run of the same replica to end (:meth:`_supersede`); in memory only: after a
        #: restart the portal's reconcile requeues a run the node no longer has.
        self._deferred: dict[tuple[int, int], protocol.WorkloadStart] = {}
        self.journal = Journal(self.work_dir)
        #: The node's workloads by (job, replica): the journal's, which it writes to disk.
        self.records: Records = self.journal.records
        #: The processes this agent spawned (a workload adopted after a restart is followed by pid instead).
        self._popen: dict[tuple[int, int], subprocess.Popen | ServedProcess] = {}
        #: A pidfd of each process in ``_popen`` started without the init server (:meth:`exit_fds`).
        self._pidfds: dict[tuple[int, int], int] = {}
        self._next_forget_at = float("-inf")
        #: Status reports the portal has not acknowledged yet, kept on disk (``outbox.jsonl``).
        self.outbox = ReportOutbox(self.work_dir / OUTBOX_FILE, clock=clock)
        #: Keeps other tenants' jobs from this node's workloads' sockets; only sandboxed workloads (own uid) are
        #: isolated. None: nothing (``--network-isolation none``, and library users such as tests).
        self.network = network if network is not None and network.mode != IsolationMode.NONE else None
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
        return self.launcher.sandbox_mode

    @property
    def state_path(self) -> Path:
        return self.journal.state_path

    @property
    def finished_path(self) -> Path:
        return self.journal.finished_path

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
        return self.journal.active_records()

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
        """Write the journal (:meth:`nodeagent.journal.Journal.save`): every change of a workload passes here."""
        self.journal.save(everything=everything)

    def _adopt(self) -> None:
        """Load the state file of a previous run: re-adopt live workloads, settle the ones that ended."""
        self.journal.load_finished()
        saved = self.journal.read_state()
        if saved is None:
            return
        for record in saved:
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
        record, process = self.launcher.spawn(start, job_dir, before_run=lambda record: self._sync_network(also=record))
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
            record.working_dir,
            record.sandbox,
            f", uid {record.uid}" if record.uid is not None else "",
        )
        self._report(record)

    def stop(self, stop: protocol.WorkloadStop) -> None:
        """SIGTERM the workload's process group ``drain_s`` from now (now, without a drain) and SIGKILL it
        ``grace_s`` after that if it still runs."""
        record = self.records.get((stop.job_id, stop.replica))
        if record is None:
            log.info("workloads: stop for unknown job %s replica %s ignored", stop.job_id, stop.replica)
            return
        if not record.active:
            self._report(record)
            return
        if record.stop_reason != protocol.FENCED:  # a fenced stop stays one: the portal requeues its job
            record.stop_reason = stop.reason
        if stop.drain_s > 0 and record.term_sent_at is None:
            # The proxy has dropped it; requests already routed to it finish before it is told to go (poll sends
            # the SIGTERM). A second stop never postpones the first one's signal.
            term_at = self.clock() + stop.drain_s
            record.term_after = term_at if record.term_after is None else min(record.term_after, term_at)
            deadline = record.term_after + max(0.0, stop.grace_s)
            record.kill_after = deadline if record.kill_after is None else min(record.kill_after, deadline)
            self._save()
            return
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
            if record.term_after is not None and record.term_sent_at is None and now >= record.term_after:
                self._terminate(record, grace_s=(record.kill_after or now) - now)
            if record.kill_after is not None and now >= record.kill_after:
                log.warning("workloads: job %s replica %s ignored SIGTERM; SIGKILL", record.job_id, record.replica)
                self._signal(record, signal.SIGKILL)
                record.kill_after = None
                record.message = (record.message + "; " if record.message else "") + "killed after the grace period"
                self._save()
            self._report_checkpoint(record, now)
        self._start_deferred()
        self._forget_old(now)
        if self.network is not None and self.network.linger_over():
            with contextlib.suppress(NetworkPolicyError):  # logged; the next change tries again
                self._sync_network()

    def exit_fds(self) -> list[int]:
        """Descriptors that turn readable when a workload this agent started may have ended: the init server's
        answer socket (while it runs workloads) and a pidfd of each workload started without it. The agent's loop
        waits on them too, so an end is reported at once, not at its next step (up to a second later, the job's
        cards held all that while). A workload adopted after a restart is followed by the step alone."""
        fds: list[int] = []
        served = False
        for key, process in self._popen.items():
            record = self.records.get(key)
            if record is None or not record.active:
                continue  # only what the step follows: anything else readable would wake the loop for nothing
            if isinstance(process, ServedProcess):
                served = True
                continue
            if process.returncode is not None:
                continue
            fd = self._pidfds.get(key)
            if fd is None:
                pidfd_open = getattr(os, "pidfd_open", None)  # Linux only: elsewhere the step finds the end
                if pidfd_open is None:
                    continue
                try:
                    fd = pidfd_open(process.pid)
                except OSError:  # no pidfd here (Linux < 5.3): the step finds it
                    continue
                self._pidfds[key] = fd
            fds.append(fd)
        server_fd = self.sandbox.exit_fd() if served and self.sandbox is not None else None
        if server_fd is not None:
            fds.append(server_fd)
        return fds

    def _forget_process(self, key: tuple[int, int]) -> subprocess.Popen | ServedProcess | None:
        """Drop the handle of a process that ended or is no longer followed by handle (and its pidfd)."""
        fd = self._pidfds.pop(key, None)
        if fd is not None:
            os.close(fd)
        return self._popen.pop(key, None)

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
            self._forget_process(record.key)
            process = None
        if process is not None:
            return process.poll() is None
        return record.pid is not None and process_start_time(record.pid) == record.pid_start_time

    def _settle(self, record: WorkloadRecord, *, lost_message: str = "") -> None:
        """The process is gone: decide how it ended from its exit code file (or the Popen), else lost."""
        process = self._forget_process(record.key)
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
            if record.job_dir in active_dirs or not inside(job_dir, self.work_dir / "jobs") or not job_dir.exists():
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
        for key in list(self._popen):
            self._forget_process(key)
        if self.sandbox is not None:
            self.sandbox.close()
