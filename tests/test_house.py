"""The house rules a newcomer relies on, checked on the source (issue 34).

* Imports between our own packages stand at the top of a module, so the import graph that ``lint-imports``
  checks is the real one: an import inside a function hides an arrow (often one that closes a circle).
  The few places where Python or Django need it lazy are listed in ``LAZY_IMPORTS_ALLOWED`` with the reason.
* ``docs/architecture.md`` names modules and folders; every one it names exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUR_PACKAGES = (
    "portal",
    "kernel",
    "tenants",
    "scheduler",
    "audit",
    "nodeagent",
    "frontend",
    "catalog",
    "gpupool_client",
)

#: Where an import inside a function is the rule, not a shortcut (module path prefix or function name).
#: ``ready``: Django loads models before an AppConfig may import the modules that use them.
#: ``management/commands``: a command's module is imported for ``--help`` of every command; heavy ones load
#: what they run only when run.
LAZY_IMPORT_FUNCTIONS = frozenset({"ready"})
LAZY_IMPORT_PATHS = ("management/commands/",)
#: Modules loaded before Django is set up, where an import of models at the top would fail.
LAZY_IMPORT_MODULES = {
    # The Celery app is imported by ``portal/__init__.py``, before the app registry is ready.
    "portal/celery.py": "imported by portal/__init__.py before Django's apps are loaded",
    # ``serve`` sets the environment up first; importing the ASGI application sets Django up.
    "portal/server.py": "the ASGI application is imported after the server configured the environment",
    # DRF loads authentication classes while ``rest_framework.views`` is still importing.
    "tenants/authentication.py": "DRF imports it while rest_framework.views is importing (tokens import views)",
}


def _python_files() -> list[Path]:
    files: list[Path] = []
    for package in OUR_PACKAGES:
        files.extend(p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)
    return sorted(files)


def _function_level_imports(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function, imported module) for each import of our packages inside a function."""
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if function is not None and isinstance(child, ast.Import):
                found.extend(
                    (child.lineno, function, alias.name)
                    for alias in child.names
                    if alias.name.split(".")[0] in OUR_PACKAGES
                )
            elif (
                function is not None
                and isinstance(child, ast.ImportFrom)
                and child.level == 0
                and child.module
                and child.module.split(".")[0] in OUR_PACKAGES
            ):
                found.append((child.lineno, function, child.module))
            visit(child, inner)

    visit(ast.parse(source), None)
    return found


def test_the_walker_sees_an_import_inside_a_function():
    planted = "import os\n\ndef f():\n    from scheduler.models import Job\n    return Job\n"
    assert _function_level_imports(planted) == [(4, "f", "scheduler.models")]
    assert _function_level_imports("from scheduler.models import Job\n") == []


def test_no_import_between_our_modules_hides_inside_a_function():
    hidden = []
    for path in _python_files():
        relative = path.relative_to(ROOT).as_posix()
        if any(part in relative for part in LAZY_IMPORT_PATHS) or relative in LAZY_IMPORT_MODULES:
            continue
        for line, function, module in _function_level_imports(path.read_text()):
            if function not in LAZY_IMPORT_FUNCTIONS:
                hidden.append(f"{relative}:{line} {function}() imports {module}")
    assert hidden == [], "imports inside functions (move them to the top, or break the cycle):\n" + "\n".join(hidden)


def _private_names_imported(source: str) -> list[tuple[int, str, str]]:
    """(line, module, name) for each ``from <our module> import _name``: a private name used as an interface."""
    return [
        (node.lineno, node.module, alias.name)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
        if node.module.split(".")[0] in OUR_PACKAGES
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_the_walker_sees_a_private_name_imported():
    assert _private_names_imported("from scheduler.persist.batch import _Batch, PlanBatch\n") == [
        (1, "scheduler.persist.batch", "_Batch")
    ]


def test_no_module_imports_another_modules_private_name():
    """What another module needs is public, in a module named for it (issue 34: 49 such imports were found)."""
    found = [
        f"{path.relative_to(ROOT).as_posix()}:{line} imports {name} from {module}"
        for path in _python_files()
        for line, module, name in _private_names_imported(path.read_text())
    ]
    assert found == []


# --- docs/architecture.md is true ------------------------------------------------------------------------

_ARCHITECTURE = ROOT / "docs" / "architecture.md"
_CODE_SPAN = re.compile(r"`([^`\s]+)`")


def _named_paths(text: str) -> set[str]:
    """Paths (``scheduler/persist/``, ``kernel/access_rules.py``) and dotted modules (``tenants.access``) in code
    spans."""
    names = set()
    for span in _CODE_SPAN.findall(text):
        span = span.rstrip(",.;:")
        if span.split("/")[0].split(".")[0] not in (*OUR_PACKAGES, "tests"):
            continue
        names.add(span)
    return names


def _exists(name: str) -> bool:
    if "/" in name and (ROOT / name).exists():
        return True
    name = name.replace("/", ".")  # ``scheduler/fleet/fencing.lease_timing()``: a module's attribute
    # a dotted name: the longest prefix that is a module, the rest attributes of it
    parts = name.removesuffix("()").split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if not base.is_dir() else base / "__init__.py"
        if module.exists():
            rest = parts[cut:]
            if not rest:
                return True
            tree = ast.parse(module.read_text())
            defined = {
                node.name
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            } | {
                target.id
                for node in ast.walk(tree)
                if isinstance(node, ast.Assign)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            return rest[0] in defined
    return False


def test_the_walker_of_the_architecture_page_tells_a_missing_module():
    assert _exists("scheduler/core/")
    assert _exists("tenants.access.allows")
    assert not _exists("scheduler/nowhere.py")
    assert not _exists("tenants.access.nothing_of_that_name")


def test_every_module_the_architecture_page_names_exists():
    names = _named_paths(_ARCHITECTURE.read_text())
    assert len(names) > 20, "the page names the modules of the layout"
    missing = sorted(name for name in names if not _exists(name))
    assert missing == []


def _services_tables(text: str) -> list[tuple[str, list[str]]]:
    """(package folder, module names) of each row ``| `pkg/services/` | `a` (…) · `b` … |``."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if (
            len(cells) == 2
            and re.fullmatch(r"`[a-z_]+/[a-z_/]+/`", cells[0])
            and (cells[0].strip("`").split("/")[0] in OUR_PACKAGES)
        ):
            modules = [m for m in re.findall(r"(?:^|·)\s*`([a-z_]+)`", cells[1])]
            rows.append((cells[0].strip("`"), modules))
    return rows


@pytest.mark.parametrize("package,modules", _services_tables(_ARCHITECTURE.read_text()))
def test_every_room_a_package_row_lists_is_a_module_of_it(package, modules):
    assert modules, package
    for module in modules:
        assert (ROOT / package / f"{module}.py").exists() or (ROOT / package / module).is_dir(), (package, module)
