#!/usr/bin/env python3
"""Entry point of a simulated agent container (deploy/compose.yaml, service ``agent``).

Replicas of one compose service cannot tell their index, so each claims the first free *slot* of the shared
state volume by holding an exclusive lock on ``slot-NN.lock`` for its whole life (the lock goes with the
process, so a stopped or recreated container frees its slot). The slot fixes the node name (``sim-NN``), the
credential file and the work dir, so a node keeps its name and credential across restarts. A slot without a
credential registers with the one-time token ``deploy/docker/enroll.sh`` left for it. The agent then replaces
this process (``exec``) and keeps the lock's descriptor.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

STATE = Path(os.environ.get("SIM_AGENT_STATE_DIR", "/var/lib/gpupool-agents"))
MAX_SLOTS = 256


def claim_slot() -> tuple[int, int]:
    """(slot number, descriptor holding its lock); exits when every slot up to MAX_SLOTS is taken."""
    STATE.mkdir(parents=True, exist_ok=True)
    for slot in range(MAX_SLOTS):
        descriptor = os.open(STATE / f"slot-{slot:02d}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            continue
        os.set_inheritable(descriptor, True)
        return slot, descriptor
    sys.exit(f"sim_agent: all {MAX_SLOTS} slots in {STATE} are taken")


def main() -> None:
    slot, _lock = claim_slot()
    name = f"slot-{slot:02d}"
    slot_dir = STATE / name
    slot_dir.mkdir(mode=0o700, exist_ok=True)
    credential = slot_dir / "agent.json"
    command = [
        "gpupool-agent",
        "demo-run",
        "--server",
        os.environ.get("SIM_AGENT_SERVER", "http://proxy:8080"),
        "--node-name",
        f"{os.environ.get('SIM_AGENT_NAME_PREFIX', 'sim')}-{slot:02d}",
        "--credential-file",
        str(credential),
        "--work-dir",
        str(slot_dir / "work"),
        "--cards",
        os.environ.get("SIM_AGENT_CARDS", "8"),
        "--model",
        os.environ.get("SIM_AGENT_MODEL", "H100-80G"),
        "--seed",
        str(slot),
        "--register-timeout",
        "300",
    ]
    token = STATE / "tokens" / f"{name}.token"
    if not credential.exists():
        if not token.exists():
            sys.exit(
                f"sim_agent: {name} has no credential and no bootstrap token; raise SIM_AGENTS in deploy/.env to at "
                "least the number of agents and run `docker compose up -d` again (enroll issues the tokens)"
            )
        command += ["--bootstrap-token-file", str(token)]
    # The container's healthcheck looks for this slot's credential (written once the agent has registered).
    Path(os.environ.get("SIM_AGENT_SLOT_FILE", "/tmp/gpupool-slot")).write_text(str(credential))
    print(f"sim_agent: {name} -> {' '.join(command[:6])}", flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
