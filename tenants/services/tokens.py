"""API tokens: mint, revoke and authenticate."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import secrets
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.access_rules import Action
from kernel.api import DomainError, PermissionDeniedError
from tenants import messages as tenants_messages
from tenants.access import allows
from tenants.models import TOKEN_PREFIX, ApiToken, TokenScope, User
from tenants.permissions import is_auditor, token_scopes_allowed
from tenants.services.guards import require_permission

TOKEN_DEFAULT_LIFETIME_DAYS = 90
TOKEN_SCOPE_RANK = {TokenScope.READ: 0, TokenScope.WRITE: 1, TokenScope.ADMIN: 2}
TOKEN_MAX_LIFETIME_DAYS = 366


# --- API tokens -------------------------------------------------------------------------------------------


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _new_token_secret() -> tuple[str, str]:
    """``gp_<prefix>_<secret>``: the prefix (8 hex) finds the row, the 32 random bytes are the secret."""
    prefix = secrets.token_hex(4)
    return prefix, f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"


@transaction.atomic
def api_token_create(
    *,
    actor: User,
    name: str,
    scope: str = TokenScope.READ,
    expires_at: dt.datetime | None = None,
    via_token: ApiToken | None = None,
    request: Any = None,
) -> tuple[ApiToken, str]:
    """Create a token for ``actor`` itself and return it with its secret — the only time the secret exists
    outside the caller's hands. Tokens always expire (default 90 days, at most a year). A request made with a
    token (``via_token``) mints only a token of the same or a lower scope that expires no later than it: a
    stolen write token must not become an admin token that skips the second factor of a console sign-in."""
    if not actor.is_active:
        raise PermissionDeniedError(tenants_messages.ACCOUNT_DEACTIVATED())
    if scope not in TokenScope.values:
        raise DomainError(tenants_messages.UNKNOWN_SCOPE_USE_READ_WRITE(value=scope), field="scope")
    if via_token is not None:
        if TOKEN_SCOPE_RANK[scope] > TOKEN_SCOPE_RANK[via_token.scope]:
            raise PermissionDeniedError(
                f"A {via_token.scope!s}-scoped token cannot create a {scope}-scoped token; sign in to the console "
                "(with your second factor) or use a token of that scope."
            )
        if expires_at is None:
            expires_at = min(via_token.expires_at, timezone.now() + dt.timedelta(days=TOKEN_DEFAULT_LIFETIME_DAYS))
        elif expires_at > via_token.expires_at:
            raise DomainError(
                f"A token created with a token expires no later than it ({via_token.expires_at.isoformat()}).",
                field="expires_at",
            )
    if scope not in token_scopes_allowed(actor):
        if is_auditor(actor):
            raise DomainError(tenants_messages.AUDITORS_MAY_ONLY_CREATE_READ(), field="scope")
        raise DomainError(tenants_messages.ONLY_SYSTEM_SECURITY_ADMINS_MAY(), field="scope")
    now = timezone.now()
    if expires_at is None:
        expires_at = now + dt.timedelta(days=TOKEN_DEFAULT_LIFETIME_DAYS)
    if expires_at <= now:
        raise DomainError(tenants_messages.EXPIRES_MUST_FUTURE(), field="expires_at")
    if expires_at > now + dt.timedelta(days=TOKEN_MAX_LIFETIME_DAYS):
        raise DomainError(tenants_messages.TOKENS_LIVE_MOST_DAYS_PICK(days=TOKEN_MAX_LIFETIME_DAYS), field="expires_at")
    if ApiToken.objects.filter(user=actor, name=name).exists():
        raise DomainError(tenants_messages.YOU_ALREADY_TOKEN_NAMED(name=name), code="duplicate", field="name")
    prefix, raw = _new_token_secret()
    token = ApiToken.objects.create(
        user=actor, name=name, key_prefix=prefix, key_sha256=token_hash(raw), scope=scope, expires_at=expires_at
    )
    audit_record(
        action="token.create",
        actor=actor,
        target=f"token:{token.pk}",
        details={"after": {"name": name, "prefix": prefix, "scope": scope, "expires_at": expires_at.isoformat()}},
        request=request,
    )
    return token, raw


@transaction.atomic
def api_token_revoke(*, actor: User | None, token: ApiToken, request: Any = None) -> ApiToken:
    """Revoke a token (its owner or a security admin). Revoking twice is harmless."""
    if actor is not None:
        require_permission(allows(actor, Action.TOKEN_REVOKE, token), tenants_messages.ONLY_OWNER_SECURITY_ADMIN_MAY())
    token = ApiToken.objects.select_for_update(no_key=True).get(pk=token.pk)
    if token.revoked_at is not None:
        return token
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(
        action="token.revoke",
        actor=actor,
        target=f"token:{token.pk}",
        details={"before": {"revoked": False}, "after": {"revoked": True, "owner": token.user.username}},
        request=request,
    )
    return token


class TokenRejected(Exception):
    """Raised by ``api_token_authenticate``; ``code`` says why (``token_invalid``/``_expired``/``_revoked``)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


