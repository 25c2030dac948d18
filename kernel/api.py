"""Shared API plumbing: the stable error shape ``{"code": ..., "detail": ...}`` and domain errors.

A domain error raised with a catalogue message (``kernel.messages``) also answers ``message``: ``{"code", "params"}``,
the sentence's stable code and data, and its ``detail`` is in the request's language."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from django.utils.translation import gettext
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from kernel.messages import Text


class DomainError(Exception):
    """An error a user caused. Services raise it; the API answers 400 (or ``status_code``) with ``code``."""

    code = "invalid"
    status_code = 400

    def __init__(
        self, message: str, *, code: str | None = None, field: str | None = None, extra: dict | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.field = field
        # More of the answer's body, machine-readable (``job_never_fits`` adds the ``limit`` it is over).
        self.extra = extra or {}


class NotFoundError(DomainError):
    """Missing or not visible to the caller: both look the same on purpose."""

    code = "not_found"
    status_code = 404


class ConflictError(DomainError):
    code = "conflict"
    status_code = 409


class PermissionDeniedError(DomainError):
    code = "permission_denied"
    status_code = 403


def shown_text(message: str) -> str:
    """``message`` in the request's language (``Accept-Language``, the console's language cookie) where it is a
    catalogue message (``kernel.messages.Text``); as it is otherwise."""
    return message.render(gettext) if isinstance(message, Text) else message


def _code_of(exc: exceptions.APIException) -> str:
    codes = exc.get_codes()
    if isinstance(codes, str):
        return codes
    return "invalid"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Every API error has the same shape: ``code`` (stable, machine-readable) and ``detail`` (for people).

    Field errors from serializers go in ``errors``.
    """
    if isinstance(exc, DomainError):
        detail = shown_text(exc.message)
        body: dict[str, Any] = {"code": exc.code, "detail": detail}
        if isinstance(exc.message, Text):
            # For programs: the sentence's stable code and its data, whatever language ``detail`` is in.
            body["message"] = {"code": exc.message.code, "params": exc.message.params}
        if exc.field:
            body["errors"] = {exc.field: [detail]}
        # A subclass with its own ``__init__`` may not have set ``extra``.
        body.update({key: value for key, value in (getattr(exc, "extra", None) or {}).items() if key not in body})
        return Response(body, status=exc.status_code)
    if isinstance(exc, RequestDataTooBig):
        return Response(
            {
                "code": "request_too_large",
                "detail": f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes; send less.",
            },
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = response.data
        if isinstance(errors, list):
            errors = {"non_field_errors": errors}
        first = _first_message(errors)
        response.data = {"code": "invalid", "detail": first or "Invalid input.", "errors": errors}
    elif isinstance(exc, exceptions.APIException):
        detail = response.data.get("detail", str(exc)) if isinstance(response.data, dict) else str(exc)
        response.data = {"code": _code_of(exc), "detail": str(detail)}
    if response.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
        response.data["code"] = "method_not_allowed"
    return response


def _first_message(errors: Any, prefix: str = "") -> str:
    if isinstance(errors, dict):
        for key, value in errors.items():
            label = key if key != "non_field_errors" else ""
            message = _first_message(value, f"{prefix}{label}: " if label else prefix)
            if message:
                return message
    elif isinstance(errors, list):
        for value in errors:
            message = _first_message(value, prefix)
            if message:
                return message
    elif errors:
        return f"{prefix}{errors}"
    return ""
