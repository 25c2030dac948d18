"""Errors of the gpupool client, each with the exit code ``gpupool-cli`` ends with.

The server answers every error as ``{"code": ..., "detail": ...}`` (``code`` stable and machine-readable,
``detail`` for people, ``errors`` per field when a body failed validation). :class:`ApiError` carries them
unchanged; its subclasses sort them by what the caller can do about it, and so by exit code.
"""

from __future__ import annotations

from typing import Any

#: Exit codes of ``gpupool-cli`` (docs/cli/index.md lists them too).
EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_REFUSED = 5
EXIT_SERVER = 6
EXIT_NETWORK = 7


class GpupoolError(Exception):
    """Base class of everything this package raises on purpose."""

    exit_code = EXIT_UNEXPECTED


class ConfigError(GpupoolError):
    """The client is not set up: no server URL or no token (``gpupool-cli login`` fixes it)."""

    exit_code = EXIT_USAGE


class NetworkError(GpupoolError):
    """The server could not be reached or did not answer in time (after the retries)."""

    exit_code = EXIT_NETWORK


class ApiError(GpupoolError):
    """The server answered with an error: HTTP ``status`` and the body's ``code``, ``detail`` and ``errors``."""

    exit_code = EXIT_UNEXPECTED

    def __init__(
        self,
        *,
        status: int,
        code: str,
        detail: str,
        errors: dict[str, Any] | None = None,
        method: str = "",
        url: str = "",
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{detail} ({code}, HTTP {status})")
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = errors or {}
        self.method = method
        self.url = url
        # The rest of the body: e.g. ``limit`` of a ``job_never_fits`` refusal (the largest shape there is).
        self.extra = extra or {}

    def as_dict(self) -> dict[str, Any]:
        """The error as the server sent it, plus its HTTP status."""
        body: dict[str, Any] = {**self.extra, "code": self.code, "detail": self.detail, "status": self.status}
        if self.errors:
            body["errors"] = self.errors
        return body


class AuthError(ApiError):
    """401 (no, an unknown, an expired or a revoked token) or 403 (signed in, but not allowed)."""

    exit_code = EXIT_AUTH


class NotFoundError(ApiError):
    """404: no such object, or not visible to you (the server answers both the same)."""

    exit_code = EXIT_NOT_FOUND


class RefusedError(ApiError):
    """400, 409, 413, 415 or 422: the request was understood and refused (a bad spec, a finished job)."""

    exit_code = EXIT_REFUSED


class ServerError(ApiError):
    """5xx, or 429 still after the retries: the server could not do it now; trying later may work."""

    exit_code = EXIT_SERVER


def error_for(*, status: int, body: Any, method: str = "", url: str = "") -> ApiError:
    """The :class:`ApiError` subclass for an error answer; a body without ``code``/``detail`` (a proxy's HTML
    page) still gives one, with the code ``http_<status>``."""
    if isinstance(body, dict):
        code = str(body.get("code") or f"http_{status}")
        detail = str(body.get("detail") or f"HTTP {status}")
        errors = body.get("errors") if isinstance(body.get("errors"), dict) else None
        extra = {key: value for key, value in body.items() if key not in ("code", "detail", "errors", "status")}
    else:
        code, detail, errors = f"http_{status}", (str(body or "").strip()[:300] or f"HTTP {status}"), None
        extra = {}
    if status in (401, 403):
        kind: type[ApiError] = AuthError
    elif status == 404:
        kind = NotFoundError
    elif status == 429 or status >= 500:
        kind = ServerError
    elif 400 <= status < 500:
        kind = RefusedError
    else:
        kind = ApiError
    return kind(status=status, code=code, detail=detail, errors=errors, method=method, url=url, extra=extra)
