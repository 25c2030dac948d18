"""Where a request came from (IP, user agent, request id), for audit records.

The middleware puts the current request's origin in a context variable, so services that do not receive the
request still record where the action came from. ``request_origin`` reads a DRF Request, a Django
HttpRequest or an ASGI scope dict.
"""

from __future__ import annotations

import contextvars
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from audit import conf

REQUEST_ID_HEADER = "HTTP_X_REQUEST_ID"
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,64}$")


@dataclass(frozen=True)
class Origin:
    ip: str | None = None
    user_agent: str = ""
    request_id: str = ""


_current: contextvars.ContextVar[Origin | None] = contextvars.ContextVar("gpupool_audit_origin", default=None)


def current_origin() -> Origin | None:
    return _current.get()


def clean_request_id(raw: str | None) -> str:
    """A caller's X-Request-ID if it is a sane token, else a fresh one (never trust arbitrary header bytes)."""
    if raw and _VALID_REQUEST_ID.match(raw):
        return raw
    return uuid.uuid4().hex


def _first_forwarded(value: str) -> str | None:
    first = value.split(",")[0].strip()
    return first or None


def request_origin(request: Any) -> Origin:
    """Origin of a DRF Request, Django HttpRequest or ASGI scope dict."""
    if isinstance(request, dict):  # ASGI scope
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.get("headers", [])}
        client = request.get("client") or (None, None)
        ip = client[0] if client else None
        if conf.trust_forwarded_for() and headers.get("x-forwarded-for"):
            ip = _first_forwarded(headers["x-forwarded-for"])
        return Origin(
            ip=ip or None,
            user_agent=headers.get("user-agent", "")[:300],
            request_id=clean_request_id(headers.get("x-request-id")),
        )
    meta = getattr(request, "META", None)
    if meta is None:  # a DRF Request proxies to its HttpRequest; be explicit for other wrappers
        meta = getattr(getattr(request, "_request", None), "META", {}) or {}
    ip = meta.get("REMOTE_ADDR") or None
    if conf.trust_forwarded_for() and meta.get("HTTP_X_FORWARDED_FOR"):
        ip = _first_forwarded(meta["HTTP_X_FORWARDED_FOR"])
    request_id = getattr(request, "request_id", "") or clean_request_id(meta.get(REQUEST_ID_HEADER))
    return Origin(ip=ip, user_agent=str(meta.get("HTTP_USER_AGENT", ""))[:300], request_id=request_id)


class RequestIdMiddleware:
    """Give every request an id (the caller's sane ``X-Request-ID`` or a new one), echo it in the response,
    and make the request's origin available to audit records written while it runs."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _enter(self, request: Any) -> contextvars.Token:
        request.request_id = clean_request_id(request.META.get(REQUEST_ID_HEADER))
        request.META[REQUEST_ID_HEADER] = request.request_id
        return _current.set(request_origin(request))

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self.__acall__(request)
        token = self._enter(request)
        try:
            response = self.get_response(request)
        finally:
            _current.reset(token)
        response["X-Request-ID"] = request.request_id
        return response

    async def __acall__(self, request: Any) -> Any:
        token = self._enter(request)
        try:
            response = await self.get_response(request)
        finally:
            _current.reset(token)
        response["X-Request-ID"] = request.request_id
        return response
