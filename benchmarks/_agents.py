"""What the benchmarks' simulated agents send: the frames of an 8-card node, and a free loopback port; and what
a node agent keeps of a workload that ended (``finished_workload``).

Shared by ``telemetry_ingest.py`` and ``load.py`` so both load the portal with the same frames, and by
``agent_state_save.py`` and ``agent_job_cpu.py`` so both give an agent the same day of finished workloads.
"""

from __future__ import annotations

import json
import random
import socket
import uuid
from datetime import UTC, datetime
from pathlib import Path

from nodeagent.journal import WorkloadRecord

CARDS = 8
CARD_MEMORY_MIB = 81559


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def hello_frame(name: str, *, agent_version: str) -> str:
    """A v1 ``hello`` of node ``name`` with ``CARDS`` simulated H100s."""
    devices = [
        {
            "index": card,
            "uuid": f"GPU-{name}-{card}",
            "vendor": "simulated",
            "model": "Simulated H100 80GB",
            "memory_mib": CARD_MEMORY_MIB,
            "numa_node": card // 4,
        }
        for card in range(CARDS)
    ]
    return json.dumps(
        {
            "v": 1,
            "type": "hello",
            "id": uuid.uuid4().hex,
            "node_name": name,
            "agent_version": agent_version,
            "hostname": name,
            "cpu_cores": 64,
            "memory_mib": 512000,
            "devices": devices,
        }
    )


def telemetry_frame(name: str, rng: random.Random) -> str:
    """A v1 ``telemetry`` frame of node ``name``: one sample per card, stamped now."""
    samples = [
        {
            "uuid": f"GPU-{name}-{card}",
            "utilization_pct": round(rng.uniform(0, 100), 1),
            "memory_used_mib": rng.randint(0, CARD_MEMORY_MIB),
            "memory_total_mib": CARD_MEMORY_MIB,
            "power_w": round(rng.uniform(60, 700), 1),
            "temperature_c": round(rng.uniform(30, 85), 1),
            "sm_clock_mhz": 1980,
            "ecc_errors": 0,
            "xid_errors": 0,
            "processes": [],
        }
        for card in range(CARDS)
    ]
    sent_at = datetime.now(UTC).isoformat()
    return json.dumps({"v": 1, "type": "telemetry", "id": uuid.uuid4().hex, "sent_at": sent_at, "samples": samples})


def finished_workload(work_dir: Path, job_id: int, *, finished_at: float) -> WorkloadRecord:
    """A one-card sandboxed workload of job ``job_id`` that succeeded at ``finished_at`` after a minute, as the
    agent of work dir ``work_dir`` keeps it for a day (its output file opened, its process long gone)."""
    job_dir = work_dir / "jobs" / f"{job_id}-0"
    return WorkloadRecord(
        command_id=job_id,
        job_id=job_id,
        replica=0,
        job_dir=str(job_dir),
        working_dir=str(job_dir / "work"),
        checkpoint_dir=None,
        devices=[{"uuid": "GPU-00000000-0000-0000-0000-000000000000", "millis": 1000, "memory_mib": None}],
        pid=1000 + job_id % 30000,
        pid_start_time=5,
        started_at=finished_at - 60,
        state="succeeded",
        exit_code=0,
        finished_at=finished_at,
        sandbox="namespaces",
        log_inode=[0, job_id],
    )
