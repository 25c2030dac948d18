"""Simulated accelerators: N cards of one model whose load follows the workloads the agent runs on them.

Used by ``gpupool demo`` and the end-to-end tests. Everything is deterministic for a node name and seed: the
UUIDs derive from the node name, and the measurement noise comes from a seeded RNG.
"""

from __future__ import annotations

import random
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

from nodeagent.backends.base import BackendUnavailable, EccCounts, WorkloadLoad
from nodeagent.protocol import DeviceHealth, DeviceInfo, DeviceSample, ProcessSample, Topology, Vendor

_UUID_NAMESPACE = uuidlib.UUID("6f1c1a52-93f7-4d4e-9a43-2a0c5b1f6e01")


@dataclass(frozen=True)
class SimulatedModel:
    vendor: Vendor
    model: str
    memory_mib: int
    idle_power_w: float
    max_power_w: float
    idle_clock_mhz: int
    max_clock_mhz: int
    uuid_prefix: str = "GPU"
    nvlink: bool = True


#: ``--model`` names. Vendor and model strings are the ones the real driver reports, so simulated devices
#: match the same resource flavors as real ones.
MODELS: dict[str, SimulatedModel] = {
    "H100-80G": SimulatedModel("nvidia", "NVIDIA H100 80GB HBM3", 81559, 70.0, 700.0, 345, 1980),
    "A100-80G": SimulatedModel("nvidia", "NVIDIA A100-SXM4-80GB", 81920, 55.0, 400.0, 210, 1410),
    "A100-40G": SimulatedModel("nvidia", "NVIDIA A100-SXM4-40GB", 40960, 52.0, 400.0, 210, 1410),
    "L40S": SimulatedModel("nvidia", "NVIDIA L40S", 46068, 35.0, 350.0, 210, 2520, nvlink=False),
    "910B": SimulatedModel("ascend", "Ascend 910B", 65536, 90.0, 400.0, 800, 1800, uuid_prefix="NPU"),
}


class SimulatedBackend:
    name = "simulated"

    def __init__(
        self, *, node_name: str = "sim", cards: int = 8, model: str = "H100-80G", seed: int = 0, **_ignored: Any
    ) -> None:
        if model not in MODELS:
            raise BackendUnavailable("simulated", f"unknown --model {model!r}; choose one of {sorted(MODELS)}")
        if cards < 1:
            raise BackendUnavailable("simulated", "--cards must be at least 1")
        self.spec = MODELS[model]
        self.node_name = node_name
        self.cards = cards
        self._rng = random.Random(f"{node_name}/{seed}")
        self._loads: dict[str, list[WorkloadLoad]] = {}
        self._unhealthy: set[str] = set()
        self._uuids = [
            f"{self.spec.uuid_prefix}-{uuidlib.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"
            for index in range(cards)
        ]

    def _placement(self, index: int) -> tuple[int, str, str | None]:
        """NUMA node, PCIe switch and NVLink domain of card ``index``: an HGX-like board layout."""
        half = max(1, (self.cards + 1) // 2)
        numa = 0 if self.cards <= 2 else index // half
        switch = f"pcie{index // 2}"
        domain = "nvlink0" if self.spec.nvlink and self.cards > 1 else None
        return numa, switch, domain

    def inventory(self) -> list[DeviceInfo]:
        devices = []
        for index, uuid in enumerate(self._uuids):
            numa, switch, domain = self._placement(index)
            devices.append(
                DeviceInfo(
                    index=index,
                    uuid=uuid,
                    vendor=self.spec.vendor,
                    model=self.spec.model,
                    memory_mib=self.spec.memory_mib,
                    numa_node=numa,
                    pci_bus_id=f"00000000:{0x18 + index * 0x10:02X}:00.0",
                    mig_mode=False if self.spec.vendor == "nvidia" else None,
                    health=self.health()[uuid],
                    nvlink_domain=domain,
                    pcie_switch=switch,
                )
            )
        return devices

    def topology(self) -> Topology:
        placements = [self._placement(index) for index in range(self.cards)]
        return Topology(
            numa_nodes=sorted({p[0] for p in placements}),
            pcie_switches=sorted({p[1] for p in placements}),
            nvlink_domains=sorted({p[2] for p in placements if p[2]}),
        )

    def observe_workloads(self, loads: list[WorkloadLoad]) -> None:
        by_device: dict[str, list[WorkloadLoad]] = {}
        for load in loads:
            by_device.setdefault(load.uuid, []).append(load)
        self._loads = by_device

    def _noise(self, spread: float) -> float:
        return self._rng.uniform(-spread, spread)

    def sample(self) -> list[DeviceSample]:
        samples = []
        spec = self.spec
        for uuid in self._uuids:
            loads = self._loads.get(uuid, [])
            millis = min(1000, sum(load.millis for load in loads))
            busy = millis / 1000
            utilization = 0.0 if not loads else max(0.0, min(100.0, busy * 100 * (0.9 + self._noise(0.08))))
            # A job without a memory limit uses most of its share of the card.
            memory_used = min(
                spec.memory_mib,
                4
                + sum(
                    load.memory_mib if load.memory_mib else int(load.millis / 1000 * spec.memory_mib * 0.85)
                    for load in loads
                ),
            )
            power = spec.idle_power_w + (spec.max_power_w - spec.idle_power_w) * utilization / 100
            samples.append(
                DeviceSample(
                    uuid=uuid,
                    utilization_pct=round(utilization, 1),
                    memory_used_mib=memory_used,
                    memory_total_mib=spec.memory_mib,
                    power_w=round(max(spec.idle_power_w * 0.9, power + self._noise(3.0)), 1),
                    temperature_c=round(30 + 45 * utilization / 100 + self._noise(0.5), 1),
                    sm_clock_mhz=spec.max_clock_mhz if loads else spec.idle_clock_mhz,
                    xid_errors=0,
                    health=self.health()[uuid],
                )
            )
        return samples

    def processes(self) -> dict[str, list[ProcessSample]]:
        spec = self.spec
        return {
            uuid: [
                ProcessSample(
                    pid=load.pid,
                    used_memory_mib=load.memory_mib or int(load.millis / 1000 * spec.memory_mib * 0.85),
                )
                for load in self._loads.get(uuid, [])
                if load.pid is not None
            ]
            for uuid in self._uuids
        }

    def ecc_errors(self) -> dict[str, EccCounts]:
        return {uuid: EccCounts(volatile=0, aggregate=0) for uuid in self._uuids}

    def health(self) -> dict[str, DeviceHealth]:
        return {uuid: ("unhealthy" if uuid in self._unhealthy else "healthy") for uuid in self._uuids}

    def fail_device(self, index: int) -> None:
        """Make card ``index`` unhealthy, as a lost GPU would be (for demos and tests)."""
        self._unhealthy.add(self._uuids[index])

    def close(self) -> None:
        """Nothing to release."""
