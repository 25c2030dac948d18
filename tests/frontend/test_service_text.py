"""The services' refusals the console shows at a field read in the page's language (frontend.service_text)."""

from __future__ import annotations

import ast
import functools
import importlib
import json
import re
import typing
from pathlib import Path

import pytest
from django.utils import translation

from frontend.service_text import PATTERNS, localize
from kernel.api import DomainError
from kernel.messages import Text

# Sample data for a template's placeholders, by name; a number where the pattern wants digits.
SAMPLES = {
    "flavor": "nvidia-h100-80g",
    "parent": "acme",
    "parts": "acme-research 8000, team-a 1000",
    "where": "acme/ascend-910b",
    "role": "parent tenant admin",
    "state": "running",
    "to_state": "queued",
    "status": "approved",
    "job_kind": "training",
    "type": "int",
    "field": "resources.gpus",
    "jobs": "1,234",
    "cap": "1,000",
}


def _template_sample(pattern: re.Pattern[str], template: str) -> tuple[str, dict[str, str]]:
    data = {}
    for name, regex in re.findall(r"\(\?P<(\w+)>((?:[^()]|\([^()]*\))*)\)", pattern.pattern):
        data[name] = SAMPLES.get(name, "12" if regex.lstrip("-?").startswith("\\d") else "acme")
    return template % data, data


@pytest.mark.parametrize(("pattern", "template"), PATTERNS, ids=[t[:50] for _p, t in PATTERNS])
def test_each_pattern_knows_its_english_sentence_and_has_chinese(pattern, template):
    english, data = _template_sample(pattern, template)
    assert pattern.fullmatch(english), english
    # The first pattern that matches is this one: a more general one listed earlier would take its messages.
    assert next(t for p, t in PATTERNS if p.fullmatch(english)) == template
    with translation.override("en"):  # the same sentence; a role reads as its label
        assert localize(english) == english.replace("parent tenant admin", "tenant admin of the parent tenant")
    with translation.override("zh-hans"):
        chinese = localize(english)
    assert chinese != english
    assert not _untranslated(chinese, data.values()), chinese


# Words the Chinese keeps on purpose: what a user types (JSON fields and values of the job spec, settings, API).
KEPT = {
    "command",
    "flavor",
    "flavors",
    "count",
    "gpus",
    "millis",
    "replicas",
    "libc",
    "true",
    "false",
    "none",
    "NAME",
    "VALUE",
}
KEPT |= {"POST", "JSON", "GPUPOOL", "CUDA", "gpupool", "whatif", "since", "until"}
# An English word outside code: not part of a field path, a file path, a flag or a quoted value, nor a field
# label in front of a full-width colon (resources.gpus, then U+FF1A), nor a value in Chinese quotes.
_ENGLISH_WORD = re.compile(r"(?<![\w./'\"\[`=<\u201c-])[A-Za-z]{4,}(?![\w./'\"\]`=>\u201d\uff1a-])")


def _untranslated(text: str, data) -> set[str]:
    """The English words of ``text`` once the data (slugs, numbers, the user's own values) are taken out."""
    for value in sorted(data, key=len, reverse=True):
        text = text.replace(value, " ").replace(value.strip("'"), " ")
    return set(_ENGLISH_WORD.findall(text)) - KEPT


def test_the_role_is_named_in_words_of_the_language():
    english = "This step waits for a parent tenant admin; a system admin deciding it instead must say why (comment)."
    with translation.override("zh-hans"):
        assert "上级租户的租户管理员" in localize(english)


def test_a_message_no_pattern_knows_stays_as_it_was():
    with translation.override("zh-hans"):
        assert localize("Something else went wrong.") == "Something else went wrong."


# --- every refusal the services and the job spec can raise has a pattern --------------------------------------------
#
# The walk reads the modules whose refusals the console shows, finds each ``raise X(...)`` (and ``return X(...)`` of a
# helper) where X is DomainError or a subclass, and each call of a helper that builds one from its arguments
# (jobspec's ``_fail(field, message)``, the services' ``_require(allowed, message)``). It builds a sample message from
# the source, putting sample data where the f-string has an expression, and asks ``localize`` for it in Chinese.

ROOT = Path(__file__).resolve().parents[2]
SCOPE = (
    "tenants/services/*.py",
    "scheduler/services/*.py",
    "scheduler/fleet/services/*.py",
    "scheduler/jobspec.py",
    "scheduler/whatif_history.py",  # the what-if page
    "scheduler/trace_export.py",  # the what-if page's trace download
    "audit/exports.py",  # the audit page's signed export
    "tenants/selectors.py",  # "No tenant with id 7 is visible to you." (adding a member to a tenant deleted meanwhile)
    "scheduler/selectors.py",
)

