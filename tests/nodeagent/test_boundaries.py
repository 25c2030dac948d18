"""Import boundaries of the agent (STYLE.md #12) and its sampling tiers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from nodeagent.backends.base import EccCounts
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.sampling import Sampler

PACKAGE = Path(__file__).resolve().parents[2] / "nodeagent"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_nvml_backend_imports_pynvml_and_nothing_imports_django_or_the_portal() -> None:
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        imported = _imports(path)
        forbidden = imported & {"django", "rest_framework", "channels", "portal", "scheduler", "tenants", "audit"}
        if "pynvml" in imported and path.name != "nvml.py":
            forbidden.add("pynvml")
        if forbidden:
            offenders[str(path.relative_to(PACKAGE))] = sorted(forbidden)

    assert offenders == {}


def test_protocol_uses_the_standard_library_only() -> None:
    imported = _imports(PACKAGE / "protocol.py")

    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_the_agent_cli_loads_without_django_or_pynvml() -> None:
    code = "import sys, nodeagent.cli; print(sorted(m for m in ('django', 'pynvml') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"


class CountingBackend(SimulatedBackend):
    def __init__(self) -> None:
        super().__init__(node_name="n", cards=1)
        self.calls = {"sample": 0, "processes": 0, "ecc": 0}

    def sample(self):
        self.calls["sample"] += 1
        return super().sample()

    def processes(self):
        self.calls["processes"] += 1
        return super().processes()

    def ecc_errors(self):
        self.calls["ecc"] += 1
        return {uuid: EccCounts(volatile=1, aggregate=5) for uuid in self._uuids}


def test_sampling_tiers_query_processes_every_5_s_and_ecc_every_60_s() -> None:
    backend = CountingBackend()
    sampler = Sampler(backend, process_interval_s=5, ecc_interval_s=60)

    samples = [sampler.sample(float(second)) for second in range(120)]

    assert backend.calls == {"sample": 120, "processes": 24, "ecc": 2}
    assert all((s[0].ecc_errors, s[0].ecc_errors_aggregate) == (1, 5) for s in samples)  # cached in between
