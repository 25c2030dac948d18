"""AMD Instinct GPUs through ROCm's ``amdsmi`` Python bindings (shipped with ROCm, not a gpupool dependency).

The import is guarded: without ROCm the backend fails with a :class:`BackendUnavailable` that says so. The
bindings differ between ROCm releases (a field may be missing, or hold ``"N/A"``), so every value goes through
:func:`_number` and every call through :meth:`AmdBackend._call`; what cannot be read is ``None``. Devices in
one XGMI hive share a link domain, reported like NVLink.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from nodeagent.backends.base import BackendUnavailable, EccCounts, WorkloadLoad
from nodeagent.protocol import DeviceHealth, DeviceInfo, DeviceSample, ProcessSample, Topology

log = logging.getLogger(__name__)
MIB = 1024 * 1024


def _number(value: Any) -> float | None:
    """A numeric reading, or None for "N/A", missing or nonsense values."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, dict):  # newer bindings wrap some readings: {"value": 55, "unit": "C"}
        return _number(value.get("value"))
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 and number != 0xFFFFFFFF else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


class AmdBackend:
    name = "amd"

    def __init__(self, *, amdsmi_module: Any | None = None, **_ignored: Any) -> None:
        if amdsmi_module is None:
            try:
                amdsmi_module = importlib.import_module("amdsmi")
            except ImportError as exc:
                raise BackendUnavailable(
                    "amd", "the amdsmi Python bindings are not installed; install ROCm (it ships amdsmi) on this node"
                ) from exc
        self.smi = amdsmi_module
        self._error = getattr(amdsmi_module, "AmdSmiException", Exception)
        try:
            self.smi.amdsmi_init()
            self._handles = list(self.smi.amdsmi_get_processor_handles())
        except self._error as exc:
            raise BackendUnavailable("amd", f"amdsmi failed to initialise ({exc}); check the amdgpu driver") from exc
        self._broken: set[int] = set()
        self._uuids = [self._uuid(index, handle) for index, handle in enumerate(self._handles)]
        self._inventory: list[DeviceInfo] | None = None

    def _call(self, index: int, function: str, *args: Any) -> Any:
        call: Callable[..., Any] | None = getattr(self.smi, function, None)
        if call is None:
            return None  # not in this ROCm release
        try:
            return call(self._handles[index], *args)
        except self._error as exc:
            log.debug("amd: %s on GPU %d failed: %s", function, index, exc)
            return None

    def _uuid(self, index: int, handle: Any) -> str:
        uuid = self._call(index, "amdsmi_get_gpu_device_uuid")
        return str(uuid) if uuid else f"AMD-{self._call(index, 'amdsmi_get_gpu_device_bdf') or index}"

    def inventory(self) -> list[DeviceInfo]:
        if self._inventory is None:
            devices = []
            for index in range(len(self._handles)):
                asic = self._call(index, "amdsmi_get_gpu_asic_info") or {}
                vram = self._call(index, "amdsmi_get_gpu_vram_usage") or {}
                xgmi = self._call(index, "amdsmi_get_xgmi_info") or {}
                hive = xgmi.get("xgmi_hive_id") if isinstance(xgmi, dict) else None
                devices.append(
                    DeviceInfo(
                        index=index,
                        uuid=self._uuids[index],
                        vendor="amd",
                        model=str(asic.get("market_name") or "AMD GPU"),
                        memory_mib=_int(vram.get("vram_total")) or 0,  # amdsmi reports VRAM in MiB
                        numa_node=_int(self._call(index, "amdsmi_topo_get_numa_node_number")),
                        pci_bus_id=self._call(index, "amdsmi_get_gpu_device_bdf"),
                        nvlink_domain=f"xgmi-{hive:x}" if isinstance(hive, int) and hive else None,
                    )
                )
            self._inventory = devices
        health = self.health()
        return [DeviceInfo(**{**d.__dict__, "health": health[d.uuid]}) for d in self._inventory]

    def topology(self) -> Topology:
        devices = self.inventory()
        return Topology(
            numa_nodes=sorted({d.numa_node for d in devices if d.numa_node is not None}),
            nvlink_domains=sorted({d.nvlink_domain for d in devices if d.nvlink_domain}),
        )

    def sample(self) -> list[DeviceSample]:
        samples = []
        smi = self.smi
        for index, uuid in enumerate(self._uuids):
            activity = self._call(index, "amdsmi_get_gpu_activity")
            vram = self._call(index, "amdsmi_get_gpu_vram_usage")
            power = self._call(index, "amdsmi_get_power_info") or {}
            temperature = None
            clock = None
            if hasattr(smi, "AmdSmiTemperatureType"):
                sensor = getattr(smi.AmdSmiTemperatureType, "HOTSPOT", None) or smi.AmdSmiTemperatureType.EDGE
                temperature = self._call(index, "amdsmi_get_temp_metric", sensor, smi.AmdSmiTemperatureMetric.CURRENT)
            if hasattr(smi, "AmdSmiClkType"):
                clock = (self._call(index, "amdsmi_get_clock_info", smi.AmdSmiClkType.GFX) or {}).get("clk")
            if activity is None and vram is None:
                self._broken.add(index)
            else:
                self._broken.discard(index)
            watts = power.get("current_socket_power")
            if _number(watts) is None:
                watts = power.get("average_socket_power")
            samples.append(
                DeviceSample(
                    uuid=uuid,
                    utilization_pct=_number((activity or {}).get("gfx_activity")),
                    memory_used_mib=_int((vram or {}).get("vram_used")),
                    memory_total_mib=_int((vram or {}).get("vram_total")),
                    power_w=_number(watts),
                    temperature_c=_number(temperature),
                    sm_clock_mhz=_int(clock),
                    health=self._health_of(index),
                )
            )
        return samples

    def processes(self) -> dict[str, list[ProcessSample]]:
        result = {}
        for index, uuid in enumerate(self._uuids):
            listed = self._call(index, "amdsmi_get_gpu_process_list") or []
            processes = []
            for item in listed:
                if not isinstance(item, dict) or _int(item.get("pid")) is None:
                    continue
                memory = item.get("memory_usage") or {}
                vram_bytes = _int(memory.get("vram_mem")) if isinstance(memory, dict) else None
                processes.append(
                    ProcessSample(
                        pid=_int(item["pid"]),  # type: ignore[arg-type]
                        used_memory_mib=vram_bytes // MIB if vram_bytes is not None else None,
                    )
                )
            result[uuid] = processes
        return result

    def ecc_errors(self) -> dict[str, EccCounts]:
        result = {}
        for index, uuid in enumerate(self._uuids):
            total = self._call(index, "amdsmi_get_gpu_total_ecc_count") or {}
            # amdsmi counts since the driver loaded; it has no lifetime counter like NVML's aggregate.
            result[uuid] = EccCounts(volatile=_int(total.get("uncorrectable_count")), aggregate=None)
        return result

    def _health_of(self, index: int) -> DeviceHealth:
        return "unhealthy" if index in self._broken else "healthy"

    def health(self) -> dict[str, DeviceHealth]:
        return {uuid: self._health_of(index) for index, uuid in enumerate(self._uuids)}

    def observe_workloads(self, loads: list[WorkloadLoad]) -> None:
        """Real devices report their own load."""

    def close(self) -> None:
        try:
            self.smi.amdsmi_shut_down()
        except self._error as exc:
            log.debug("amd: shutdown failed: %s", exc)
