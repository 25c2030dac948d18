"""The API's error answers, documented once for every operation of the OpenAPI schema.

Every error has the shape ``{"code", "detail"}`` (kernel/api.py), and some answers come from layers below the
views: any request may be refused as bad input (a NUL byte, JSON nested too deep: kernel/request_limits.py),
unauthenticated or not allowed; an operation with an ``{id}`` may not find it; a write may conflict with the
current state; a body may be too large or of an unsupported media type. Declaring these on each view by hand
left most operations documenting only their success, and clients (and schemathesis) saw undocumented statuses.
The hook below adds them wherever a view did not say more, with the shared ``Error`` schema.
"""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every API error: a stable machine-readable code and a message for people.",
    "properties": {
        "code": {"type": "string", "description": "Stable, machine-readable (e.g. invalid, not_found, nul_byte)."},
        "detail": {"type": "string", "description": "What went wrong and how to fix it."},
        "errors": {
            "type": "object",
            "additionalProperties": True,
            "description": "Per-field messages when the body failed validation.",
        },
    },
    "required": ["code", "detail"],
}

DESCRIPTIONS = {
    "400": "Bad input: a value the operation refuses, a NUL byte, or JSON nested too deep.",
    "401": "Not signed in (no, an unknown or an expired token).",
    "403": "Signed in, but not allowed to do this.",
    "404": "No such object, or not visible to you (both look the same).",
    "409": "Conflicts with the object's current state.",
    "413": "The request body is larger than GPUPOOL_MAX_BODY_BYTES.",
    "415": "The request body's media type is not accepted.",
}
_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
_WRITES = {"put", "post", "patch", "delete"}


def _error_codes(path: str, method: str, operation: dict[str, Any]) -> list[str]:
    codes = ["400", "401", "403"]
    if "{" in path:
        codes.append("404")
    if method in _WRITES:
        codes.append("409")
    if "requestBody" in operation or method in ("post", "put", "patch"):
        codes += ["413", "415"]
    return codes


def document_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the ``Error`` component and the error answers of every operation.

    An error answer a view declared with its own schema is kept; one declared with a description only gets the
    ``Error`` schema as its body."""
    result.setdefault("components", {}).setdefault("schemas", {}).setdefault("Error", ERROR_SCHEMA)
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            declared_errors = [code for code in responses if code.startswith(("4", "5"))]
            for code in sorted({*_error_codes(path, method, operation), *declared_errors}):
                response = responses.setdefault(code, {"description": DESCRIPTIONS.get(code, "Error.")})
                response.setdefault("content", body)
    return result
