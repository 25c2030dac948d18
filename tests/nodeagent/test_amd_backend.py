"""The AMD backend on a fake ``amdsmi`` module with MI300X-shaped answers."""

from __future__ import annotations

import sys
import types

import pytest

from nodeagent.backends import load_backend
from nodeagent.backends.amd import AmdBackend
from nodeagent.backends.base import BackendUnavailable, DeviceBackend


class FakeAmdSmiException(Exception):
    pass


def fake_amdsmi(*, broken: set[int] | None = None) -> types.SimpleNamespace:
    """Two MI300X in one XGMI hive; GPU 1 answers nothing once ``broken`` holds 1."""
    broken = broken if broken is not None else set()
    cards = [
        {"uuid": "c4ff74a1-0000-1000-80ea-6f6c9d9a5c8e", "bdf": "0000:0c:00.0", "numa": 0, "used": 283},
        {"uuid": "7aff74a1-0000-1000-8086-c0ab2f4e1d33", "bdf": "0000:22:00.0", "numa": 1, "used": 150_122},
    ]

    def card(handle):
        if handle in broken:
            raise FakeAmdSmiException("AMDSMI_STATUS_NOT_FOUND")
        return cards[handle]

    smi = types.SimpleNamespace(
        AmdSmiException=FakeAmdSmiException,
        AmdSmiTemperatureType=types.SimpleNamespace(EDGE=0, HOTSPOT=1),
        AmdSmiTemperatureMetric=types.SimpleNamespace(CURRENT=0),
        AmdSmiClkType=types.SimpleNamespace(GFX=0),
        amdsmi_init=lambda *args: None,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: [0, 1],
        amdsmi_get_gpu_device_uuid=lambda h: card(h)["uuid"],
        amdsmi_get_gpu_device_bdf=lambda h: card(h)["bdf"],
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002"},
        amdsmi_get_gpu_vram_usage=lambda h: {"vram_total": 196592, "vram_used": card(h)["used"]},
        amdsmi_get_xgmi_info=lambda h: {"xgmi_hive_id": 0x6E2D3A10C5F0E1B2},
        amdsmi_topo_get_numa_node_number=lambda h: card(h)["numa"],
        amdsmi_get_gpu_activity=lambda h: (
            card(h)
            and {
                "gfx_activity": 0 if h == 0 else 99,
                "umc_activity": 0,
                "mm_activity": "N/A",
            }
        ),
        # MI300X reports no current socket power, only the average.
        amdsmi_get_power_info=lambda h: {"current_socket_power": "N/A", "average_socket_power": 742 if h else 138},
        amdsmi_get_temp_metric=lambda h, sensor, metric: 41 if sensor == 1 else 35,
        amdsmi_get_clock_info=lambda h, kind: {"clk": 2100 if h else 132, "min_clk": 500, "max_clk": 2100},
        amdsmi_get_gpu_process_list=lambda h: (
            [{"pid": 5150, "memory_usage": {"vram_mem": 150_000 * 1024 * 1024}}] if h else []
        ),
        amdsmi_get_gpu_total_ecc_count=lambda h: {"correctable_count": 3, "uncorrectable_count": 0},
    )
    return smi


def test_inventory_reads_mi300x_identity_memory_and_xgmi_hive() -> None:
    backend = AmdBackend(amdsmi_module=fake_amdsmi())

    devices = backend.inventory()

    assert isinstance(backend, DeviceBackend)
    assert [(d.uuid, d.pci_bus_id, d.numa_node) for d in devices] == [
        ("c4ff74a1-0000-1000-80ea-6f6c9d9a5c8e", "0000:0c:00.0", 0),
        ("7aff74a1-0000-1000-8086-c0ab2f4e1d33", "0000:22:00.0", 1),
    ]
    assert {(d.vendor, d.model, d.memory_mib) for d in devices} == {("amd", "AMD Instinct MI300X", 196592)}
    assert devices[0].nvlink_domain == devices[1].nvlink_domain == "xgmi-6e2d3a10c5f0e1b2"
    assert backend.topology().numa_nodes == [0, 1]


def test_sample_falls_back_to_average_power_and_reads_hotspot_temperature() -> None:
    backend = AmdBackend(amdsmi_module=fake_amdsmi())

    idle, busy = backend.sample()

    assert (idle.utilization_pct, idle.power_w, idle.sm_clock_mhz) == (0.0, 138.0, 132)
    assert (busy.utilization_pct, busy.memory_used_mib, busy.power_w) == (99.0, 150_122, 742.0)
    assert busy.temperature_c == 41.0
    assert backend.processes()[busy.uuid][0].pid == 5150
    assert backend.processes()[busy.uuid][0].used_memory_mib == 150_000
    assert backend.ecc_errors()[busy.uuid].volatile == 0


def test_gpu_that_stops_answering_is_unhealthy() -> None:
    broken: set[int] = set()
    backend = AmdBackend(amdsmi_module=fake_amdsmi(broken=broken))
    backend.inventory()

    broken.add(1)
    samples = backend.sample()

    assert [s.health for s in samples] == ["healthy", "unhealthy"]
    assert samples[1].memory_used_mib is None


def test_without_rocm_the_amd_backend_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi raises ImportError

    with pytest.raises(BackendUnavailable, match=r"^amd: the amdsmi Python bindings are not installed"):
        load_backend("amd")
