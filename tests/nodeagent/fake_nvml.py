"""A fake ``libnvidia-ml.so.1`` at the C-function level, for testing the NVML backend without a GPU.

``pynvml`` looks every C function up on ``pynvml.nvmlLib`` and calls it with real ctypes structs and
pointers. :class:`FakeNvmlLib` stands in for that library: its functions take the same arguments and fill
the REAL structs (``c_nvmlMemory_t``, ``nvmlPciInfo_t``, ``c_nvmlProcessInfo_v3_t`` arrays, ...) with
values recorded from H100 and A100 nodes, and return NVML error codes where the hardware would.
"""

from __future__ import annotations

import ctypes
import time
from collections import deque
from dataclasses import dataclass, field

import pynvml

MIB = 1024 * 1024
SUCCESS = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT

_HANDLE_BASE = 0x7F00_0000_1000


@dataclass
class FakeGpu:
    name: str
    uuid: str
    bus_id: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_gpu: int
    power_mw: int
    temperature_c: int
    sm_clock_mhz: int
    numa_node: int = 0
    mig_current: int = 0
    nvlink_count: int = 0
    #: Bus id at the far end of every NVLink (an NVSwitch or a peer GPU).
    nvlink_remote_bus_id: str = "00000000:C1:00.0"
    ecc_volatile: int = 0
    ecc_aggregate: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    #: Names of C functions that answer NVML_ERROR_NOT_SUPPORTED for this device.
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False


def h100(index: int) -> FakeGpu:
    """An H100 SXM5 80GB on an HGX board (values as nvidia-smi/NVML report them on such a node)."""
    return FakeGpu(
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-4b0e5f1c-2d3a-8e9f-{index:04x}-0a1b2c3d4e5f",
        bus_id=["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0"][index],
        memory_total_bytes=81559 * MIB,
        memory_used_bytes=4 * MIB,
        utilization_gpu=0,
        power_mw=71_632,
        temperature_c=31,
        sm_clock_mhz=345,
        numa_node=0 if index < 2 else 1,
        nvlink_count=18,
    )


def a100_40g(index: int) -> FakeGpu:
    """An A100-SXM4-40GB busy with a training job."""
    return FakeGpu(
        name="NVIDIA A100-SXM4-40GB",
        uuid=f"GPU-9c2f6d10-77b1-4c55-{index:04x}-93e8a1f0b2c4",
        bus_id=["00000000:07:00.0", "00000000:0F:00.0"][index],
        memory_total_bytes=40960 * MIB,
        memory_used_bytes=30_213 * MIB,
        utilization_gpu=97,
        power_mw=312_450,
        temperature_c=64,
        sm_clock_mhz=1410,
        mig_current=1,
        ecc_aggregate=2,
        processes=[(31337, 30_200 * MIB)],
    )


def _out(pointer: object) -> object:
    """The object behind a ``byref(...)`` argument."""
    return pointer._obj  # type: ignore[attr-defined]


