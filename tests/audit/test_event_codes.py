"""Audit event codes: each app registers its own from its AppConfig.ready(), once, and a code nobody registered is
refused. The scan reads every ``audit_record(action=...)`` call in the apps, so a new action without a code fails
here instead of in production."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
from django.apps import apps
from django.db import transaction

from audit import events
from audit.events import REGISTRY, UnknownAuditEvent, lookup, register
from audit.models import AuditRecord
from audit.services import audit_record
from scheduler import audit_events as scheduler_events
from scheduler.fleet import audit_events as fleet_events
from tenants import audit_events as tenants_events
from tests.conftest import TEST_AUDIT_EVENTS

ROOT = Path(__file__).resolve().parents[2]
APP_EVENTS = {
    "audit": events.EVENTS,
    "tenants": tenants_events.EVENTS,
    "scheduler": scheduler_events.EVENTS,
    "fleet": fleet_events.EVENTS,
}
# Callers that pass an action code through to audit_record: (function, its argument, the prefixes it adds).
# ``approval_audit(approval, verb)`` records ``quota_request.<verb>`` or ``approval.<verb>`` by the approval's kind.
FORWARDERS = {
    "_node_set_status": ("action", [""]),
    "approval_audit": (1, ["quota_request.", "approval."]),
}


def _app_modules() -> list[Path]:
    found = []
    for config in apps.get_app_configs():
        path = Path(config.path)
        if path.is_relative_to(ROOT) and ".venv" not in path.parts:
            found += [p for p in path.rglob("*.py") if "migrations" not in p.parts]
    return sorted(set(found))


def _values(node: ast.AST, assignments: dict[str, list[ast.AST]], depth: int = 0) -> set[str]:
    """The strings ``node`` can evaluate to, as far as reading the module tells: constants, both arms of a
    conditional, a dict's values and a ``.get`` default, and what a name was assigned anywhere in the module."""
    if depth > 5:
        return set()
    again = lambda child: _values(child, assignments, depth + 1)  # noqa: E731
    if isinstance(node, ast.Constant):
        return {node.value} if isinstance(node.value, str) else set()
    if isinstance(node, ast.IfExp):
        return again(node.body) | again(node.orelse)
    if isinstance(node, ast.BoolOp):
        return set().union(*(again(value) for value in node.values))
    if isinstance(node, ast.Dict):
        return set().union(*(again(value) for value in node.values))
    if isinstance(node, ast.Name):
        return set().union(*(again(value) for value in assignments.get(node.id, [])))
    if isinstance(node, ast.Subscript):
        return again(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return again(node.func.value) | (again(node.args[1]) if len(node.args) > 1 else set())
    return set()


def _enclosing_function(tree: ast.Module, call: ast.Call) -> str | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(child is call for child in ast.walk(node)):
            return node.name
    return None


def _argument(call: ast.Call, which: str | int) -> ast.AST | None:
    if isinstance(which, int):
        return call.args[which] if len(call.args) > which else None
    return next((kw.value for kw in call.keywords if kw.arg == which), None)


def _recorded_codes() -> dict[str, list[str]]:
    """Each code the apps' code passes to ``audit_record`` (directly or through a forwarder) → where."""
    codes: dict[str, list[str]] = {}
    for path in _app_modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        # Every value assigned to a name anywhere in the module (a code kept in a constant or a local variable).
        assignments: dict[str, list[ast.AST]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        assignments.setdefault(target.id, []).append(node.value)
        for call in ast.walk(tree):
            if not isinstance(call, ast.Call):
                continue
            name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            if name == "audit_record":
                action = _argument(call, "action")
                assert action is not None, f"{where}: audit_record without action="
                values = _values(action, assignments)
                if not values:
                    # Only a forwarder passes on a code it was given (its callers are read below).
                    function = _enclosing_function(tree, call)
                    assert function in FORWARDERS, f"{where}: cannot tell which code {ast.unparse(action)} is"
                for value in values:
                    codes.setdefault(value, []).append(where)
            elif name in FORWARDERS:
                which, prefixes = FORWARDERS[name]
                argument = _argument(call, which)
                if argument is None:
                    continue  # the forwarder's definition, or a call passing its own parameter on
                for value in _values(argument, assignments):
                    for prefix in prefixes:
                        codes.setdefault(prefix + value, []).append(where)
    return codes


def test_an_unknown_code_is_refused_naming_it():
    with pytest.raises(UnknownAuditEvent, match=r"no\.such_code"):
        lookup("no.such_code")


@pytest.mark.django_db
def test_audit_record_refuses_an_unknown_code_and_records_nothing():
    with pytest.raises(UnknownAuditEvent, match=r"no\.such_code"), transaction.atomic():
        audit_record(action="no.such_code", actor=None)
    assert not AuditRecord.objects.filter(action="no.such_code").exists()


def test_every_code_the_apps_record_is_registered():
    recorded = _recorded_codes()
    assert len(recorded) > 40, "the scan found too few audit_record calls: has the call changed its name?"
    missing = {code: where for code, where in recorded.items() if code not in REGISTRY}
    # approval_audit adds both prefixes to each verb; a kind only ever takes some verbs (a job admission is never
    # sent back for changes), so a verb must be registered under at least one prefix.
    for code in list(missing):
        verb = code.split(".", 1)[1]
        if code.startswith(("quota_request.", "approval.")) and any(
            f"{p}{verb}" in REGISTRY for p in ("quota_request.", "approval.")
        ):
            del missing[code]
    assert not missing, f"unregistered audit codes (add them to the app's audit_events.py): {missing}"


def test_every_code_is_registered_by_exactly_one_app():
    counts = Counter(code for app_events in APP_EVENTS.values() for code, _category, _description in app_events)
    assert not [code for code, count in counts.items() if count > 1]
    by_app = {code: app for app, app_events in APP_EVENTS.items() for code, _c, _d in app_events}
    test_codes = {code for code, _c, _d in TEST_AUDIT_EVENTS}
    assert {code: event.app for code, event in REGISTRY.items() if code not in test_codes} == by_app


def test_a_second_app_cannot_claim_a_code():
    event = REGISTRY["job.submit"]
    with pytest.raises(ValueError, match=r"job\.submit"):
        register(event.code, event.category, event.description, app="tenants")
    assert register(event.code, event.category, event.description, app=event.app) == event  # idempotent


def test_codes_witnessed_at_commit_are_registered():
    assert REGISTRY.keys() >= events.WITNESS_AT_COMMIT
