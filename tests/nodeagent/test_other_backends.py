"""Simulated and Ascend backends, and vendor detection by PCI id."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.backends import detect_backend, detect_vendors, load_backend
from nodeagent.backends.ascend import AscendBackend, parse_npu_smi_info
from nodeagent.backends.base import BackendUnavailable, DeviceBackend, WorkloadLoad
from nodeagent.backends.simulated import SimulatedBackend

# Recorded from an Atlas 800T A2 (8x 910B3), trimmed to three NPUs; NPU 1 is training, NPU 2 has a warning.
NPU_SMI_INFO = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.6                   Version: 23.0.6                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 95.9        36                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3396 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 354.2       48                0    / 0             |
| 0                         | 0000:C2:00.0  | 87          0    / 0          52101/ 65536         |
+===========================+===============+====================================================+
| 2     910B3               | Warning       | NA          40                0    / 0             |
| 0                         | 0000:81:00.0  | 0           0    / 0          3390 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
| 1       0                 | 2718281       | python3.9                | 48668                   |
+===========================+===============+====================================================+
| No running processes found in NPU 2                                                            |
+===========================+===============+====================================================+
"""


def test_simulated_backend_has_deterministic_uuids_per_node_name() -> None:
    first = SimulatedBackend(node_name="sim-00", cards=8).inventory()
    again = SimulatedBackend(node_name="sim-00", cards=8).inventory()
    other = SimulatedBackend(node_name="sim-01", cards=8).inventory()

    assert [d.uuid for d in first] == [d.uuid for d in again]
    assert not {d.uuid for d in first} & {d.uuid for d in other}
    assert len({d.uuid for d in first}) == 8
    assert all(d.uuid.startswith("GPU-") for d in first)
    assert first[0].model == "NVIDIA H100 80GB HBM3"
    assert first[0].memory_mib == 81559


