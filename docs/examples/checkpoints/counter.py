"""A training loop stand-in that checkpoints: counts to TARGET (the argument), one step every half second,
saving the count in $GPUPOOL_CHECKPOINT_DIR after each step and resuming from it when the job runs again
(after a preemption or a requeue, on whichever node).

    python3 counter.py 20
"""

import os
import sys
import time

target = int(sys.argv[1])
checkpoint = os.path.join(os.environ["GPUPOOL_CHECKPOINT_DIR"], "count")
try:
    with open(checkpoint) as saved:
        count = int(saved.read())
except FileNotFoundError:
    count = 0
print(f"resumed at {count} on {os.environ.get('GPUPOOL_NODE_ADDRESS')}", flush=True)
while count < target:
    time.sleep(0.5)
    count += 1
    with open(checkpoint + ".tmp", "w") as tmp:
        tmp.write(str(count))
    os.replace(checkpoint + ".tmp", checkpoint)  # a checkpoint is whole or absent, never half-written
    print(f"count {count} on {os.environ.get('GPUPOOL_NODE_ADDRESS')}", flush=True)
