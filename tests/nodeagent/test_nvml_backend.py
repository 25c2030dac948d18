"""The NVML backend against a fake libnvidia-ml that fills pynvml's real ctypes structs."""

from __future__ import annotations

import time

import pynvml
import pytest

from nodeagent.backends import load_backend
from nodeagent.backends.base import BackendUnavailable, DeviceBackend
from nodeagent.backends.nvml import NvmlBackend
from tests.nodeagent import fake_nvml
from tests.nodeagent.fake_nvml import FakeNvmlLib


@pytest.fixture
def install_fake(monkeypatch: pytest.MonkeyPatch):
    """Swap pynvml's library handle for a fake one; returns a function that installs a given fake."""

    def install(lib: FakeNvmlLib) -> FakeNvmlLib:
        monkeypatch.setattr(pynvml, "nvmlLib", lib)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        return lib

    return install


def _hgx_h100(count: int = 4) -> FakeNvmlLib:
    # Two PCIe switches with two GPUs each; all GPUs on the NVSwitch fabric.
    levels = {(0, 1): pynvml.NVML_TOPOLOGY_SINGLE, (2, 3): pynvml.NVML_TOPOLOGY_SINGLE}
    return FakeNvmlLib([fake_nvml.h100(i) for i in range(count)], topology_levels=levels)


def test_inventory_reports_h100_identity_memory_and_placement(install_fake) -> None:
    install_fake(_hgx_h100())
    backend = NvmlBackend(watch_xid_events=False)

    devices = backend.inventory()

    assert isinstance(backend, DeviceBackend)
    assert [d.index for d in devices] == [0, 1, 2, 3]
    first = devices[0]
    assert first.uuid == "GPU-4b0e5f1c-2d3a-8e9f-0000-0a1b2c3d4e5f"
    assert first.model == "NVIDIA H100 80GB HBM3"
    assert first.vendor == "nvidia"
    assert first.memory_mib == 81559
    assert first.pci_bus_id == "00000000:18:00.0"
    assert first.mig_mode is False
    assert first.health == "healthy"
    assert [d.numa_node for d in devices] == [0, 0, 1, 1]


def test_topology_groups_pcie_switches_by_common_ancestor_and_nvswitch_fabric(install_fake) -> None:
    install_fake(_hgx_h100())
    backend = NvmlBackend(watch_xid_events=False)

    devices = backend.inventory()
    topology = backend.topology()

    assert devices[0].pcie_switch == devices[1].pcie_switch
    assert devices[2].pcie_switch == devices[3].pcie_switch
    assert devices[0].pcie_switch != devices[2].pcie_switch
    assert {d.nvlink_domain for d in devices} == {"nvlink0"}
    assert topology.numa_nodes == [0, 1]
    assert len(topology.pcie_switches) == 2
    assert topology.nvlink_domains == ["nvlink0"]


def test_direct_nvlink_peers_share_a_domain_and_pcie_cards_have_none(install_fake) -> None:
    gpus = [fake_nvml.h100(i) for i in range(3)]
    gpus[0].nvlink_remote_bus_id = gpus[1].bus_id
    gpus[1].nvlink_remote_bus_id = gpus[0].bus_id
    gpus[2].nvlink_count = 0  # a PCIe card: NvLinkState is NotSupported
    install_fake(FakeNvmlLib(gpus))

    devices = NvmlBackend(watch_xid_events=False).inventory()

    assert devices[0].nvlink_domain == devices[1].nvlink_domain is not None
    assert devices[2].nvlink_domain is None


def test_sample_converts_milliwatts_bytes_and_reports_a100_load(install_fake) -> None:
    install_fake(FakeNvmlLib([fake_nvml.a100_40g(0), fake_nvml.a100_40g(1)]))
    backend = NvmlBackend(watch_xid_events=False)

    sample = backend.sample()[0]

    assert sample.uuid == "GPU-9c2f6d10-77b1-4c55-0000-93e8a1f0b2c4"
    assert sample.utilization_pct == 97.0
    assert sample.memory_used_mib == 30_213
    assert sample.memory_total_mib == 40960
    assert sample.power_w == pytest.approx(312.45)
    assert sample.temperature_c == 64.0
    assert sample.sm_clock_mhz == 1410
    assert sample.xid_errors == 0
    assert sample.health == "healthy"
    assert backend.inventory()[0].mig_mode is True


