"""Input every request must meet before a view sees it: no NUL byte anywhere, JSON nested no deeper than
``GPUPOOL_MAX_JSON_DEPTH``, a body no larger than ``GPUPOOL_MAX_BODY_BYTES``.

Why here, once: PostgreSQL cannot store a NUL character in text or jsonb (a name with one was a ``DataError``
500), and Python's JSON parser recurses once per nesting level (a body nested 5,000 levels was a
``RecursionError`` 500). :class:`RequestLimitsMiddleware` checks the path, the query string, the headers, form
fields and JSON bodies of every request — API and console alike — and answers 400 (413 for a body over the
size limit): ``{"code", "detail"}`` under ``/api/`` or to a JSON request, the console's 400 page otherwise.
:func:`loads_checked` applies the same rules to JSON text a form field carries (the console's job spec).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.views.defaults import bad_request

NUL = "\x00"


class BadInput(Exception):
    """Input refused before any view ran; ``code`` is stable, ``detail`` says what to fix."""

    def __init__(self, code: str, detail: str, *, status: int = 400) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.status = status


def max_json_depth() -> int:
    return settings.GPUPOOL_MAX_JSON_DEPTH


def _nul_in(where: str) -> BadInput:
    return BadInput("nul_byte", f"{where} contains a NUL character (\\u0000); remove it and send the request again.")


def check_json_value(value: Any, *, where: str = "the body", max_depth: int | None = None) -> None:
    """Raise :class:`BadInput` if ``value`` (decoded JSON) nests deeper than ``max_depth`` containers or holds a
    NUL in any string or object key. Iterative, so the check itself cannot exhaust the stack."""
    limit = max_json_depth() if max_depth is None else max_depth
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                raise _nul_in(f"{where}{_field(path)}")
            continue
        if not isinstance(item, dict | list):
            continue
        if depth >= limit:
            raise BadInput(
                "too_deep", f"{where} nests objects and arrays more than {limit} levels deep; send a flatter document."
            )
        if isinstance(item, dict):
            for key, child in item.items():
                if NUL in key:
                    raise _nul_in(f"a key of {where}{_field(path)}")
                stack.append((child, depth + 1, f"{path}.{key}" if path else key))
        else:
            stack.extend((child, depth + 1, f"{path}[{index}]") for index, child in enumerate(item))
    return None


def _field(path: str) -> str:
    return f" (at {path})" if path else ""


def loads_checked(text: str | bytes, *, where: str = "the body") -> Any:
    """``json.loads`` that refuses, as :class:`BadInput`, nesting past the depth limit and NUL characters.

    Invalid JSON still raises ``json.JSONDecodeError`` for the caller's own message."""
    try:
        value = json.loads(text)
    except RecursionError:
        # Deeper than Python's recursion limit: far past ours, so no need to say how deep exactly.
        raise BadInput(
            "too_deep",
            f"{where} nests objects and arrays more than {max_json_depth()} levels deep; send a flatter document.",
        ) from None
    check_json_value(value, where=where)
    return value


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def check_request(request: HttpRequest) -> None:
    """Raise :class:`BadInput` for the first thing in ``request`` the portal refuses."""
    if NUL in request.path:
        raise _nul_in("the URL path")
    for name, value in request.META.items():
        if (name.startswith("HTTP_") or name in ("CONTENT_TYPE", "CONTENT_LENGTH")) and NUL in str(value):
            header = name.removeprefix("HTTP_").replace("_", "-").title()
            raise _nul_in(f"the {header} header")
    if NUL in request.META.get("QUERY_STRING", ""):
        raise _nul_in("the query string")
    for key, values in request.GET.lists():
        if NUL in key or any(NUL in value for value in values):
            raise _nul_in(f"the query parameter {key.replace(NUL, '')!r}")
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return
    content_type = request.META.get("CONTENT_TYPE", "")
    try:
        if _is_json(content_type):
            body = request.body
            # Not JSON at all: the view's parser says so in its own words.
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                loads_checked(body)
        elif content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
            for key, values in request.POST.lists():
                if NUL in key or any(NUL in value for value in values):
                    raise _nul_in(f"the form field {key.replace(NUL, '')!r}")
            for key, files in request.FILES.lists():
                if NUL in key or any(NUL in (upload.name or "") for upload in files):
                    raise _nul_in(f"the uploaded file field {key.replace(NUL, '')!r}")
    except RequestDataTooBig:
        raise BadInput(
            "request_too_large",
            f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes; send less.",
            status=413,
        ) from None
    except MultiPartParserError as exc:
        raise BadInput("malformed", f"the multipart body could not be read: {exc}") from None
    except SuspiciousOperation as exc:  # too many fields or files
        raise BadInput("malformed", str(exc)) from None


def _wants_json(request: HttpRequest) -> bool:
    if request.path.startswith("/api/"):
        return True
    return _is_json(request.META.get("CONTENT_TYPE", "")) or "application/json" in request.META.get("HTTP_ACCEPT", "")


def refusal(request: HttpRequest, exc: BadInput) -> HttpResponse:
    """The answer to refused input: the API's error shape, or the console's 400 page."""
    if _wants_json(request):
        return JsonResponse({"code": exc.code, "detail": exc.detail}, status=exc.status)
    response = bad_request(request, exception=exc)
    response.status_code = exc.status
    return response


class RequestLimitsMiddleware:
    """Refuses bad input (see the module docstring) before sessions, CSRF and authentication touch it: a
    session cookie with a NUL must not reach the session table's query either. The checks do no I/O (the
    server has read the body already), so the middleware runs in either mode without a thread hop."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        try:
            check_request(request)
        except BadInput as exc:
            return refusal(request, exc)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        try:
            check_request(request)
        except BadInput as exc:
            return refusal(request, exc)
        return await self.get_response(request)
