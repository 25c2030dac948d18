"""The schemathesis loop both API fuzz tests share (tests/security/test_api_fuzz.py, tests/tenants/test_api_fuzz.py).

Each generated request's answer must pass :data:`CONFORMANCE`: below 500, a status code, content type and body
the schema documents (response-schema conformance), and an error keeps the ``{"code", "detail"}`` shape. In
negative mode (requests that break the schema) the server must also refuse them. Failures are collected, not
raised at the first one, so one run lists everything there is to fix; a fixed number of derandomized examples
per operation and no shrinking keep the run bounded in time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

CONFORMANCE = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def error_shape_problem(response) -> str | None:
    """What is wrong with an error answer's shape, or None."""
    if response.status_code < 400:
        return None
    if not response.headers.get("Content-Type", [""])[0].startswith("application/json"):
        return None
    body = response.json()
    if isinstance(body, dict) and {"code", "detail"} <= set(body):
        return None
    return f"error without code/detail: {body}"


#: Endpoints whose caller is a node agent, not an account.
AGENT_PATHS = {"/api/v1/agents/register/", "/api/v1/agents/outputs/{job_id}/{replica}/"}


def fuzz(
    operations,
    headers_for: Callable[[str], dict[str, str]],
    *,
    examples: int,
    prepare: Callable[[object], None] | None = None,
    mode: GenerationMode = GenerationMode.POSITIVE,
) -> tuple[list[str], Counter]:
    """``examples`` generated requests per operation (``prepare(case)`` may adjust each before it is sent);
    returns every failed check and a count of the status codes answered (and of ``examples`` sent)."""
    checks = CONFORMANCE + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
    failures: list[str] = []
    statuses: Counter = Counter()
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
        )
        def check(case) -> None:
            if prepare is not None:
                prepare(case)
            response = case.call(headers=headers_for(case.path))
            statuses[response.status_code] += 1
            statuses["examples"] += 1
            # Only the agents' own endpoints answer 401 to an account: a bootstrap token or a node credential is
            # their proof, not a user's token.
            if response.status_code == 401 and case.path not in AGENT_PATHS:
                statuses["401 outside registration"] += 1
            label = case.operation.label
            request = f"{case.method} {case.formatted_path} query={case.query!r} body={case.body!r}"
            answer = f"{response.status_code} {response.content[:300]!r}"
            try:
                case.validate_response(response, checks=checks)
            except FailureGroup as group:
                failures.extend(f"{label}: {failure.title}: {request}: {answer}" for failure in group.exceptions)
            problem = error_shape_problem(response)
            if problem:
                failures.append(f"{label}: {problem}: {request}")

        check()
    return failures, statuses


def summary(who: str, operations: list, statuses: Counter, failures: list[str]) -> str:
    codes = {code: count for code, count in sorted(statuses.items(), key=str) if isinstance(code, int)}
    return (
        f"schemathesis {who}: {len(operations)} operations, {statuses['examples']} examples, "
        f"{len(failures)} failed checks, statuses {codes}"
    )
