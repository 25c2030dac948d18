"""One writer of a job's state (issue 34): every statement in the apps that can change ``Job.state`` is in
``scheduler/transitions.py``, so every move is checked against ``ALLOWED_TRANSITIONS`` and leaves its
``JobEvent`` (and, unless the caller records the batch as one act, its audit record).

The walk reads the source (``ast``), not the running code, so it needs no database.
What counts as a write of a job's state:

- an assignment to ``<x>.state`` (``=``, ``+=``, annotated) or ``setattr(<x>, "state", …)`` where ``<x>`` is a
  job: its text names a job (``job``, ``write.job``, ``jobs[0]``…), or it is a name bound in the same function
  or module from ``Job(...)``, ``Job.objects…`` or a call whose name says job (``job_lock_for_update(...)``), or a loop
  variable over something whose text names jobs;
- a ``state=`` keyword in ``Job(...)`` or in ``.update`` / ``.create`` / ``.get_or_create`` /
  ``.update_or_create`` (``defaults`` too) / ``.bulk_create`` on a job queryset (same test on the receiver);
- ``"state"`` in the fields of ``.bulk_update(...)`` or ``.save(update_fields=...)`` on a job, of
  ``update_instance(<job>, ...)``, or in the columns of ``insert_rows(Job, ...)``;
- SQL text that sets ``state``: ``UPDATE … SET … state =`` (before any ``WHERE``), a ``set_sql`` given to
  ``update_rows(Job, ...)`` that assigns ``state``, or ``INSERT INTO … scheduler_job (… state …)``.

Two other things have a ``state`` and are not jobs: the fleet's ``AgentReport`` (a node agent's word on a
workload) and the simulator's runs (``scheduler/sim``: plain dataclasses, no Django). Their writes do not name a
job and are not counted; ``NOT_JOBS`` lists the model so that a receiver naming it is never taken for a job.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ("portal", "tenants", "scheduler", "audit", "frontend", "catalog")
WRITER = "scheduler/transitions.py"
#: Models other than Job with a ``state`` field.
NOT_JOBS = ("AgentReport",)

_NAMES_A_JOB = re.compile(r"job", re.IGNORECASE)
_JOB_SOURCE = re.compile(r"\bJob\b(?!Event|Move|Note|State|Kind)|\bJob\.objects\b")
_CREATES = {"update", "create", "get_or_create", "update_or_create", "bulk_create"}
_SQL_UPDATE_SETS_STATE = re.compile(r"\bUPDATE\b.*?\bSET\b(?:(?!\bWHERE\b).)*?(?<![\w.])state\s*=", re.I | re.S)
_SQL_ASSIGNS_STATE = re.compile(r"(?:^|[\s,])state\s*=", re.I)
_SQL_INSERTS_STATE = re.compile(r"\bINSERT\s+INTO\s+\S*scheduler_job\b\S*\s*\([^)]*\bstate\b", re.I)


def _text(node: ast.AST) -> str:
    return ast.unparse(node)


def _strings(node: ast.AST) -> list[str]:
    """The string constants in ``node`` (an f-string's literal parts joined, its fields as ``{}``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)]
    return [s for child in ast.iter_child_nodes(node) for s in _strings(child)]


class _Walker(ast.NodeVisitor):
    """Collects ``(line, what)`` for every write of a job's state in one module."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.scopes: list[set[str]] = [set()]  # per function: names bound to a job or a job queryset

    # --- what is a job -------------------------------------------------------------------------------
    def _is_job(self, node: ast.AST) -> bool:
        text = _text(node)
        if any(name in text for name in NOT_JOBS):
            return False
        if _NAMES_A_JOB.search(text):
            return True
        root = node
        while isinstance(root, ast.Attribute | ast.Subscript | ast.Call):
            root = root.func if isinstance(root, ast.Call) else root.value
        return isinstance(root, ast.Name) and any(root.id in scope for scope in self.scopes)

    def _binds_job(self, value: ast.AST) -> bool:
        text = _text(value)
        if any(name in text for name in NOT_JOBS):
            return False
        if _JOB_SOURCE.search(text):
            return True
        return isinstance(value, ast.Call) and bool(_NAMES_A_JOB.search(_text(value.func)))

    def _bind(self, target: ast.AST, job: bool) -> None:
        if isinstance(target, ast.Name) and job:
            self.scopes[-1].add(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self._bind(element, job)

    # --- scopes ------------------------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.scopes.append(set())
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    # --- assignments -------------------------------------------------------------------------------
    def _assigned(self, target: ast.AST, line: int) -> None:
        if isinstance(target, ast.Attribute) and target.attr == "state" and self._is_job(target.value):
            self.found.append((line, f"{_text(target)} = ..."))
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self._assigned(element, line)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._assigned(target, node.lineno)
            self._bind(target, self._binds_job(node.value))
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._assigned(node.target, node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assigned(node.target, node.lineno)
        if node.value is not None:
            self._bind(node.target, self._binds_job(node.value))
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._bind(node.target, self._binds_job(node.value))
        self.generic_visit(node)

    def _loop(self, target: ast.AST, iterable: ast.AST) -> None:
        text = _text(iterable)
        self._bind(target, bool(_NAMES_A_JOB.search(text)) and not any(n in text for n in NOT_JOBS))

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self._loop(node.target, node.iter)
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._loop(node.target, node.iter)
        self.generic_visit(node)

    # --- calls -------------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        self._call(node)
        self.generic_visit(node)

    def _call(self, node: ast.Call) -> None:
        func, line = node.func, node.lineno
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if (
            name == "setattr"
            and len(node.args) >= 2
            and "state" in _strings(node.args[1])
            and self._is_job(node.args[0])
        ):
            self.found.append((line, f"setattr({_text(node.args[0])}, 'state', ...)"))
        if isinstance(func, ast.Name) and func.id == "Job" and "state" in keywords:
            self.found.append((line, "Job(state=...)"))
        receiver = func.value if isinstance(func, ast.Attribute) else None
        on_job = receiver is not None and self._is_job(receiver)
        if name in _CREATES and on_job:
            defaults = keywords.get("defaults")
            if "state" in keywords or (isinstance(defaults, ast.Dict) and "state" in _strings(defaults)):
                self.found.append((line, f".{name}(state=...)"))
        if (
            name == "bulk_update"
            and on_job
            and "state"
            in [s for arg in node.args[1:] for s in _strings(arg)]
            + [s for key in ("fields",) if key in keywords for s in _strings(keywords[key])]
        ):
            self.found.append((line, ".bulk_update([... 'state' ...])"))
        if name == "save" and on_job and "update_fields" in keywords and "state" in _strings(keywords["update_fields"]):
            self.found.append((line, ".save(update_fields=[... 'state' ...])"))
        updated = any("state" in _strings(arg) for arg in node.args[1:])
        if name == "update_instance" and node.args and self._is_job(node.args[0]) and updated:
            self.found.append((line, "update_instance(job, {'state', ...})"))
        first_is_job = bool(node.args) and _text(node.args[0]) == "Job"
        if name == "insert_rows" and first_is_job and any("state" in _strings(arg) for arg in node.args[1:2]):
            self.found.append((line, "insert_rows(Job, (... 'state' ...))"))
        sets = _strings(keywords["set_sql"]) if "set_sql" in keywords else []
        if name == "update_rows" and first_is_job and any(_SQL_ASSIGNS_STATE.search(s) for s in sets):
            self.found.append((line, "update_rows(Job, set_sql='state = ...')"))

    # --- SQL text ----------------------------------------------------------------------------------
    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self._sql(node.value, node.lineno)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self._sql(_strings(node)[0], node.lineno)
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                self.visit(value)

    def _sql(self, text: str, line: int) -> None:
        if _SQL_UPDATE_SETS_STATE.search(text) or _SQL_INSERTS_STATE.search(text):
            self.found.append((line, "SQL that sets state"))


def state_writes(source: str) -> list[tuple[int, str]]:
    """Every write of a job's state in ``source`` (a module's text), as ``(line, what)``."""
    walker = _Walker()
    walker.visit(ast.parse(source))
    return sorted(set(walker.found))


def _modules() -> list[Path]:
    return sorted(
        path
        for app in APPS
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.parts and "__pycache__" not in path.parts
    )


def test_every_write_of_a_job_state_is_in_the_transitions_module():
    elsewhere = []
    for path in _modules():
        relative = path.relative_to(ROOT).as_posix()
        if relative == WRITER:
            continue
        elsewhere += [f"{relative}:{line}: {what}" for line, what in state_writes(path.read_text(encoding="utf-8"))]
    assert not elsewhere, (
        "A job's state changes only through scheduler/transitions.py (job_transition, jobs_transition, "
        "job_create, job_array_create); move these writes there:\n" + "\n".join(elsewhere)
    )


def test_the_transitions_module_is_where_the_writes_are():
    # The walker finds the writes the transitions module does make: it is looking at the right things.
    found = state_writes((ROOT / WRITER).read_text(encoding="utf-8"))
    assert any(what.endswith(".state = ...") for _, what in found), found


PLANTED = """
from scheduler.models import Job, JobState
from scheduler.fleet.models import AgentReport


