"""Sign-in events → audit. The one place that connects Django's and django-axes' signals (from apps.ready)."""

from __future__ import annotations

from typing import Any

from axes.signals import user_locked_out
from django.contrib.auth.signals import user_logged_in, user_login_failed

from tenants.services.identity import auth_locked_out, auth_login_failed, auth_login_succeeded


def _on_logged_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    auth_login_succeeded(user=user, request=request)


def _on_login_failed(sender: Any, credentials: dict, request: Any = None, **kwargs: Any) -> None:
    auth_login_failed(username=str(credentials.get("username", "")), request=request)


def _on_locked_out(sender: Any, request: Any = None, username: str | None = None, **kwargs: Any) -> None:
    auth_locked_out(username=username or "", request=request)


def connect() -> None:
    user_logged_in.connect(_on_logged_in, dispatch_uid="tenants.audit.logged_in")
    user_login_failed.connect(_on_login_failed, dispatch_uid="tenants.audit.login_failed")
    user_locked_out.connect(_on_locked_out, dispatch_uid="tenants.audit.locked_out")
