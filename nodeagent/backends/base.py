"""The vendor-neutral device backend interface.

A backend answers five questions about the accelerators of one node: what is there (:meth:`inventory`,
:meth:`topology`), how busy it is now (:meth:`sample`), who uses it (:meth:`processes`), how many memory errors
it has had (:meth:`ecc_errors`) and whether it can still be trusted (:meth:`health`). The agent decides how
often to ask each question (see :mod:`nodeagent.sampling`); a backend only answers. Values a device cannot
report are ``None``; a backend raises :class:`BackendUnavailable` only when it cannot start at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nodeagent.protocol import DeviceHealth, DeviceInfo, DeviceSample, ProcessSample, Topology

#: PCI vendor ids of the accelerator vendors the agent knows.
PCI_VENDOR_IDS: dict[int, str] = {0x10DE: "nvidia", 0x19E5: "ascend", 0x1002: "amd", 0x1D94: "hygon"}


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine. The message names the backend and says how to fix it."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"{backend}: {reason}")
        self.backend = backend
        self.reason = reason


@dataclass(frozen=True)
class EccCounts:
    """Uncorrected ECC errors of one device: ``volatile`` since the driver loaded, ``aggregate`` lifetime."""

    volatile: int | None = None
    aggregate: int | None = None


@dataclass(frozen=True)
class WorkloadLoad:
    """A share of one device held by a running workload. Only the simulated backend uses it."""

    uuid: str
    millis: int
    memory_mib: int | None
    pid: int | None


@runtime_checkable
class DeviceBackend(Protocol):
    name: str

    def inventory(self) -> list[DeviceInfo]:
        """Every device of the node, in index order, with identity, memory and placement."""
        ...

    def topology(self) -> Topology:
        """NUMA nodes, PCIe switches and NVLink-like domains of the node (ids used by ``inventory``)."""
        ...

    def sample(self) -> list[DeviceSample]:
        """Cheap per-device metrics (utilisation, memory, power, temperature, clock, XID count); about 1 Hz."""
        ...

    def processes(self) -> dict[str, list[ProcessSample]]:
        """Processes using each device, by device uuid; every few seconds."""
        ...

    def ecc_errors(self) -> dict[str, EccCounts]:
        """Uncorrected ECC counters by device uuid; about once a minute (the query is slow on some drivers)."""
        ...

    def health(self) -> dict[str, DeviceHealth]:
        """Health by device uuid: ``unhealthy`` for a lost GPU or a critical XID."""
        ...

    def observe_workloads(self, loads: list[WorkloadLoad]) -> None:
        """Tell the backend what runs where. Hardware backends ignore it; the simulator follows it."""
        ...

    def close(self) -> None: ...


#: ``--backend`` name → dotted path of the backend class (STYLE.md #9: backends chosen by name).
BACKENDS: dict[str, str] = {
    "nvml": "nodeagent.backends.nvml.NvmlBackend",
    "simulated": "nodeagent.backends.simulated.SimulatedBackend",
    "ascend": "nodeagent.backends.ascend.AscendBackend",
    "amd": "nodeagent.backends.amd.AmdBackend",
}