# Messages the console never shows, by a piece of their source (ast.unparse of the message), with the reason.
EXCLUDED = {
    # Django's password validators' messages, joined; Django translates them itself when it raises.
    "' '.join(exc.messages)": "already in the active language",
    # The what-if setting parser's message, raised again as it is: test_what_if_settings_... builds each kind.
    "str(exc)": "scheduler.sim.policies' message, tested from the parser itself",
    # Agent enrolment and hello: the answer goes to a node agent over the API, never to a console page.
    "bootstrap token": "agent enrolment (API only)",
    "this hello lists devices": "agent hello (API only)",
    "node_name must be 1-128": "agent enrolment (API only)",
    # An API token's own limits: the console signs in with a session, never with a token.
    "-scoped token cannot create": "API-token callers only",
    "A token created with a token": "API-token callers only",
    # Job arrays are submitted through the API only (the console's form submits one job).
    "arrays are admitted only when": "job arrays: API only",
    "submit job arrays through POST": "the API's single-job endpoint only",
    # An inference service's load is reported by the service through the API.
    "may report its load": "load reports: API only",
    "load: must be a number": "load reports: API only",
}

_NUMBER = re.compile(
    r"millis|count|ttl|depth|height|total|\bpk\b|_id\b|\bid\b|len\(|\blow\b|\bhigh\b|\bMAX_|\bMIN_|least|most|"
    r"position|STEP|DAYS|_s\b|\bn\b|threshold|guaranteed|\blimit|//|\bvalue\b|replicas|retention|max_|length",
)


def _sample_value(source: str) -> str:
    """Sample data for one f-string expression, from how the source names it."""
    if "__name__" in source:  # type(value).__name__
        return "int"
    if "expires_at" in source or "isoformat" in source or "since" in source or "until" in source:
        return "2026-12-03 10:00"
    if _NUMBER.search(source):
        return "3"
    if "role" in source:
        return "tenant admin"
    if "state" in source:
        return "running"
    if "status" in source:
        return "pending"
    if "kind" in source:
        return "training"
    if "scope" in source:
        return "read"
    return "acme-research"


class _Unsupported(Exception):
    pass


def _sample(node: ast.expr, env: dict, data: list[str]) -> str:
    """The message ``node`` builds, with sample data (collected in ``data``) for its expressions."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_sample(value, env, data) for value in node.values)
    if isinstance(node, ast.FormattedValue):
        source = ast.unparse(node.value)
        if source in env:
            value, is_data = env[source]
        elif source in env.get("@locals", {}):  # a phrase the function picks (``where = "at the top level"``)
            value, is_data = env["@locals"][source], False
        else:
            value, is_data = _sample_value(source), True
        if node.format_spec is not None and "%Y" in ast.unparse(node.format_spec):
            value = "2026-12-03 10:00"
        if node.conversion == ord("r"):
            value = repr(value)
        if is_data:
            data.append(value)
        return value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _sample(node.left, env, data) + _sample(node.right, env, data)
    if isinstance(node, ast.IfExp):  # ``A(...) if parent else B(...)``: both are the catalogue's; sample the first
        return _sample(node.body, env, data)
    if _catalogue_message(node) is not None:  # ``tenants_messages.NAME(field=..., ...)``: the catalogue's sentence
        params = {k.arg: _sample_value(ast.unparse(k.value)) for k in node.keywords}
        data.extend(params.values())
        return _catalogue_message(node)(**params)
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".join") and node.args:  # ", ".join(names)
        value = "acme-research, team-a"
        data.append(value)
        return value
    if isinstance(node, ast.Name) and node.id in env:
        value, is_data = env[node.id]
        if is_data:
            data.append(value)
        return value
    raise _Unsupported(ast.unparse(node))


def _catalogue_message(node: ast.expr):
    """The catalogue ``Message`` a call ``<app>_messages.NAME(...)`` renders, or None."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id.endswith("_messages")
    ):
        return None
    module = importlib.import_module(node.func.value.id.removesuffix("_messages") + ".messages")
    return getattr(module, node.func.attr)


