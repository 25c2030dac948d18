"""The job the fault tests run: counts ``steps`` steps of ``step_s`` seconds, checkpointing after each one.

``python workload.py STEPS STEP_S``. It resumes from ``$GPUPOOL_CHECKPOINT_DIR/step`` when a previous run left
one, and appends one JSON line per start and per finish to ``marks.jsonl`` in its working directory, the job's
own directory on the node (what it saw: pid, the step it resumed from, ``GPUPOOL_LAST_CHECKPOINT_AT``, its
devices), so a test can count how many times the job really started and where (``Cluster.marks_of`` reads every
node's copy). The job dir, not a shared marks dir: in the agent's sandbox a job can write only its own directory
and its checkpoint dir. On SIGTERM (a stop: preemption, drain, fencing) it appends a ``term`` mark with the step
its checkpoint holds and exits 143, as a real job checkpoints and goes. Standard library only: it runs under the
agent, not under Django.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path


def mark(job_id: str, **fields: object) -> None:
    line = json.dumps({"job_id": int(job_id), "pid": os.getpid(), "at": time.time(), **fields})
    with open(Path.cwd() / "marks.jsonl", "a") as handle:
        handle.write(line + "\n")


def main() -> int:
    steps, step_s = int(sys.argv[1]), float(sys.argv[2])
    job_id = os.environ["GPUPOOL_JOB_ID"]
    checkpoint = Path(os.environ["GPUPOOL_CHECKPOINT_DIR"]) / "step"
    done = int(checkpoint.read_text()) if checkpoint.exists() else 0

    def checkpoint_and_go(signum: int, frame: object) -> None:
        saved = int(checkpoint.read_text()) if checkpoint.exists() else 0
        mark(job_id, event="term", checkpointed=saved)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, checkpoint_and_go)
    mark(
        job_id,
        event="start",
        resumed_from=done,
        last_checkpoint_at=os.environ.get("GPUPOOL_LAST_CHECKPOINT_AT"),
        devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    )
    for step in range(done, steps):
        time.sleep(step_s)
        # A name of its own: a stale copy still running elsewhere writes the same shared checkpoint dir, and with
        # one shared temporary name the slower copy's os.replace would find it gone (pids do not tell copies apart
        # either: each sandbox has its own PID namespace).
        partial = checkpoint.with_name(f"step.{uuid.uuid4().hex}.tmp")
        partial.write_text(str(step + 1))
        os.replace(partial, checkpoint)
    mark(job_id, event="done", steps=steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
