"""NVIDIA devices through NVML (``nvidia-ml-py``). The only module of gpupool that imports ``pynvml``.

Every NVML call goes through :meth:`NvmlBackend._read`: a field the device does not support (or any other
per-call NVML error) becomes ``None`` in the report instead of a crash, and ``NVML_ERROR_GPU_IS_LOST`` marks
that device unhealthy. Critical XID events arrive on an NVML event set; :meth:`poll_xid_events` handles one
wait, and a daemon thread repeats it (application XIDs such as 13 or 43 are a user's bug, not a sick GPU, and
are ignored).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from nodeagent.backends.base import BackendUnavailable, EccCounts, WorkloadLoad
from nodeagent.protocol import DeviceHealth, DeviceInfo, DeviceSample, ProcessSample, Topology

log = logging.getLogger(__name__)
T = TypeVar("T")
MIB = 1024 * 1024

#: XIDs caused by the application (illegal address, page faults, preemption, ...), not by the hardware; the
#: same list the Kubernetes NVIDIA device plugin skips.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
#: NVML return codes after which the device cannot be used until it is reset or the node rebooted.
_LOST_CODES = frozenset(
    code
    for code in (
        pynvml.NVML_ERROR_GPU_IS_LOST,
        getattr(pynvml, "NVML_ERROR_RESET_REQUIRED", None),
    )
    if code is not None
)
#: Devices whose common ancestor is at most this level share a PCIe switch.
_SAME_SWITCH_LEVEL = pynvml.NVML_TOPOLOGY_MULTIPLE
_PCI_ROOT = Path("/sys/bus/pci/devices")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _sysfs_bus_id(nvml_bus_id: str) -> str:
    """``00000000:18:00.0`` (NVML) → ``0000:18:00.0`` (sysfs)."""
    return nvml_bus_id.lower()[-12:]


class NvmlBackend:
    name = "nvml"

    def __init__(self, *, watch_xid_events: bool = True, pci_root: Path = _PCI_ROOT, **_ignored: Any) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as exc:
            raise BackendUnavailable(
                "nvml",
                "NVIDIA driver library libnvidia-ml.so.1 not found; install the NVIDIA driver (nvidia-smi must "
                "work) or run the agent with --backend simulated",
            ) from exc
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(
                "nvml", f"NVML failed to initialise ({exc}); check `nvidia-smi` and the driver's kernel module"
            ) from exc
        self._pci_root = pci_root
        self._lock = threading.Lock()
        self._lost: set[int] = set()
        self._xid_counts: dict[int, int] = {}
        self._last_xid: dict[int, int] = {}
        self._ecc: dict[int, EccCounts] = {}
        self._stop = threading.Event()
        self._handles, self._uuids = self._open_devices()
        self._inventory: list[DeviceInfo] | None = None
        self._topology: Topology | None = None
        self._event_set = self._register_xid_events()
        self._thread: threading.Thread | None = None
        if watch_xid_events and self._event_set is not None:
            self._thread = threading.Thread(target=self._watch_xid_events, name="nvml-xid", daemon=True)
            self._thread.start()

    def _open_devices(self) -> tuple[list[Any], list[str]]:
        """Handles and UUIDs of the devices NVML can open. A device that fails here (fallen off the bus) is
        left out: the portal marks devices missing from the inventory unhealthy."""
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise BackendUnavailable("nvml", f"cannot count the GPUs ({exc}); check `nvidia-smi`") from exc
        handles, uuids = [], []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError as exc:
                log.error("nvml: GPU %d cannot be opened (%s); leaving it out of the inventory", index, exc)
                continue
            handles.append(handle)
            uuids.append(uuid)
        return handles, uuids

    # --- helpers -----------------------------------------------------------------------------------------

    def _read(self, index: int, call: Callable[..., T], *args: Any) -> T | None:
        """Call NVML for device ``index``; None when it cannot answer, and a lost GPU is remembered."""
        try:
            return call(*args)
        except pynvml.NVMLError as exc:
            if exc.value in _LOST_CODES:
                if index not in self._lost:
                    log.error("nvml: GPU %d (%s) is lost: %s", index, self._uuids[index], exc)
                self._lost.add(index)
            elif exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
                log.debug("nvml: %s on GPU %d failed: %s", getattr(call, "__name__", call), index, exc)
            return None

    def _numa_node(self, index: int, bus_id: str | None) -> int | None:
        numa = self._read(index, pynvml.nvmlDeviceGetNumaNodeId, self._handles[index])
        if numa is not None and numa >= 0:
            return numa
        if bus_id:
            try:
                value = int((self._pci_root / _sysfs_bus_id(bus_id) / "numa_node").read_text().strip())
            except (OSError, ValueError):
                return None
            return value if value >= 0 else None
        return None

    # --- inventory and topology --------------------------------------------------------------------------

    def inventory(self) -> list[DeviceInfo]:
        if self._inventory is None:
            self._inventory = self._build_inventory()
        health = self.health()
        return [
            DeviceInfo(**{**device.__dict__, "health": health.get(device.uuid, device.health)})
            for device in self._inventory
        ]

    def _build_inventory(self) -> list[DeviceInfo]:
        switches, nvlink_domains = self._groups()
        devices = []
        for index, handle in enumerate(self._handles):
            name = self._read(index, pynvml.nvmlDeviceGetName, handle)
            memory = self._read(index, pynvml.nvmlDeviceGetMemoryInfo, handle)
            pci = self._read(index, pynvml.nvmlDeviceGetPciInfo, handle)
            bus_id = _text(pci.busId) if pci is not None else None
            mig = self._read(index, pynvml.nvmlDeviceGetMigMode, handle)
            devices.append(
                DeviceInfo(
                    index=index,
                    uuid=self._uuids[index],
                    vendor="nvidia",
                    model=_text(name) if name is not None else "NVIDIA GPU",
                    memory_mib=memory.total // MIB if memory is not None else 0,
                    numa_node=self._numa_node(index, bus_id),
                    pci_bus_id=bus_id,
                    mig_mode=None if mig is None else mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE,
                    nvlink_domain=nvlink_domains.get(index),
                    pcie_switch=switches.get(index),
                )
            )
        return devices

    def topology(self) -> Topology:
        if self._topology is None:
            devices = self._inventory or self._build_inventory()
            self._inventory = devices
            self._topology = Topology(
                numa_nodes=sorted({d.numa_node for d in devices if d.numa_node is not None}),
                pcie_switches=sorted({d.pcie_switch for d in devices if d.pcie_switch}),
                nvlink_domains=sorted({d.nvlink_domain for d in devices if d.nvlink_domain}),
            )
        return self._topology

    def _groups(self) -> tuple[dict[int, str], dict[int, str]]:
        """Group devices by shared PCIe switch (common ancestor) and by NVLink connectivity."""
        count = len(self._handles)
        switch_parent = list(range(count))
        nvlink_parent = list(range(count))

        def find(parent: list[int], i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        def union(parent: list[int], a: int, b: int) -> None:
            parent[find(parent, a)] = find(parent, b)

        for a in range(count):
            for b in range(a + 1, count):
                level = self._read(a, pynvml.nvmlDeviceGetTopologyCommonAncestor, self._handles[a], self._handles[b])
                if level is not None and level <= _SAME_SWITCH_LEVEL:
                    union(switch_parent, a, b)

        bus_to_index: dict[str, int] = {}
        for index, handle in enumerate(self._handles):
            pci = self._read(index, pynvml.nvmlDeviceGetPciInfo, handle)
            if pci is not None:
                bus_to_index[_sysfs_bus_id(_text(pci.busId))] = index
        linked = [False] * count
        via_switch: list[int] = []
        for index, handle in enumerate(self._handles):
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    active = pynvml.nvmlDeviceGetNvLinkState(handle, link)
                except pynvml.NVMLError:
                    break  # NotSupported on link 0 (PCIe card) or InvalidArgument past the last link
                if not active:
                    continue
                linked[index] = True
                remote = self._read(index, pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
                peer = bus_to_index.get(_sysfs_bus_id(_text(remote.busId))) if remote is not None else None
                if peer is not None:
                    union(nvlink_parent, index, peer)
                elif index not in via_switch:
                    via_switch.append(index)  # the far end is an NVSwitch: one fabric per HGX board
        for index in via_switch[1:]:
            union(nvlink_parent, via_switch[0], index)

        def names(parent: list[int], prefix: str, only: list[bool] | None) -> dict[int, str]:
            roots: dict[int, str] = {}
            result = {}
            for index in range(count):
                if only is not None and not only[index]:
                    continue
                root = find(parent, index)
                roots.setdefault(root, f"{prefix}{len(roots)}")
                result[index] = roots[root]
            return result

        return names(switch_parent, "pcie", None), names(nvlink_parent, "nvlink", linked)

    # --- sampling ----------------------------------------------------------------------------------------

    def sample(self) -> list[DeviceSample]:
        samples = []
        for index, handle in enumerate(self._handles):
            utilization = self._read(index, pynvml.nvmlDeviceGetUtilizationRates, handle)
            memory = self._read(index, pynvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = self._read(index, pynvml.nvmlDeviceGetPowerUsage, handle)
            temperature = self._read(index, pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
            sm_clock = self._read(index, pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
            with self._lock:
                xid_count = self._xid_counts.get(index, 0) if self._event_set is not None else None
                last_xid = self._last_xid.get(index)
            samples.append(
                DeviceSample(
                    uuid=self._uuids[index],
                    utilization_pct=float(utilization.gpu) if utilization is not None else None,
                    memory_used_mib=memory.used // MIB if memory is not None else None,
                    memory_total_mib=memory.total // MIB if memory is not None else None,
                    power_w=power_mw / 1000.0 if power_mw is not None else None,
                    temperature_c=float(temperature) if temperature is not None else None,
                    sm_clock_mhz=sm_clock,
                    xid_errors=xid_count,
                    last_xid=last_xid,
                    health=self._health_of(index),
                )
            )
        return samples

    def processes(self) -> dict[str, list[ProcessSample]]:
        result: dict[str, list[ProcessSample]] = {}
        for index, handle in enumerate(self._handles):
            running = self._read(index, pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            result[self._uuids[index]] = [
                ProcessSample(
                    pid=process.pid,
                    used_memory_mib=process.usedGpuMemory // MIB if process.usedGpuMemory is not None else None,
                )
                for process in running
            ]
        return result

    def ecc_errors(self) -> dict[str, EccCounts]:
        result = {}
        for index, handle in enumerate(self._handles):
            counts = [
                self._read(
                    index,
                    pynvml.nvmlDeviceGetTotalEccErrors,
                    handle,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    counter,
                )
                for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC)
            ]
            result[self._uuids[index]] = self._ecc[index] = EccCounts(volatile=counts[0], aggregate=counts[1])
        return result

    def _health_of(self, index: int) -> DeviceHealth:
        with self._lock:
            if index in self._lost or self._xid_counts.get(index):
                return "unhealthy"
            # Uncorrected errors since boot: the GPU still runs (rows get remapped) but deserves attention.
            if self._ecc.get(index, EccCounts()).volatile:
                return "degraded"
        return "healthy"

    def health(self) -> dict[str, DeviceHealth]:
        return {uuid: self._health_of(index) for index, uuid in enumerate(self._uuids)}

    def observe_workloads(self, loads: list[WorkloadLoad]) -> None:
        """Real devices report their own load."""

    # --- XID events --------------------------------------------------------------------------------------

    def _register_xid_events(self) -> Any:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("nvml: cannot create an event set (%s); XID errors will not be reported", exc)
            return None
        registered = 0
        for index, handle in enumerate(self._handles):
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except pynvml.NVMLError as exc:
                log.warning("nvml: GPU %d does not report XID events (%s)", index, exc)
        return event_set if registered else None

    def _index_of_handle(self, handle: Any) -> int | None:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        for index, known in enumerate(self._handles):
            if ctypes.cast(known, ctypes.c_void_p).value == address:
                return index
        return None

    def poll_xid_events(self, timeout_ms: int) -> int | None:
        """Wait up to ``timeout_ms`` for one XID event; record it unless it is an application XID.

        Returns the XID seen (recorded or not), or None after a timeout.
        """
        if self._event_set is None:
            return None
        try:
            data = pynvml.nvmlEventSetWait(self._event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return None
        xid = int(data.eventData)
        index = self._index_of_handle(data.device)
        if xid in APPLICATION_XIDS:
            log.info("nvml: application XID %d on GPU %s ignored", xid, index)
            return xid
        # An event without a device handle concerns all devices (NVML documents this for some XIDs).
        targets = list(range(len(self._handles))) if index is None else [index]
        with self._lock:
            for target in targets:
                self._xid_counts[target] = self._xid_counts.get(target, 0) + 1
                self._last_xid[target] = xid
        log.error("nvml: critical XID %d on GPU(s) %s; marking unhealthy", xid, targets)
        return xid

    def _watch_xid_events(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_xid_events(1000)
            except pynvml.NVMLError as exc:
                log.warning("nvml: XID event wait failed (%s); stopping the XID watcher", exc)
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        try:
            if self._event_set is not None:
                pynvml.nvmlEventSetFree(self._event_set)
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvml: shutdown failed: %s", exc)
