"""CPU of one save of the node agent's state with a day of finished workloads behind it.

    .venv/bin/python benchmarks/agent_state_save.py --finished 2000 --saves 200

The agent saves its state at every start and end of a workload. A runner is filled with ``--finished``
finished workloads and one running one; then ``--saves`` times a field of the running one changes and the
state is saved (as at a start or an end). Prints the CPU per save and the size of ``state.json``. Figures, not
assertions; run it on two trees to compare them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._agents import finished_workload  # noqa: E402
from nodeagent.journal import WorkloadRecord  # noqa: E402
from nodeagent.workloads import WorkloadRunner  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=2000)
    parser.add_argument("--saves", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp()) / "work"
    runner = WorkloadRunner(work_dir=work, base_env={"PATH": "/usr/bin"})
    now = time.time()
    for i in range(args.finished):
        record = finished_workload(work, i, finished_at=now)
        runner.records[record.key] = record
    runner.save()
    running = WorkloadRecord(
        command_id=10**9, job_id=10**9, replica=0, job_dir="-", working_dir="-", checkpoint_dir=None, state="running"
    )
    runner.records[running.key] = running
    started = time.process_time()
    for i in range(args.saves):
        running.pid = 2 + i  # fields are replaced, never changed in place: the record's line is encoded again
        runner._save()
    per_save_ms = (time.process_time() - started) / args.saves * 1000
    size = (work / "state.json").stat().st_size
    print(
        f"{per_save_ms:.2f} ms CPU per save with {args.finished:,} finished workloads and 1 running; "
        f"state.json {size:,} bytes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
