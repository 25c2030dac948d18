"""The job the fault tests run: counts ``steps`` steps of ``step_s`` seconds, checkpointing after each one.

``python workload.py MARKS_DIR STEPS STEP_S``. It resumes from ``$GPUPOOL_CHECKPOINT_DIR/step`` when a previous
run left one, and appends one JSON line per start and per finish to ``MARKS_DIR/<job id>.jsonl`` (what it saw:
pid, the step it resumed from, ``GPUPOOL_LAST_CHECKPOINT_AT``, its devices), so a test can count how many
times the job really started and where. Standard library only: it runs under the agent, not under Django.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def mark(marks: Path, job_id: str, **fields: object) -> None:
    line = json.dumps({"job_id": int(job_id), "pid": os.getpid(), "at": time.time(), **fields})
    with open(marks / f"{job_id}.jsonl", "a") as handle:
        handle.write(line + "\n")


def main() -> int:
    marks, steps, step_s = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    job_id = os.environ["GPUPOOL_JOB_ID"]
    checkpoint = Path(os.environ["GPUPOOL_CHECKPOINT_DIR"]) / "step"
    done = int(checkpoint.read_text()) if checkpoint.exists() else 0
    mark(
        marks,
        job_id,
        event="start",
        resumed_from=done,
        last_checkpoint_at=os.environ.get("GPUPOOL_LAST_CHECKPOINT_AT"),
        devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    )
    for step in range(done, steps):
        time.sleep(step_s)
        partial = checkpoint.with_name("step.tmp")
        partial.write_text(str(step + 1))
        os.replace(partial, checkpoint)
    mark(marks, job_id, event="done", steps=steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