def _catalogue_ref(node: ast.expr):
    """The catalogue ``Message`` an expression ``<app>_messages.NAME`` names, or None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id.endswith("_messages"):
        module = importlib.import_module(node.value.id.removesuffix("_messages") + ".messages")
        return getattr(module, node.attr)
    return None


def _local_phrases(func: ast.FunctionDef | None) -> dict[str, str]:
    """Variables of ``func`` set to a fixed phrase (the last one written; the others get samples of their own in
    OTHER_SAMPLES): ``x = "..."``, ``x = ... if ... else "..."``, ``x = ... or "..."``."""
    phrases = {}
    for node in ast.walk(func) if func is not None else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.IfExp):
                value = value.orelse
            elif isinstance(value, ast.BoolOp):
                value = value.values[-1]
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                phrases[node.targets[0].id] = value.value
    return phrases


def _error_class(module, func: ast.expr) -> bool:
    target = module
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        target, name = getattr(module, func.value.id, None), func.attr
    elif isinstance(func, ast.Name):
        name = func.id
    else:
        return False
    obj = getattr(target, name, None)
    return isinstance(obj, type) and issubclass(obj, DomainError)


def _message_node(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == "message"), None)


@functools.cache
def _modules() -> list[tuple[Path, object, ast.Module]]:
    found = []
    for pattern in SCOPE:
        for path in sorted(ROOT.glob(pattern)):
            module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
            found.append((path.relative_to(ROOT), module, ast.parse(path.read_text())))
    return found


def _helpers() -> dict[object, tuple[list[str], ast.expr]]:
    """Functions that build a domain error from their parameters: the function -> (parameters, message node)."""
    helpers = {}
    for _path, module, tree in _modules():
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            params = [a.arg for a in func.args.args + func.args.kwonlyargs]
            for node in ast.walk(func):
                call = node.exc if isinstance(node, ast.Raise) else node.value if isinstance(node, ast.Return) else None
                if isinstance(call, ast.Call) and _error_class(module, call.func):
                    message = _message_node(call)
                    names = {n.id for n in ast.walk(message) if isinstance(n, ast.Name)} if message else set()
                    # A helper returns the error it builds (jobspec's _fail) or raises its argument as it is
                    # (_require); any other raise is an ordinary message whose data happen to be parameters.
                    builds = isinstance(node, ast.Return) or isinstance(message, ast.Name)
                    # (A helper that also takes a catalogue message, ``message(**params)``, is walked where
                    # it is called: the sentence is the catalogue's.)
                    catalogue_call = isinstance(message, ast.Call) and ast.unparse(message.func) in params
                    if builds and names & set(params) and hasattr(module, func.name) and not catalogue_call:
                        helpers[getattr(module, func.name)] = (params, message)
    return helpers


def service_messages() -> list[tuple[str, str, list[str]]]:
    """(where, sample message, the sample data in it) for every refusal in SCOPE, and every approval result the
    services store, less EXCLUDED."""
    helpers = _helpers()
    found, seen = [], set()
    for path, module, tree in _modules():
        enclosing = {
            child: func
            for func in ast.walk(tree)
            if isinstance(func, ast.FunctionDef)
            for child in ast.walk(func)
            if isinstance(child, ast.Call)
        }  # ast.walk goes outside in: an inner function overwrites its outer one
        for node in ast.walk(tree):
            results = [t for t in getattr(node, "targets", ()) if getattr(t, "attr", "") == "result_message"]
            if not isinstance(node, ast.Call) and not results:
                continue
            phrases = _local_phrases(enclosing.get(node))
            helper = getattr(module, node.func.id, None) if isinstance(getattr(node, "func", None), ast.Name) else None
            if results:  # an approval's result, shown on its page: ``approval.result_message = f"..."[:500]``
                message, env, data = node.value, {}, []
                message = message.value if isinstance(message, ast.Subscript) else message
            elif helper in helpers and any(_catalogue_ref(arg) is not None for arg in node.args):
                # ``_fail(field, scheduler_messages.NAME, low=...)``: the catalogue's sentence, the field in it
                catalogue = next(_catalogue_ref(arg) for arg in node.args if _catalogue_ref(arg) is not None)
                data = []
                values = {k.arg: _sample_value(ast.unparse(k.value)) for k in node.keywords}
                if "field" in catalogue.placeholders and "field" not in values:
                    values["field"] = (
                        _sample(node.args[0], {"@locals": phrases}, data)
                        if isinstance(node.args[0], ast.Constant | ast.JoinedStr)
                        else _sample_value(ast.unparse(node.args[0]))
                    )
                data.extend(values.values())
                text = catalogue(**values)
                if text not in seen:
                    seen.add(text)
                    found.append((f"{path}:{node.lineno}", text, data))
                continue
            elif helper in helpers:
                params, message = helpers[helper]
                env, data = {}, []
                for param, arg in zip(params, node.args, strict=False):
                    try:  # the data in an f-string argument is collected here; its words are the message's
                        env[param] = (_sample(arg, {"@locals": phrases}, data), False)
                    except _Unsupported:  # a variable (a field name, a role) is data
                        env[param] = (_sample_value(ast.unparse(arg)), True)
            elif _error_class(module, node.func) and not _in_helper(node, helpers):
                message, env, data = _message_node(node), {}, []
            else:
                # A message passed in as a function (approvals' ``refusal=lambda locked: "..."``).
                message = next((k.value.body for k in node.keywords if k.arg == "refusal"), None)
                env, data = {}, []
            env["@locals"] = phrases
            if isinstance(message, ast.IfExp):  # ``refusal(approval) if refusal else "..."``: the literal one
                message = message.orelse
            if message is None:
                continue
            func = enclosing.get(node)
            if isinstance(message, ast.Call) and func is not None and ast.unparse(message.func) in _params(func):
                continue  # a helper rendering the catalogue message it is given: walked where it is called
            source = ast.unparse(message) if helper not in helpers else ast.unparse(node)
            if any(piece in source for piece in EXCLUDED):
                continue
            try:
                text = _sample(message, env, data)
            except _Unsupported as exc:
                pytest.fail(f"{path}:{node.lineno}: cannot build a sample of {exc}; extend _sample or EXCLUDED")
            if text not in seen:  # a helper called from many places builds the same message
                seen.add(text)
                found.append((f"{path}:{node.lineno}", text, data))
    return found


def _params(func: ast.FunctionDef) -> set[str]:
    return {a.arg for a in func.args.args + func.args.kwonlyargs}


def _in_helper(call: ast.Call, helpers) -> bool:
    """Whether ``call`` is the template inside a helper (its message names the helper's parameters)."""
    return any(message is _message_node(call) for _params, message in helpers.values())


MESSAGES = service_messages()


def test_the_walk_finds_the_refusals():
    """A guard against a walk that finds nothing (so passes everything): it must find the known ones."""
    texts = {text for _where, text, _data in MESSAGES}
    assert len(MESSAGES) > 100
    assert "A job spec must be a JSON object." in texts  # jobspec.validate_job_spec
    assert "resources.flavors: give either flavor or flavors, not both." in texts  # through jobspec._fail
    assert "Only a system admin sets prices." in texts  # through _common._require
    assert "This account is deactivated." in texts
    assert "Nobody decided in time." in texts  # an approval's result_message


@pytest.mark.parametrize(("where", "english", "data"), MESSAGES, ids=[w for w, _t, _d in MESSAGES])
def test_every_refusal_the_console_shows_reads_in_chinese(where, english, data):
    # Typed once: the refusal is a message of its app's catalogue (kernel.messages), not a sentence of its own.
    assert isinstance(english, Text), f"{where}: raise a message of the app's catalogue (tenants/messages.py, …)"
    with translation.override("zh-hans"):
        chinese = localize(english)
    assert chinese != english, f"{where}: no pattern in frontend/service_text.py knows {english!r}"
    assert not _untranslated(chinese, data), f"{where}: {chinese}"


# The other phrase a function may put in (the walk samples the last one it writes: ``_local_phrases``).
OTHER_SAMPLES = [  # (message, its data)
    ("A tenant named 'Research' already exists under 'acme'; choose another name.", ["Research", "acme"]),
    (
        "Cannot move 'team-a' under 'the top level': its subtree has 2 level(s) and would reach depth 6; the tree "
        "allows at most 5.",
        ["team-a"],
    ),
    (
        "checkpoint_dir: '/data/x' is not under a checkpoint prefix of tenant acme (/ckpt/acme, /scratch/acme); an "
        "administrator sets them in GPUPOOL_CHECKPOINT_PREFIXES.",
        ["/data/x", "acme", "/ckpt/acme, /scratch/acme"],
    ),
    (
        "resources.flavors: unknown flavor 'h100'; known flavors: nvidia-a100-40g, nvidia-h100-80g.",
        ["h100", "nvidia-a100-40g, nvidia-h100-80g"],
    ),
    (
        "env: variable 'A=B' contains '='; names are letters, digits and '_', not starting with a digit (e.g. MY_VAR).",
        ["A=B"],
    ),
    (
        "env: variable 'A\x00' contains a NUL byte; names are letters, digits and '_', not starting with a digit "
        "(e.g. MY_VAR).",
        ["A\x00"],
    ),
]


@pytest.mark.parametrize(("english", "data"), OTHER_SAMPLES)
def test_the_other_phrases_read_in_chinese(english, data):
    with translation.override("zh-hans"):
        chinese = localize(english)
    assert chinese != english
    assert not _untranslated(chinese, data), chinese


# --- the pages show them so -------------------------------------------------------------------------------------------


@pytest.fixture
def bob_in_chinese(client):
    from tests.frontend.factories import make_flavor, make_member, make_tenant

    make_flavor("nvidia-h100-80g")
    bob = make_member(make_tenant("vision"), username="bob")
    client.force_login(bob)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/"})
    return bob


@pytest.mark.django_db
def test_the_job_form_shows_the_job_specs_refusal_in_chinese(client, bob_in_chinese):
    spec = {"name": "bad", "resources": {"flavors": ["no-such-flavor"], "gpus": 1}, "command": ["x"]}
    html = client.post("/console/jobs/submit/", {"submit_json": "1", "j-spec_json": json.dumps(spec)}).content.decode()
    assert "未知的卡型“no-such-flavor”" in html and "unknown flavor" not in html


@pytest.mark.django_db
def test_a_refused_cancel_reads_in_chinese(client, bob_in_chinese):
    from scheduler.services.jobs import job_cancel, job_submit

    spec = {"name": "t", "resources": {"flavors": ["nvidia-h100-80g"], "gpus": 1}, "command": ["python", "t.py"]}
    job = job_submit(actor=bob_in_chinese, spec=spec)
    job_cancel(job=job, actor=bob_in_chinese)
    html = client.post(f"/console/jobs/{job.pk}/cancel/", {"reason": "again"}, follow=True).content.decode()
    assert f"作业 {job.pk} 已是“已取消”状态" in html and "没有可取消的" in html
    assert "there is nothing to cancel" not in html


# --- messages from outside the services the console shows the same way ------------------------------------------------


def _setting_refusals() -> list[str]:
    """What the what-if page answers for bad settings (scheduler.sim.policies, raised again by
    scheduler.whatif_history), one of each kind, from the parser itself."""
    from enum import Enum

    from scheduler.core.types import Policy
    from scheduler.sim.policies import parse_settings

    hints = typing.get_type_hints(Policy)

    def first(test) -> str:
        return next(name for name, hint in hints.items() if test(hint, typing.get_args(hint)))

    bad = [
        ["preemption"],  # no "="
        ["no_such_setting=1"],
        [f"{first(lambda h, a: h is bool)}=maybe"],
        [f"{first(lambda h, a: isinstance(h, type) and issubclass(h, Enum))}=sideways"],
        [f"{first(lambda h, a: h is float)}=soon"],
        [f"{first(lambda h, a: float in a and type(None) in a)}=soon"],
        [f"{first(lambda h, a: h is float)}=-1"],
        [f"{first(lambda h, a: h is int)}=1.5"],
    ]
    refusals = []
    for pairs in bad:
        with pytest.raises(ValueError) as caught:
            parse_settings(pairs)
        refusals.append(str(caught.value))
    return refusals


def _job_json_refusals() -> list[str]:
    """What the job form's JSON field answers for a NUL or a too deep spec (kernel.request_limits)."""
    from django.conf import settings

    from kernel import request_limits

    deep = "[" * (settings.GPUPOOL_MAX_JSON_DEPTH + 1) + "]" * (settings.GPUPOOL_MAX_JSON_DEPTH + 1)
    refusals = []
    for text in ('"a\\u0000"', '{"env": {"X": "a\\u0000"}}', '{"a\\u0000": 1}', '{"env": {"a\\u0000": "1"}}', deep):
        with pytest.raises(request_limits.BadInput) as caught:
            request_limits.loads_checked(text, where="the job spec")
        refusals.append(caught.value.detail)
    return refusals


@pytest.mark.parametrize("english", [*_setting_refusals(), *_job_json_refusals()])
def test_what_if_settings_and_job_json_limits_read_in_chinese(english):
    from scheduler.sim.policies import setting_names

    with translation.override("zh-hans"):
        chinese = localize(english)
    assert chinese != english, english
    # data: the setting names, the values given, the path in the spec
    data = [", ".join(setting_names()), *re.findall(r"'[^']*'|\(at [^)]*\)|\w+_\w+|\w+(?=:)", english)]
    data += re.findall(r"one of (.+), got", english)
    assert not _untranslated(chinese, [value.removeprefix("(at ").rstrip(")") for value in data]), chinese


def test_a_refusal_quoted_in_an_approvals_result_reads_in_chinese_too():
    english = (
        "Approved, but it no longer fits: Quota acme/nvidia-h100-80g: limit_millis 1000 is below guaranteed_millis "
        "2000; the limit must be at least the guarantee."
    )
    with translation.override("zh-hans"):
        chinese = localize(english)
    assert chinese.startswith("已批准") and "acme/nvidia-h100-80g" in chinese
    assert not _untranslated(chinese, ["acme/nvidia-h100-80g"]), chinese
