"""Replacing a service function that other modules import by name.

The services are split one domain per module and import each other's functions by name (``from
scheduler.services.cycle import request_cycle``), so replacing a function in the module that defines it would
leave every module that imported it calling the real one. ``patch_imported`` replaces it in all of them.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable
from typing import Any

import pytest

PROJECT_PACKAGES = ("scheduler", "tenants", "frontend", "portal", "kernel", "audit", "catalog")


def patch_imported(monkeypatch: pytest.MonkeyPatch, target: str, replacement: Any) -> None:
    """Replace ``target`` (``"package.module.name"``) in its module and in every module of the project that
    holds the same object under the same name (the modules of its package are loaded first)."""
    module_name, _, attribute = target.rpartition(".")
    package = importlib.import_module(module_name.rpartition(".")[0])
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    original = getattr(importlib.import_module(module_name), attribute)
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in PROJECT_PACKAGES:
            continue
        if vars(module).get(attribute) is original:
            monkeypatch.setattr(module, attribute, replacement)


def patch_request_cycle(monkeypatch: pytest.MonkeyPatch, replacement: Callable[[], Any]) -> None:
    """Record or drop the cycle requests of every service (``scheduler.services.cycle.request_cycle``)."""
    patch_imported(monkeypatch, "scheduler.services.cycle.request_cycle", replacement)