def test_simulated_topology_is_two_numa_nodes_one_nvlink_domain() -> None:
    backend = SimulatedBackend(node_name="n", cards=8)

    devices = backend.inventory()
    topology = backend.topology()

    assert isinstance(backend, DeviceBackend)
    assert [d.numa_node for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert devices[0].pcie_switch == devices[1].pcie_switch != devices[2].pcie_switch
    assert topology.numa_nodes == [0, 1]
    assert topology.nvlink_domains == ["nvlink0"]
    assert len(topology.pcie_switches) == 4


def test_simulated_load_follows_allocated_millis() -> None:
    backend = SimulatedBackend(node_name="n", cards=3, seed=1)
    uuids = [d.uuid for d in backend.inventory()]
    idle = {s.uuid: s for s in backend.sample()}

    backend.observe_workloads(
        [
            WorkloadLoad(uuid=uuids[0], millis=1000, memory_mib=None, pid=100),
            WorkloadLoad(uuid=uuids[1], millis=250, memory_mib=10_000, pid=101),
        ]
    )
    busy = {s.uuid: s for s in backend.sample()}

    assert idle[uuids[0]].utilization_pct == 0.0
    assert busy[uuids[0]].utilization_pct > 75
    assert 10 < busy[uuids[1]].utilization_pct < 40
    assert busy[uuids[2]].utilization_pct == 0.0
    assert busy[uuids[0]].power_w > busy[uuids[1]].power_w > idle[uuids[1]].power_w
    assert busy[uuids[1]].memory_used_mib >= 10_000
    assert busy[uuids[0]].memory_used_mib > 60_000
    assert backend.processes()[uuids[1]][0].pid == 101


def test_simulated_noise_is_reproducible_with_the_same_seed() -> None:
    def run(seed: int) -> list[float]:
        backend = SimulatedBackend(node_name="n", cards=1, seed=seed)
        backend.observe_workloads([WorkloadLoad(uuid=backend.inventory()[0].uuid, millis=500, memory_mib=1, pid=1)])
        return [backend.sample()[0].power_w for _ in range(5)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_unknown_simulated_model_names_the_choices() -> None:
    with pytest.raises(BackendUnavailable, match=r"simulated: unknown --model 'B200'.*H100-80G"):
        load_backend("simulated", model="B200")


def test_npu_smi_info_parser_reads_every_npu() -> None:
    records = parse_npu_smi_info(NPU_SMI_INFO)

    assert [r.npu for r in records] == [0, 1, 2]
    busy = records[1]
    assert (busy.name, busy.bus_id, busy.health) == ("910B3", "0000:C2:00.0", "healthy")
    assert (busy.power_w, busy.temperature_c, busy.aicore_pct) == (354.2, 48.0, 87.0)
    assert (busy.hbm_used_mib, busy.hbm_total_mib) == (52101, 65536)
    assert [(p.pid, p.used_memory_mib) for p in busy.processes] == [(2718281, 48668)]
    assert records[0].processes == []
    assert records[2].health == "degraded"
    assert records[2].power_w is None  # "NA"


def test_npu_smi_parser_rejects_text_without_npu_rows() -> None:
    with pytest.raises(ValueError, match="no NPU rows"):
        parse_npu_smi_info("command not found\n")


def test_ascend_backend_reports_inventory_and_samples_from_npu_smi() -> None:
    backend = AscendBackend(run_npu_smi=lambda: NPU_SMI_INFO)

    devices = backend.inventory()
    samples = backend.sample()

    assert isinstance(backend, DeviceBackend)
    assert devices[1].uuid == "NPU-0000:c2:00.0"
    assert (devices[1].vendor, devices[1].model, devices[1].memory_mib) == ("ascend", "Ascend 910B3", 65536)
    assert {d.nvlink_domain for d in devices} == {"hccs0"}
    assert samples[1].utilization_pct == 87.0
    assert samples[1].memory_used_mib == 52101
    assert backend.processes()["NPU-0000:c2:00.0"][0].pid == 2718281


def test_ascend_backend_marks_devices_unhealthy_when_npu_smi_stops_answering() -> None:
    answers = [NPU_SMI_INFO]

    def npu_smi() -> str:
        if answers:
            return answers.pop()
        raise OSError("npu-smi: device or resource busy")

    backend = AscendBackend(run_npu_smi=npu_smi)
    samples = backend.sample()

    assert {s.health for s in samples} == {"unhealthy"}


def test_ascend_backend_without_npu_smi_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")

    with pytest.raises(BackendUnavailable, match=r"^ascend: npu-smi not found on PATH"):
        load_backend("ascend")


def _pci_device(root: Path, address: str, vendor: int, device_class: int) -> None:
    folder = root / address
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(f"0x{vendor:04x}\n")
    (folder / "class").write_text(f"0x{device_class:06x}\n")


def test_vendors_are_detected_by_pci_vendor_id_and_accelerator_class(tmp_path: Path) -> None:
    _pci_device(tmp_path, "0000:18:00.0", 0x10DE, 0x030200)  # NVIDIA 3D controller
    _pci_device(tmp_path, "0000:2a:00.0", 0x10DE, 0x030200)
    _pci_device(tmp_path, "0000:c1:00.0", 0x19E5, 0x120000)  # Huawei processing accelerator
    _pci_device(tmp_path, "0000:00:14.0", 0x1002, 0x0C0330)  # AMD USB controller: not a GPU
    _pci_device(tmp_path, "0000:3b:00.0", 0x19E5, 0x020000)  # Huawei NIC: not an NPU
    _pci_device(tmp_path, "0000:41:00.0", 0x1D94, 0x120000)  # Hygon DCU

    assert detect_vendors(tmp_path) == {"nvidia": 2, "ascend": 1, "hygon": 1}
    assert detect_backend(tmp_path) == "nvml"


def test_detection_without_accelerators_suggests_the_simulator(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="--backend simulated"):
        detect_backend(tmp_path)


def test_unknown_backend_name_lists_the_choices() -> None:
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        load_backend("tpu")