def test_running_processes_are_read_from_the_process_info_array(install_fake) -> None:
    install_fake(FakeNvmlLib([fake_nvml.a100_40g(0), fake_nvml.a100_40g(1)]))
    backend = NvmlBackend(watch_xid_events=False)
    backend_uuid = backend.inventory()[0].uuid

    processes = backend.processes()

    assert [(p.pid, p.used_memory_mib) for p in processes[backend_uuid]] == [(31337, 30_200)]


def test_ecc_counters_read_volatile_and_aggregate(install_fake) -> None:
    lib = install_fake(FakeNvmlLib([fake_nvml.a100_40g(0)]))
    lib.gpus[0].ecc_volatile = 1
    backend = NvmlBackend(watch_xid_events=False)

    counts = backend.ecc_errors()[lib.gpus[0].uuid]

    assert (counts.volatile, counts.aggregate) == (1, 2)
    assert backend.health()[lib.gpus[0].uuid] == "degraded"


def test_not_supported_field_is_reported_as_null_not_a_crash(install_fake) -> None:
    lib = install_fake(_hgx_h100(1))
    lib.gpus[0].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetMigMode"}
    backend = NvmlBackend(watch_xid_events=False)

    sample = backend.sample()[0]
    ecc = backend.ecc_errors()[lib.gpus[0].uuid]

    assert sample.power_w is None
    assert sample.utilization_pct == 0.0  # other fields still arrive
    assert sample.memory_total_mib == 81559
    assert (ecc.volatile, ecc.aggregate) == (None, None)
    assert backend.inventory()[0].mig_mode is None
    assert sample.health == "healthy"


def test_lost_gpu_makes_that_device_unhealthy_and_leaves_others_alone(install_fake) -> None:
    lib = install_fake(_hgx_h100(2))
    backend = NvmlBackend(watch_xid_events=False)
    backend.inventory()

    lib.gpus[1].lost = True
    samples = backend.sample()

    assert samples[0].health == "healthy"
    assert samples[1].health == "unhealthy"
    assert samples[1].utilization_pct is None
    assert samples[1].memory_used_mib is None
    assert backend.health() == {lib.gpus[0].uuid: "healthy", lib.gpus[1].uuid: "unhealthy"}
    assert backend.inventory()[1].health == "unhealthy"


def test_critical_xid_marks_device_unhealthy_but_application_xids_are_ignored(install_fake) -> None:
    lib = install_fake(_hgx_h100(2))
    backend = NvmlBackend(watch_xid_events=False)
    lib.events.extend([(0, 13), (0, 43), (1, 79)])

    seen = [backend.poll_xid_events(0) for _ in range(4)]

    assert seen == [13, 43, 79, None]
    samples = backend.sample()
    assert (samples[0].xid_errors, samples[0].health) == (0, "healthy")
    assert (samples[1].xid_errors, samples[1].last_xid, samples[1].health) == (1, 79, "unhealthy")


def test_missing_driver_library_gives_a_clear_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_library)

    with pytest.raises(BackendUnavailable) as caught:
        load_backend("nvml")

    message = str(caught.value)
    assert message.startswith("nvml: NVIDIA driver library libnvidia-ml.so.1 not found")
    assert "--backend simulated" in message


def test_close_shuts_nvml_down(install_fake) -> None:
    lib = install_fake(_hgx_h100(1))
    backend = NvmlBackend(watch_xid_events=True)

    backend.close()

    assert lib.shutdown_called


def test_gpu_lost_before_start_is_left_out_of_the_inventory(install_fake) -> None:
    lib = install_fake(_hgx_h100(3))
    lib.gpus[1].lost = True
    lib.gpus[1].unsupported = {"open"}

    devices = NvmlBackend(watch_xid_events=False).inventory()

    assert [d.uuid for d in devices] == [lib.gpus[0].uuid, lib.gpus[2].uuid]


def test_xid_watcher_thread_records_critical_xids(install_fake) -> None:
    lib = install_fake(_hgx_h100(1))
    lib.events.append((0, 48))  # double-bit ECC error
    backend = NvmlBackend(watch_xid_events=True)
    try:
        deadline = time.monotonic() + 5
        while backend.health()[lib.gpus[0].uuid] != "unhealthy":
            assert time.monotonic() < deadline, "the watcher did not record the XID"
            time.sleep(0.01)
        assert backend.sample()[0].last_xid == 48
    finally:
        backend.close()
