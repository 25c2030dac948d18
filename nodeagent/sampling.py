"""Sampling tiers: cheap metrics every telemetry tick, processes every few seconds, ECC once a minute.

Each tier keeps its last answer, so every telemetry frame carries all fields; a slow query (ECC counters can
take tens of milliseconds per device) runs only when its tier is due.
"""

from __future__ import annotations

import dataclasses

from nodeagent.backends.base import DeviceBackend, EccCounts
from nodeagent.protocol import DeviceSample, ProcessSample

PROCESS_INTERVAL_S = 5.0
ECC_INTERVAL_S = 60.0


class Sampler:
    def __init__(
        self,
        backend: DeviceBackend,
        *,
        process_interval_s: float = PROCESS_INTERVAL_S,
        ecc_interval_s: float = ECC_INTERVAL_S,
    ) -> None:
        self.backend = backend
        self.process_interval_s = process_interval_s
        self.ecc_interval_s = ecc_interval_s
        self._processes: dict[str, list[ProcessSample]] = {}
        self._ecc: dict[str, EccCounts] = {}
        self._processes_at: float | None = None
        self._ecc_at: float | None = None

    def sample(self, now: float) -> list[DeviceSample]:
        """One telemetry sample of every device at monotonic time ``now``."""
        if self._processes_at is None or now - self._processes_at >= self.process_interval_s:
            self._processes = self.backend.processes()
            self._processes_at = now
        if self._ecc_at is None or now - self._ecc_at >= self.ecc_interval_s:
            self._ecc = self.backend.ecc_errors()
            self._ecc_at = now
        merged = []
        for sample in self.backend.sample():
            ecc = self._ecc.get(sample.uuid, EccCounts())
            merged.append(
                dataclasses.replace(
                    sample,
                    processes=list(self._processes.get(sample.uuid, [])),
                    ecc_errors=ecc.volatile,
                    ecc_errors_aggregate=ecc.aggregate,
                )
            )
        return merged