# Record "last used" at most this often per token: one write per request would hurt a busy client.
TOKEN_TOUCH_INTERVAL = dt.timedelta(seconds=60)


_TOKEN_COLUMNS = tuple(field.attname for field in ApiToken._meta.concrete_fields)
_USER_COLUMNS = tuple(field.attname for field in User._meta.concrete_fields)


@functools.cache
def _token_with_user_sql() -> str:
    def columns(alias: str, model: type) -> list[str]:
        return [f"{alias}.{connection.ops.quote_name(field.column)}" for field in model._meta.concrete_fields]

    return (
        f"SELECT {', '.join(columns('t', ApiToken) + columns('u', User))} FROM {ApiToken._meta.db_table} t"
        f" JOIN {User._meta.db_table} u ON u.id = t.user_id WHERE t.key_prefix = %s"
    )


def _token_with_user(prefix: str) -> ApiToken | None:
    """The token of ``prefix`` with its user, or None. On PostgreSQL one fixed SELECT (every API request asks
    this; building and compiling the ORM's ``select_related`` query cost more CPU than running it); elsewhere,
    where the driver's values need Django's converters (SQLite's datetimes), the ORM."""
    if connection.vendor != "postgresql":
        return ApiToken.objects.select_related("user").filter(key_prefix=prefix).first()
    with connection.cursor() as cursor:
        cursor.execute(_token_with_user_sql(), [prefix])
        row = cursor.fetchone()  # key_prefix is unique: one row or none
    if row is None:
        return None
    token = ApiToken.from_db(connection.alias, _TOKEN_COLUMNS, row[: len(_TOKEN_COLUMNS)])
    token.user = User.from_db(connection.alias, _USER_COLUMNS, row[len(_TOKEN_COLUMNS) :])
    return token


def api_token_authenticate(*, raw: str) -> ApiToken:
    """Find the token for ``raw`` and check it is usable; updates ``last_used_at`` (throttled)."""
    if not raw.startswith(TOKEN_PREFIX) or raw.count("_") < 2:
        raise TokenRejected("Malformed API token; it should look like gp_xxxxxxxx_….", "token_invalid")
    prefix = raw[len(TOKEN_PREFIX) :].split("_", 1)[0]
    token = _token_with_user(prefix)
    if token is None or not hmac.compare_digest(token.key_sha256, token_hash(raw)):
        raise TokenRejected("Unknown API token.", "token_invalid")
    now = timezone.now()
    if token.revoked_at is not None:
        raise TokenRejected(
            f"This API token ({token.name!r}) was revoked at {token.revoked_at:%Y-%m-%d %H:%M} UTC; create a new one.",
            "token_revoked",
        )
    if token.expires_at <= now:
        raise TokenRejected(
            f"This API token ({token.name!r}) expired at {token.expires_at:%Y-%m-%d %H:%M} UTC; create a new one.",
            "token_expired",
        )
    if not token.user.is_active:
        raise TokenRejected("The account that owns this API token is deactivated.", "token_invalid")
    if token.last_used_at is None or now - token.last_used_at >= TOKEN_TOUCH_INTERVAL:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
