"""Device backends, chosen by name: ``nvml``, ``simulated``, ``ascend``, ``amd`` (see :data:`base.BACKENDS`)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from nodeagent.backends.base import BACKENDS, PCI_VENDOR_IDS, BackendUnavailable, DeviceBackend

#: PCI device classes of accelerators: display controllers (0x03xx) and processing accelerators (0x12xx).
_ACCELERATOR_CLASSES = (0x03, 0x12)
#: Which backend drives each detected vendor.
_VENDOR_BACKEND = {"nvidia": "nvml", "ascend": "ascend", "amd": "amd"}


def load_backend(name: str, **options: Any) -> DeviceBackend:
    """Build the backend called ``name`` (``auto`` picks one from the PCI vendor ids on this machine)."""
    if name == "auto":
        name = detect_backend()
    if name not in BACKENDS:
        if name == "hygon":
            raise BackendUnavailable(name, "no backend for this vendor yet; use --backend simulated to try gpupool")
        raise BackendUnavailable(name, f"unknown backend; choose one of {sorted(BACKENDS)} or auto")
    module_path, _, class_name = BACKENDS[name].rpartition(".")
    backend_class = getattr(importlib.import_module(module_path), class_name)
    return backend_class(**options)


def detect_vendors(pci_root: Path = Path("/sys/bus/pci/devices")) -> dict[str, int]:
    """Count accelerators per vendor by PCI vendor id (0x10de NVIDIA, 0x19e5 Huawei, 0x1002 AMD, 0x1d94 Hygon).

    Only display and processing-accelerator classes count, so an AMD chipset or a Huawei NIC is not a GPU.
    """
    found: dict[str, int] = {}
    if not pci_root.is_dir():
        return found
    for device in sorted(pci_root.iterdir()):
        try:
            vendor_id = int((device / "vendor").read_text().strip(), 16)
            class_id = int((device / "class").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        vendor = PCI_VENDOR_IDS.get(vendor_id)
        if vendor and (class_id >> 16) in _ACCELERATOR_CLASSES:
            found[vendor] = found.get(vendor, 0) + 1
    return found


def detect_backend(pci_root: Path = Path("/sys/bus/pci/devices")) -> str:
    vendors = detect_vendors(pci_root)
    for vendor in sorted(vendors, key=lambda v: -vendors[v]):
        if vendor in _VENDOR_BACKEND:
            return _VENDOR_BACKEND[vendor]
    if vendors:
        raise BackendUnavailable("auto", f"found {sorted(vendors)} accelerators but no backend drives them yet")
    raise BackendUnavailable("auto", "no accelerator found on the PCI bus; use --backend simulated --cards N")


__all__ = ["BACKENDS", "BackendUnavailable", "DeviceBackend", "detect_backend", "detect_vendors", "load_backend"]