def run(job, write, pks, report, sim_run):
    job.state = "running"
    write.job.state = JobState.QUEUED
    fresh = Job(name="x", state="queued")
    locked = job_lock_for_update(7)
    locked.state = "failed"
    Job.objects.filter(pk__in=pks).update(state="cancelled")
    waiting = Job.objects.filter(pk__in=pks)
    waiting.update(state="cancelled")
    Job.objects.bulk_update([fresh], ["state", "state_message"])
    job.save(update_fields=["state"])
    setattr(job, "state", "queued")
    for each in jobs_of(pks):
        each.state = "queued"
    update_rows(Job, columns=(("id", "bigint"),), rows=[], set_sql="state = %s, updated_at = %s")
    cursor.execute(f"UPDATE {table} SET state = %s WHERE id = %s", ["queued", 1])
    # Not jobs, or not writes:
    report.state = "running"
    sim_run.state = "queued"
    AgentReport.objects.create(state="running")
    Job.objects.filter(state="queued").update(pending_message="")
    cursor.execute("UPDATE scheduler_job SET pending_message = '' WHERE state = 'queued'")
    if job.state == "queued":
        pass
"""


def test_the_walker_finds_every_kind_of_planted_write_and_nothing_else():
    found = state_writes(PLANTED)
    lines = PLANTED.splitlines()
    flagged = {lines[line - 1].strip() for line, _ in found}
    assert flagged == {
        'job.state = "running"',
        "write.job.state = JobState.QUEUED",
        'fresh = Job(name="x", state="queued")',
        'locked.state = "failed"',
        'Job.objects.filter(pk__in=pks).update(state="cancelled")',
        'waiting.update(state="cancelled")',
        'Job.objects.bulk_update([fresh], ["state", "state_message"])',
        'job.save(update_fields=["state"])',
        'setattr(job, "state", "queued")',
        'each.state = "queued"',
        'update_rows(Job, columns=(("id", "bigint"),), rows=[], set_sql="state = %s, updated_at = %s")',
        'cursor.execute(f"UPDATE {table} SET state = %s WHERE id = %s", ["queued", 1])',
    }


@pytest.mark.parametrize("line", ['job.state = "running"', 'Job.objects.filter(pk=1).update(state="failed")'])
def test_a_write_planted_in_a_module_outside_transitions_fails_the_check(line):
    source = f"from scheduler.models import Job\n\n\ndef sneak(job):\n    {line}\n"
    assert state_writes(source) == [(5, state_writes(source)[0][1])]
