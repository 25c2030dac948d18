"""Huawei Ascend NPUs, read from ``npu-smi info`` (the tool every Ascend driver installs).

``npu-smi info`` prints one two-line block per NPU (name, health, power, temperature; then chip, bus id,
AICore utilisation and HBM usage) followed by a process table. :func:`parse_npu_smi_info` turns that text
into records; the backend runs the tool at most once per sampling step and derives everything from it.
``npu-smi`` shows no UUID, so a device's uuid is ``NPU-<PCI bus id>``, stable across reboots.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodeagent.backends.base import BackendUnavailable, EccCounts, WorkloadLoad
from nodeagent.protocol import DeviceHealth, DeviceInfo, DeviceSample, ProcessSample, Topology

log = logging.getLogger(__name__)

#: npu-smi's health words; "Alarm" means a non-fatal fault the card survives.
_HEALTH: dict[str, DeviceHealth] = {"OK": "healthy", "Warning": "degraded", "Alarm": "degraded"}
_FIRST_LINE = re.compile(r"^\|\s*(?P<npu>\d+)\s+(?P<name>\S+)\s*\|\s*(?P<health>\S+)\s*\|(?P<rest>.*)\|\s*$")
_SECOND_LINE = re.compile(r"^\|\s*(?P<chip>\d+)\s*\|\s*(?P<bus>[0-9A-Fa-f]{4}:[0-9A-Fa-f:.]+)\s*\|(?P<rest>.*)\|\s*$")
_PROCESS_LINE = re.compile(
    r"^\|\s*(?P<npu>\d+)\s+(?P<chip>\d+)\s*\|\s*(?P<pid>\d+)\s*\|\s*(?P<name>\S+)\s*\|\s*(?P<mem>\d+)\s*\|\s*$"
)
_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # npu-smi prints "NA" for values a card cannot report


@dataclass
class NpuRecord:
    npu: int
    name: str
    health: DeviceHealth
    bus_id: str = ""
    chip: int = 0
    power_w: float | None = None
    temperature_c: float | None = None
    aicore_pct: float | None = None
    hbm_used_mib: int | None = None
    hbm_total_mib: int | None = None
    processes: list[ProcessSample] = field(default_factory=list)

    @property
    def uuid(self) -> str:
        return f"NPU-{self.bus_id.lower()}"


def parse_npu_smi_info(text: str) -> list[NpuRecord]:
    """Parse ``npu-smi info``; raises ValueError when the text has no NPU table (wrong tool or version)."""
    records: dict[int, NpuRecord] = {}
    pending: NpuRecord | None = None
    for line in text.splitlines():
        line = line.rstrip()
        if match := _PROCESS_LINE.match(line):
            record = records.get(int(match["npu"]))
            if record is not None:
                record.processes.append(ProcessSample(pid=int(match["pid"]), used_memory_mib=int(match["mem"])))
            continue
        if match := _FIRST_LINE.match(line):
            values = match["rest"].split()
            pending = NpuRecord(
                npu=int(match["npu"]),
                name=match["name"],
                health=_HEALTH.get(match["health"], "unhealthy"),
                power_w=_number(values[0]) if values else None,
                temperature_c=_number(values[1]) if len(values) > 1 else None,
            )
            continue
        if pending is not None and (match := _SECOND_LINE.match(line)):
            pending.chip = int(match["chip"])
            pending.bus_id = match["bus"]
            rest = match["rest"]
            values = rest.split()
            pending.aicore_pct = _number(values[0]) if values else None
            usages = _USAGE.findall(rest)
            if usages:
                # The last "used / total" pair is HBM (910B) or DDR memory (310P has only that one).
                used, total = usages[-1]
                pending.hbm_used_mib, pending.hbm_total_mib = int(used), int(total)
            records[pending.npu] = pending
            pending = None
    if not records:
        raise ValueError("no NPU rows found in npu-smi output")
    return [records[npu] for npu in sorted(records)]


def _run_npu_smi() -> str:
    return subprocess.run(["npu-smi", "info"], capture_output=True, text=True, check=True, timeout=20).stdout


class AscendBackend:
    name = "ascend"

    def __init__(self, *, run_npu_smi: Callable[[], str] | None = None, **_ignored: Any) -> None:
        if run_npu_smi is None:
            if shutil.which("npu-smi") is None:
                raise BackendUnavailable(
                    "ascend", "npu-smi not found on PATH; install the Ascend driver (Ascend HDK) or use another backend"
                )
            run_npu_smi = _run_npu_smi
        self._run = run_npu_smi
        self._records = self._read()

    def _read(self) -> list[NpuRecord]:
        try:
            return parse_npu_smi_info(self._run())
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise BackendUnavailable("ascend", f"`npu-smi info` failed ({exc}); check the Ascend driver") from exc

    def _refresh(self) -> list[NpuRecord]:
        try:
            self._records = self._read()
        except BackendUnavailable as exc:
            log.warning("%s", exc)
            for record in self._records:
                record.health = "unhealthy"
        return self._records

    def inventory(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
                index=index,
                uuid=record.uuid,
                vendor="ascend",
                model=f"Ascend {record.name}",
                memory_mib=record.hbm_total_mib or 0,
                pci_bus_id=record.bus_id,
                health=record.health,
                # Ascend 910 boards join 8 NPUs in one HCCS domain; the agent reports it like NVLink.
                nvlink_domain="hccs0" if record.name.startswith("910") else None,
            )
            for index, record in enumerate(self._records)
        ]

    def topology(self) -> Topology:
        domains = sorted({d.nvlink_domain for d in self.inventory() if d.nvlink_domain})
        return Topology(nvlink_domains=domains)

    def sample(self) -> list[DeviceSample]:
        return [
            DeviceSample(
                uuid=record.uuid,
                utilization_pct=record.aicore_pct,
                memory_used_mib=record.hbm_used_mib,
                memory_total_mib=record.hbm_total_mib,
                power_w=record.power_w,
                temperature_c=record.temperature_c,
                health=record.health,
            )
            for record in self._refresh()
        ]

    def processes(self) -> dict[str, list[ProcessSample]]:
        return {record.uuid: list(record.processes) for record in self._records}

    def ecc_errors(self) -> dict[str, EccCounts]:
        return {record.uuid: EccCounts() for record in self._records}

    def health(self) -> dict[str, DeviceHealth]:
        return {record.uuid: record.health for record in self._records}

    def observe_workloads(self, loads: list[WorkloadLoad]) -> None:
        """Real devices report their own load."""

    def close(self) -> None:
        """Nothing to release."""