def _address(handle: object) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class FakeNvmlLib:
    def __init__(self, gpus: list[FakeGpu], *, topology_levels: dict[tuple[int, int], int] | None = None) -> None:
        self.gpus = gpus
        self.topology_levels = topology_levels or {}
        self.events: deque[tuple[int | None, int]] = deque()  # (gpu index or None, xid)
        self.calls: list[str] = []
        self.shutdown_called = False

    # plumbing

    def _gpu(self, handle: object) -> tuple[int, FakeGpu]:
        index = _address(handle) - _HANDLE_BASE
        return index, self.gpus[index]

    def _check(self, name: str, handle: object) -> int:
        self.calls.append(name)
        _, gpu = self._gpu(handle)
        if gpu.lost:
            return GPU_IS_LOST
        if name in gpu.unsupported:
            return NOT_SUPPORTED
        return SUCCESS

    # library

    def nvmlInitWithFlags(self, flags: int) -> int:
        return SUCCESS

    def nvmlShutdown(self) -> int:
        self.shutdown_called = True
        return SUCCESS

    def nvmlDeviceGetCount_v2(self, count: object) -> int:
        _out(count).value = len(self.gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: ctypes.c_uint, device: object) -> int:
        if self.gpus[index.value].lost and "open" in self.gpus[index.value].unsupported:
            return GPU_IS_LOST  # lost before the agent started: cannot even be opened
        target = _out(device)
        pointer = ctypes.cast(ctypes.pointer(target), ctypes.POINTER(ctypes.c_void_p))
        pointer.contents.value = _HANDLE_BASE + index.value
        return SUCCESS

    def nvmlDeviceGetUUID(self, handle: object, buffer: ctypes.Array, size: ctypes.c_uint) -> int:
        if (ret := self._check("nvmlDeviceGetUUID", handle)) and ret != GPU_IS_LOST:
            return ret
        buffer.value = self._gpu(handle)[1].uuid.encode()  # the UUID stays readable on a lost GPU
        return SUCCESS

    def nvmlDeviceGetName(self, handle: object, buffer: ctypes.Array, size: ctypes.c_uint) -> int:
        if ret := self._check("nvmlDeviceGetName", handle):
            return ret
        buffer.value = self._gpu(handle)[1].name.encode()
        return SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: object, memory: object) -> int:
        if ret := self._check("nvmlDeviceGetMemoryInfo", handle):
            return ret
        gpu = self._gpu(handle)[1]
        struct = _out(memory)
        assert isinstance(struct, pynvml.c_nvmlMemory_t)
        struct.total = gpu.memory_total_bytes
        struct.used = gpu.memory_used_bytes
        struct.free = gpu.memory_total_bytes - gpu.memory_used_bytes
        return SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, handle: object, info: object) -> int:
        if ret := self._check("nvmlDeviceGetPciInfo_v3", handle):
            return ret
        gpu = self._gpu(handle)[1]
        struct = _out(info)
        assert isinstance(struct, pynvml.nvmlPciInfo_t)
        struct.busId = gpu.bus_id.encode()
        struct.busIdLegacy = gpu.bus_id.encode()
        struct.domain, struct.bus = 0, int(gpu.bus_id.split(":")[1], 16)
        struct.pciDeviceId = 0x233010DE
        return SUCCESS

    def nvmlDeviceGetMigMode(self, handle: object, current: object, pending: object) -> int:
        if ret := self._check("nvmlDeviceGetMigMode", handle):
            return ret
        gpu = self._gpu(handle)[1]
        _out(current).value = gpu.mig_current
        _out(pending).value = gpu.mig_current
        return SUCCESS

    def nvmlDeviceGetNumaNodeId(self, handle: object, node: object) -> int:
        if ret := self._check("nvmlDeviceGetNumaNodeId", handle):
            return ret
        _out(node).value = self._gpu(handle)[1].numa_node
        return SUCCESS

    def nvmlDeviceGetTopologyCommonAncestor(self, first: object, second: object, level: object) -> int:
        if ret := self._check("nvmlDeviceGetTopologyCommonAncestor", first):
            return ret
        a, b = self._gpu(first)[0], self._gpu(second)[0]
        _out(level).value = self.topology_levels.get((min(a, b), max(a, b)), pynvml.NVML_TOPOLOGY_SYSTEM)
        return SUCCESS

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int, active: object) -> int:
        if ret := self._check("nvmlDeviceGetNvLinkState", handle):
            return ret
        gpu = self._gpu(handle)[1]
        if gpu.nvlink_count == 0:
            return NOT_SUPPORTED
        if link >= gpu.nvlink_count:
            return INVALID_ARGUMENT
        _out(active).value = 1
        return SUCCESS

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: object, link: int, info: object) -> int:
        if ret := self._check("nvmlDeviceGetNvLinkRemotePciInfo_v2", handle):
            return ret
        _out(info).busId = self._gpu(handle)[1].nvlink_remote_bus_id.encode()
        return SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle: object, utilization: object) -> int:
        if ret := self._check("nvmlDeviceGetUtilizationRates", handle):
            return ret
        struct = _out(utilization)
        assert isinstance(struct, pynvml.c_nvmlUtilization_t)
        struct.gpu = self._gpu(handle)[1].utilization_gpu
        struct.memory = struct.gpu // 2
        return SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: object, milliwatts: object) -> int:
        if ret := self._check("nvmlDeviceGetPowerUsage", handle):
            return ret
        _out(milliwatts).value = self._gpu(handle)[1].power_mw
        return SUCCESS

    def nvmlDeviceGetTemperature(self, handle: object, sensor: object, temperature: object) -> int:
        if ret := self._check("nvmlDeviceGetTemperature", handle):
            return ret
        _out(temperature).value = self._gpu(handle)[1].temperature_c
        return SUCCESS

    def nvmlDeviceGetClockInfo(self, handle: object, clock_type: object, clock: object) -> int:
        if ret := self._check("nvmlDeviceGetClockInfo", handle):
            return ret
        _out(clock).value = self._gpu(handle)[1].sm_clock_mhz
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: object, count: object, infos: object) -> int:
        if ret := self._check("nvmlDeviceGetComputeRunningProcesses_v3", handle):
            return ret
        processes = self._gpu(handle)[1].processes
        counter = _out(count)
        if infos is None:
            counter.value = len(processes)
            return INSUFFICIENT_SIZE if processes else SUCCESS
        if counter.value < len(processes):
            return INSUFFICIENT_SIZE
        for slot, (pid, used) in enumerate(processes):
            assert isinstance(infos[slot], pynvml.c_nvmlProcessInfo_v3_t)
            infos[slot].pid = pid
            infos[slot].usedGpuMemory = used
        counter.value = len(processes)
        return SUCCESS

    def nvmlDeviceGetTotalEccErrors(self, handle: object, error_type: object, counter: object, count: object) -> int:
        if ret := self._check("nvmlDeviceGetTotalEccErrors", handle):
            return ret
        gpu = self._gpu(handle)[1]
        volatile = counter.value == pynvml.NVML_VOLATILE_ECC
        _out(count).value = gpu.ecc_volatile if volatile else gpu.ecc_aggregate
        return SUCCESS

    def nvmlEventSetCreate(self, event_set: object) -> int:
        target = _out(event_set)
        ctypes.cast(ctypes.pointer(target), ctypes.POINTER(ctypes.c_void_p)).contents.value = 0xE0E0
        return SUCCESS

    def nvmlDeviceRegisterEvents(self, handle: object, event_types: object, event_set: object) -> int:
        return self._check("nvmlDeviceRegisterEvents", handle)

    def nvmlEventSetWait_v2(self, event_set: object, data: object, timeout_ms: object) -> int:
        if not self.events:
            time.sleep(min(timeout_ms.value, 10) / 1000)  # like the real wait, without a slow test
            return TIMEOUT
        index, xid = self.events.popleft()
        struct = _out(data)
        assert isinstance(struct, pynvml.c_nvmlEventData_t)
        struct.eventType = pynvml.nvmlEventTypeXidCriticalError
        struct.eventData = xid
        if index is not None:
            struct.device = ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + index), pynvml.c_nvmlDevice_t)
        return SUCCESS

    def nvmlEventSetFree(self, event_set: object) -> int:
        return SUCCESS
