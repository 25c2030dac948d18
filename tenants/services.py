"""Writes for tenants, users, memberships, API tokens and sign-in events. Every state change goes through a
function here, so the console, the API and management commands share one set of rules and one audit trail.

Services take keyword-only arguments, run in one transaction, check that ``actor`` may do the change
(``actor=None`` is the system itself: demo data, bootstrap, migrations) and write an audit record with the
before/after values. Callers resolve objects through ``tenants.selectors`` first, so an object the actor
cannot see is already a 404 before a service is reached.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import F, ProtectedError
from django.utils import timezone

from audit.services import audit_record
from portal.api import ConflictError, DomainError, PermissionDeniedError
from tenants.approval_handlers import approval_handler
from tenants.models import (
    MAX_TENANT_DEPTH,
    OPEN_APPROVAL_STATUSES,
    TOKEN_PREFIX,
    ApiToken,
    Membership,
    MembershipRole,
    PlatformRole,
    Tenant,
    TenantKind,
    TokenScope,
    User,
)
from tenants.permissions import (
    can_admin_strict_ancestor,
    can_admin_tenant,
    can_manage_memberships,
    is_auditor,
    is_security_admin,
    is_system_admin,
    token_scopes_allowed,
)

logger = logging.getLogger(__name__)

# Marks "argument not given" where None is a meaningful value (e.g. parent=None moves a tenant to the top).
UNSET: Any = object()

TOKEN_DEFAULT_LIFETIME_DAYS = 90
TOKEN_SCOPE_RANK = {TokenScope.READ: 0, TokenScope.WRITE: 1, TokenScope.ADMIN: 2}
TOKEN_MAX_LIFETIME_DAYS = 366


def _ensure_may_write(actor: User | None) -> None:
    """Auditors change nothing (separation of duties); inactive accounts neither."""
    if actor is None:
        return
    if not actor.is_active:
        raise PermissionDeniedError("This account is deactivated.")
    if is_auditor(actor):
        raise PermissionDeniedError("Auditors have read-only access; ask a system or security admin.")


def _require(allowed: bool, message: str) -> None:
    if not allowed:
        raise PermissionDeniedError(message)


def _lock_tenant_tree() -> None:
    """Serialise structural changes to the tenant tree (moves, creates) so two concurrent moves cannot
    together build a cycle. SQLite runs write transactions one at a time already."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [0x6770_7465_6E74])  # "gptent"


def _user_snapshot(user: User) -> dict:
    return {
        "username": user.username,
        "email": user.email,
        "platform_role": user.platform_role,
        "is_active": user.is_active,
        "first_name": user.first_name,
        "last_name": user.last_name,
    }


def _tenant_snapshot(tenant: Tenant) -> dict:
    return {
        "name": tenant.name,
        "slug": tenant.slug,
        "kind": tenant.kind,
        "parent": tenant.parent.slug if tenant.parent_id else None,
        "depth": tenant.depth,
        "description": tenant.description,
    }


# --- users and platform roles -----------------------------------------------------------------------------


def _validate_new_password(password: str, user: User) -> None:
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise DomainError(" ".join(exc.messages), code="weak_password", field="password") from None


@transaction.atomic
def user_create(
    *,
    actor: User | None,
    username: str,
    password: str | None,
    email: str = "",
    platform_role: str = PlatformRole.NONE,
    first_name: str = "",
    last_name: str = "",
    request: Any = None,
) -> User:
    """Create an account. Only a security admin (or the system) may; ``password=None`` makes an account
    that can sign in only through single sign-on."""
    _ensure_may_write(actor)
    if actor is not None:
        _require(is_security_admin(actor), "Only a security admin may create accounts.")
    if platform_role not in PlatformRole.values:
        raise DomainError(f"Unknown platform role {platform_role!r}.", code="invalid", field="platform_role")
    if User.objects.filter(username__iexact=username).exists():
        raise DomainError(
            f"A user named {username!r} already exists; choose another username.", code="duplicate", field="username"
        )
    user = User(username=username, email=email, platform_role=platform_role, first_name=first_name, last_name=last_name)
    if password is None:
        user.set_unusable_password()
    else:
        _validate_new_password(password, user)
        user.set_password(password)
    user.save()
    audit_record(
        action="user.create",
        actor=actor,
        target=f"user:{user.pk}",
        details={"after": _user_snapshot(user)},
        request=request,
    )
    return user


@transaction.atomic
def user_update(
    *,
    actor: User | None,
    user: User,
    email: str = UNSET,
    first_name: str = UNSET,
    last_name: str = UNSET,
    is_active: bool = UNSET,
    request: Any = None,
) -> User:
    """Change an account's profile or deactivate it (security admin). Deactivation revokes nothing else:
    an inactive account simply cannot sign in or use its tokens."""
    _ensure_may_write(actor)
    if actor is not None:
        _require(is_security_admin(actor), "Only a security admin may change accounts.")
        if is_active is False and actor.pk == user.pk:
            raise DomainError("You cannot deactivate your own account; ask another security admin.")
    user = User.objects.select_for_update(no_key=True).get(pk=user.pk)
    before = _user_snapshot(user)
    for field, value in (("email", email), ("first_name", first_name), ("last_name", last_name)):
        if value is not UNSET:
            setattr(user, field, value)
    if is_active is not UNSET:
        user.is_active = is_active
    user.save()
    audit_record(
        action="user.update",
        actor=actor,
        target=f"user:{user.pk}",
        details={"before": before, "after": _user_snapshot(user)},
        request=request,
    )
    return user


@transaction.atomic
def user_set_platform_role(*, actor: User | None, user: User, platform_role: str, request: Any = None) -> User:
    """Grant or clear a platform role. Separation of duties: an account holds at most one platform role, so
    switching from one role to another is refused — clear the current role first, on purpose and audited."""
    _ensure_may_write(actor)
    if actor is not None:
        _require(is_security_admin(actor), "Only a security admin may grant or remove platform roles.")
        if actor.pk == user.pk:
            raise DomainError("You cannot change your own platform role; ask another security admin.")
    if platform_role not in PlatformRole.values:
        raise DomainError(
            f"Unknown platform role {platform_role!r}; use one of: " + ", ".join(repr(v) for v in PlatformRole.values),
            field="platform_role",
        )
    user = User.objects.select_for_update(no_key=True).get(pk=user.pk)
    before = user.platform_role
    if before == platform_role:
        return user
    if platform_role and Membership.objects.filter(user=user).exists():
        # Separation of duties: a platform account (system, security admin, auditor) holds no tenant role, so
        # an auditor never runs jobs and an admin never approves their own tenant's requests.
        raise DomainError(
            f"{user.username} is a member of tenants; a platform account holds no tenant membership. Remove the "
            "memberships first (or use a separate account for the platform role).",
            code="separation_of_duties",
            field="platform_role",
        )
    if before and platform_role:
        raise DomainError(
            f"{user.username} already holds the platform role {before!r}; one account cannot hold two platform "
            f"roles. Remove {before!r} first, then grant {platform_role!r}.",
            code="separation_of_duties",
            field="platform_role",
        )
    user.platform_role = platform_role
    user.save(update_fields=["platform_role"])
    audit_record(
        action="user.role.change",
        actor=actor,
        target=f"user:{user.pk}",
        details={"before": {"platform_role": before}, "after": {"platform_role": platform_role}},
        request=request,
    )
    return user


@transaction.atomic
def user_set_password(*, actor: User | None, user: User, password: str, request: Any = None) -> User:
    _ensure_may_write(actor)
    if actor is not None:
        _require(is_security_admin(actor) or actor.pk == user.pk, "Only a security admin may set another's password.")
    _validate_new_password(password, user)
    user.set_password(password)
    user.save(update_fields=["password"])
    audit_record(action="user.password.set", actor=actor, target=f"user:{user.pk}", request=request)
    return user


# --- tenants ----------------------------------------------------------------------------------------------


def _check_sibling_name(*, name: str, parent: Tenant | None, exclude_pk: int | None = None) -> None:
    # The database constraint does not cover roots (NULL parents are distinct), so check here for all.
    siblings = Tenant.objects.filter(parent=parent, name__iexact=name)
    if exclude_pk is not None:
        siblings = siblings.exclude(pk=exclude_pk)
    if siblings.exists():
        where = f"under {parent.slug!r}" if parent else "at the top level"
        raise DomainError(
            f"A tenant named {name!r} already exists {where}; choose another name.", code="duplicate", field="name"
        )


@transaction.atomic
def tenant_create(
    *,
    actor: User | None,
    name: str,
    slug: str,
    kind: str = TenantKind.TEAM,
    parent: Tenant | None = None,
    description: str = "",
    request: Any = None,
) -> Tenant:
    """Create a tenant. Top-level tenants: system admins; children: system admins and tenant admins of the
    parent (or above)."""
    _ensure_may_write(actor)
    if actor is not None:
        if parent is None:
            _require(is_system_admin(actor), "Only a system admin may create a top-level tenant.")
        else:
            _require(can_admin_tenant(actor, parent), f"Only a tenant admin of {parent.slug!r} may add tenants to it.")
    if kind not in TenantKind.values:
        raise DomainError(f"Unknown tenant kind {kind!r}.", field="kind")
    _lock_tenant_tree()
    depth = 1 if parent is None else parent.depth + 1
    if depth > MAX_TENANT_DEPTH:
        raise DomainError(
            f"Tenant {slug!r} would be at depth {depth}; the tree allows at most {MAX_TENANT_DEPTH} levels.",
            code="tenant_too_deep",
            field="parent",
        )
    if Tenant.objects.filter(slug=slug).exists():
        raise DomainError(f"A tenant with slug {slug!r} already exists.", code="duplicate", field="slug")
    _check_sibling_name(name=name, parent=parent)
    tenant = Tenant.objects.create(name=name, slug=slug, kind=kind, parent=parent, depth=depth, description=description)
    audit_record(
        action="tenant.create",
        actor=actor,
        tenant=tenant,
        target=f"tenant:{tenant.pk}",
        details={"after": _tenant_snapshot(tenant)},
        request=request,
    )
    return tenant


@transaction.atomic
def tenant_update(
    *,
    actor: User | None,
    tenant: Tenant,
    name: str = UNSET,
    kind: str = UNSET,
    description: str = UNSET,
    parent: Tenant | None = UNSET,
    request: Any = None,
) -> Tenant:
    """Rename, re-describe or move a tenant. A move keeps the tree a tree (no cycles) and within
    MAX_TENANT_DEPTH levels for the whole moved subtree; it needs admin rights above the tenant and on the
    new parent."""
    from tenants.selectors import tenant_subtree_height, tenant_subtree_ids

    _ensure_may_write(actor)
    if actor is not None:
        _require(can_admin_tenant(actor, tenant), f"Only a tenant admin of {tenant.slug!r} may change it.")
    _lock_tenant_tree()
    tenant = Tenant.objects.select_for_update(of=("self",), no_key=True).select_related("parent").get(pk=tenant.pk)
    before = _tenant_snapshot(tenant)
    moving = parent is not UNSET and (parent.pk if parent else None) != tenant.parent_id
    if moving:
        if actor is not None:
            _require(
                can_admin_strict_ancestor(actor, tenant),
                f"Moving {tenant.slug!r} needs tenant admin rights on its parent tenant.",
            )
            if parent is None:
                _require(is_system_admin(actor), "Only a system admin may move a tenant to the top level.")
            else:
                _require(can_admin_tenant(actor, parent), f"You are not a tenant admin of {parent.slug!r}.")
        if parent is not None and parent.pk in tenant_subtree_ids(tenant):
            raise DomainError(
                f"Cannot move {tenant.slug!r} under {parent.slug!r}: {parent.slug!r} is inside the subtree of "
                f"{tenant.slug!r}, which would make a cycle.",
                code="tenant_cycle",
                field="parent",
            )
        new_depth = 1 if parent is None else parent.depth + 1
        height = tenant_subtree_height(tenant)
        if new_depth + height - 1 > MAX_TENANT_DEPTH:
            raise DomainError(
                f"Cannot move {tenant.slug!r} under {parent.slug if parent else 'the top level'!r}: its subtree "
                f"has {height} level(s) and would reach depth {new_depth + height - 1}; the tree allows at most "
                f"{MAX_TENANT_DEPTH}.",
                code="tenant_too_deep",
                field="parent",
            )
    new_name = tenant.name if name is UNSET else name
    new_parent = parent if moving else tenant.parent
    if moving or new_name.lower() != tenant.name.lower():
        _check_sibling_name(name=new_name, parent=new_parent, exclude_pk=tenant.pk)
    if kind is not UNSET:
        if kind not in TenantKind.values:
            raise DomainError(f"Unknown tenant kind {kind!r}.", field="kind")
        tenant.kind = kind
    if description is not UNSET:
        tenant.description = description
    tenant.name = new_name
    if moving:
        delta = (1 if parent is None else parent.depth + 1) - tenant.depth
        subtree = tenant_subtree_ids(tenant)
        tenant.parent = parent
        tenant.depth += delta
        if delta:
            Tenant.objects.filter(pk__in=[pk for pk in subtree if pk != tenant.pk]).update(depth=F("depth") + delta)
    tenant.save()
    audit_record(
        action="tenant.move" if moving else "tenant.update",
        actor=actor,
        tenant=tenant,
        target=f"tenant:{tenant.pk}",
        details={"before": before, "after": _tenant_snapshot(tenant)},
        request=request,
    )
    return tenant


@transaction.atomic
def tenant_delete(*, actor: User | None, tenant: Tenant, request: Any = None) -> None:
    """Delete an empty tenant (no child tenants, no jobs or quotas that refer to it)."""
    _ensure_may_write(actor)
    if actor is not None:
        _require(
            can_admin_strict_ancestor(actor, tenant),
            f"Deleting {tenant.slug!r} needs tenant admin rights on its parent (or a system admin).",
        )
    if tenant.children.exists():
        raise ConflictError(
            f"Tenant {tenant.slug!r} has child tenants; move or delete them first.", code="tenant_not_empty"
        )
    if tenant.memberships.exists():
        raise ConflictError(
            f"Tenant {tenant.slug!r} still has members; remove their memberships first.", code="tenant_not_empty"
        )
    before = _tenant_snapshot(tenant)
    pk = tenant.pk
    audit_record(
        action="tenant.delete",
        actor=actor,
        tenant=tenant,
        target=f"tenant:{pk}",
        details={"before": before},
        request=request,
    )
    try:
        with transaction.atomic():
            tenant.delete()
    except ProtectedError:
        raise ConflictError(
            f"Tenant {tenant.slug!r} still has jobs, quotas or other records; remove those first.",
            code="tenant_not_empty",
        ) from None


# --- memberships ------------------------------------------------------------------------------------------


def cannot_add_member() -> DomainError:
    """The one answer for "no such user" and "this user cannot be a tenant member" (no enumeration): it names
    no account, so the answer is the same whichever was asked for."""
    return DomainError(
        "That user cannot be added: the account does not exist, is deactivated, or is a platform account "
        "(platform accounts hold no tenant membership).",
        code="cannot_add_member",
        field="user",
    )


def _check_membership_role(role: str) -> None:
    if role not in MembershipRole.values:
        raise DomainError(
            f"Unknown role {role!r}; use one of: " + ", ".join(repr(v) for v in MembershipRole.values), field="role"
        )


@transaction.atomic
def membership_create(
    *, actor: User | None, user: User, tenant: Tenant, role: str = MembershipRole.MEMBER, request: Any = None
) -> Membership:
    """Add ``user`` to ``tenant``. Security admins may do it anywhere, tenant admins within their subtree.
    Auditors hold no tenant roles: an auditor who could run jobs would audit themselves."""
    _ensure_may_write(actor)
    if actor is not None:
        _require(
            can_manage_memberships(actor, tenant), f"Only a tenant admin of {tenant.slug!r} may add members to it."
        )
    _check_membership_role(role)
    if user.platform_role or not user.is_active:
        # Platform accounts hold no tenant roles (separation of duties). Said exactly as for a username that
        # does not exist, so that a tenant admin cannot learn which accounts exist or hold platform roles.
        raise cannot_add_member()
    if Membership.objects.filter(user=user, tenant=tenant).exists():
        raise DomainError(f"{user.username} is already a member of {tenant.slug}.", code="duplicate")
    membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    audit_record(
        action="membership.create",
        actor=actor,
        tenant=tenant,
        target=f"user:{user.pk}",
        details={"after": {"user": user.username, "tenant": tenant.slug, "role": role}},
        request=request,
    )
    return membership


@transaction.atomic
def membership_update(*, actor: User | None, membership: Membership, role: str, request: Any = None) -> Membership:
    _ensure_may_write(actor)
    if actor is not None:
        _require(
            can_manage_memberships(actor, membership.tenant),
            f"Only a tenant admin of {membership.tenant.slug!r} may change its members' roles.",
        )
    _check_membership_role(role)
    membership = (
        Membership.objects.select_for_update(of=("self",), no_key=True)
        .select_related("user", "tenant")
        .get(pk=membership.pk)
    )
    before = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(
        action="membership.role.change",
        actor=actor,
        tenant=membership.tenant,
        target=f"user:{membership.user_id}",
        details={"before": {"role": before}, "after": {"role": role}},
        request=request,
    )
    return membership


@transaction.atomic
def membership_delete(*, actor: User | None, membership: Membership, request: Any = None) -> None:
    _ensure_may_write(actor)
    if actor is not None:
        _require(
            can_manage_memberships(actor, membership.tenant),
            f"Only a tenant admin of {membership.tenant.slug!r} may remove its members.",
        )
    audit_record(
        action="membership.delete",
        actor=actor,
        tenant=membership.tenant,
        target=f"user:{membership.user_id}",
        details={
            "before": {"user": membership.user.username, "tenant": membership.tenant.slug, "role": membership.role}
        },
        request=request,
    )
    membership.delete()


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
        raise PermissionDeniedError("This account is deactivated.")
    if scope not in TokenScope.values:
        raise DomainError(f"Unknown scope {scope!r}; use read, write or admin.", field="scope")
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
            raise DomainError("Auditors may only create read-scoped tokens.", field="scope")
        raise DomainError("Only system and security admins may create admin-scoped tokens.", field="scope")
    now = timezone.now()
    if expires_at is None:
        expires_at = now + dt.timedelta(days=TOKEN_DEFAULT_LIFETIME_DAYS)
    if expires_at <= now:
        raise DomainError("expires_at must be in the future.", field="expires_at")
    if expires_at > now + dt.timedelta(days=TOKEN_MAX_LIFETIME_DAYS):
        raise DomainError(
            f"Tokens live at most {TOKEN_MAX_LIFETIME_DAYS} days; pick an earlier expires_at.", field="expires_at"
        )
    if ApiToken.objects.filter(user=actor, name=name).exists():
        raise DomainError(f"You already have a token named {name!r}.", code="duplicate", field="name")
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
        _require(
            actor.pk == token.user_id or is_security_admin(actor), "Only the owner or a security admin may revoke it."
        )
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


def api_token_authenticate(*, raw: str) -> ApiToken:
    """Find the token for ``raw`` and check it is usable; updates ``last_used_at`` (throttled)."""
    if not raw.startswith(TOKEN_PREFIX) or raw.count("_") < 2:
        raise TokenRejected("Malformed API token; it should look like gp_xxxxxxxx_….", "token_invalid")
    prefix = raw[len(TOKEN_PREFIX) :].split("_", 1)[0]
    token = ApiToken.objects.select_related("user").filter(key_prefix=prefix).first()
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


# --- sign-in events ---------------------------------------------------------------------------------------


def auth_login_succeeded(*, user: User, request: Any = None) -> None:
    with transaction.atomic():
        audit_record(action="auth.login", actor=user, target=f"user:{user.pk}", request=request)


def auth_login_failed(*, username: str, request: Any = None) -> None:
    with transaction.atomic():
        audit_record(
            action="auth.login.failure",
            actor=None,
            target=f"username:{username[:150]}",
            outcome="failure",
            details={"username": username[:150]},
            request=request,
        )


def auth_locked_out(*, username: str, request: Any = None) -> None:
    with transaction.atomic():
        audit_record(
            action="auth.lockout",
            actor=None,
            target=f"username:{(username or '')[:150]}",
            outcome="failure",
            details={"username": username, "failure_limit": getattr(settings, "AXES_FAILURE_LIMIT", None)},
            request=request,
        )


# --- two-factor (TOTP) ------------------------------------------------------------------------------------


@transaction.atomic
def mfa_totp_begin(*, actor: User | None, user: User, confirmed: bool = False, request: Any = None) -> Any:
    """Start TOTP enrolment for ``user``: a device whose secret the user adds to an authenticator app.

    In the console the user enrols themselves and the device stays unconfirmed until a first code proves the
    app has it (``mfa_totp_confirm``). An operator enrolling someone from the command line (``actor=None``)
    passes ``confirmed=True`` and hands the secret over. Replaces earlier unconfirmed devices.
    """
    from django_otp.plugins.otp_totp.models import TOTPDevice

    if actor is not None:
        _require(actor.pk == user.pk, "You can only enrol a two-factor device for your own account.")
    TOTPDevice.objects.filter(user=user, confirmed=False).delete()
    if confirmed:
        TOTPDevice.objects.filter(user=user).delete()
    device = TOTPDevice.objects.create(user=user, name="gpupool", confirmed=confirmed)
    audit_record(
        action="auth.mfa.enrol.begin",
        actor=actor,
        target=f"user:{user.pk}",
        details={"confirmed": confirmed},
        request=request,
    )
    return device


@transaction.atomic
def mfa_totp_confirm(*, actor: User, device: Any, otp: str, request: Any = None) -> Any:
    """Confirm enrolment with a first code from the authenticator app."""
    if device.user_id != actor.pk:
        raise PermissionDeniedError("This device belongs to another account.")
    if not device.verify_token(otp.strip()):
        audit_record(
            action="auth.mfa.enrol.confirm", actor=actor, target=f"user:{actor.pk}", outcome="failure", request=request
        )
        raise DomainError("That code is not valid; check the clock of your device and try again.", code="otp_invalid")
    type(device).objects.filter(user=actor, confirmed=True).exclude(pk=device.pk).delete()
    device.confirmed = True
    device.save(update_fields=["confirmed"])
    audit_record(action="auth.mfa.enrol.confirm", actor=actor, target=f"user:{actor.pk}", request=request)
    return device


def mfa_verified(*, user: User, success: bool, request: Any = None) -> None:
    """Record a second-factor check at sign-in (success or failure)."""
    with transaction.atomic():
        audit_record(
            action="auth.mfa.verify",
            actor=user,
            target=f"user:{user.pk}",
            outcome="success" if success else "failure",
            request=request,
        )


@transaction.atomic
def mfa_reset(*, actor: User | None, user: User, request: Any = None) -> int:
    """Remove every OTP device of ``user`` (a lost phone). Security admins only; returns how many."""
    from django_otp import devices_for_user

    _ensure_may_write(actor)
    if actor is not None:
        _require(is_security_admin(actor), "Only a security admin may reset another account's two-factor devices.")
    removed = 0
    for device in list(devices_for_user(user, confirmed=None)):
        device.delete()
        removed += 1
    audit_record(
        action="auth.mfa.reset", actor=actor, target=f"user:{user.pk}", details={"removed": removed}, request=request
    )
    return removed


# --- quotas -----------------------------------------------------------------------------------------------


def _flavor_name(flavor: Any) -> str:
    return getattr(flavor, "name", str(flavor))


def _clean_quota_values(values: dict, *, tenant: Tenant, flavor: Any) -> dict:
    """Check one quota's own numbers: no negatives, steps of 100 millis, limit ≥ guaranteed."""
    from tenants.models import QUOTA_FIELDS, QUOTA_STEP_MILLIS

    unknown = set(values) - set(QUOTA_FIELDS)
    if unknown:
        raise DomainError(f"Unknown quota field(s): {', '.join(sorted(unknown))}.")
    cleaned = {}
    for field in QUOTA_FIELDS:
        value = values.get(field)
        if field == "guaranteed_millis" or field == "guaranteed_memory_mib":
            value = 0 if value is None else value
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise DomainError(f"{field} must be a whole number ≥ 0 (got {value!r}).", field=field)
            if field.endswith("_millis") and value % QUOTA_STEP_MILLIS:
                raise DomainError(
                    f"{field} must be a multiple of {QUOTA_STEP_MILLIS} (1000 millis = one card); got {value}.",
                    field=field,
                )
        cleaned[field] = value
    where = f"{tenant.slug}/{_flavor_name(flavor)}"
    if cleaned["limit_millis"] is not None and cleaned["limit_millis"] < cleaned["guaranteed_millis"]:
        raise DomainError(
            f"Quota {where}: limit_millis {cleaned['limit_millis']} is below guaranteed_millis "
            f"{cleaned['guaranteed_millis']}; the limit must be at least the guarantee.",
            code="quota_invalid",
            field="limit_millis",
        )
    return cleaned


def _lock_quota_path(*, tenant: Tenant, flavor: Any) -> list[Tenant]:
    """Lock the tenant's ancestors (and itself), root first, and their quota rows for ``flavor``.

    Two changes anywhere under the same parent lock the same rows in the same order, so they run one after
    the other and the second re-checks against what the first committed; nothing is half-applied.
    """
    from tenants.models import Quota
    from tenants.permissions import ancestors_and_self

    chain_ids = [node.pk for node in ancestors_and_self(tenant)]
    locked = list(Tenant.objects.select_for_update(no_key=True).filter(pk__in=chain_ids).order_by("depth"))
    list(
        Quota.objects.select_for_update(of=("self",), no_key=True)
        .filter(tenant_id__in=chain_ids, flavor=flavor)
        .order_by("tenant__depth")
    )
    return locked


def _check_quota_tree(*, tenant: Tenant, flavor: Any, new: dict) -> None:
    """Σ children's guaranteed ≤ parent's guaranteed, where "parent" and "children" are the nearest tenants
    that hold a quota row for the flavor (a tenant without one is accounted to its nearest ancestor)."""
    from tenants.models import Quota
    from tenants.permissions import ancestors_and_self
    from tenants.selectors import subtree_q

    root = ancestors_and_self(tenant)[-1]
    rows = {
        row.tenant_id: row
        for row in Quota.objects.filter(subtree_q([root.pk], prefix="tenant__"), flavor=flavor).select_related("tenant")
    }
    guaranteed = {tenant_id: row.guaranteed_millis for tenant_id, row in rows.items()}
    guaranteed[tenant.pk] = new["guaranteed_millis"]
    parents = dict(Tenant.objects.filter(subtree_q([root.pk])).values_list("pk", "parent_id"))
    slugs = dict(Tenant.objects.filter(subtree_q([root.pk])).values_list("pk", "slug"))

    def quota_parent(tenant_id: int) -> int | None:
        parent = parents.get(tenant_id)
        while parent is not None and parent not in guaranteed:
            parent = parents.get(parent)
        return parent

    children: dict[int, list[int]] = {}
    for tenant_id in guaranteed:
        parent = quota_parent(tenant_id)
        if parent is not None:
            children.setdefault(parent, []).append(tenant_id)
    flavor_name = _flavor_name(flavor)
    for parent, kids in children.items():
        total = sum(guaranteed[kid] for kid in kids)
        if total > guaranteed[parent]:
            parts = ", ".join(f"{slugs[kid]} {guaranteed[kid]}" for kid in sorted(kids, key=lambda k: slugs[k]))
            raise DomainError(
                f"Quota for {flavor_name}: the guarantees under {slugs[parent]} add up to {total} millis "
                f"({parts}) but {slugs[parent]} is guaranteed only {guaranteed[parent]}; raise "
                f"{slugs[parent]}'s guarantee or lower the others.",
                code="quota_exceeds_parent",
                field="guaranteed_millis",
            )


def _quota_apply(*, actor: User | None, tenant: Tenant, flavor: Any, values: dict, request: Any = None) -> Any:
    """Validate and write one quota under row locks (no permission check: callers do that)."""
    from tenants.models import Quota

    cleaned = _clean_quota_values(values, tenant=tenant, flavor=flavor)
    _lock_quota_path(tenant=tenant, flavor=flavor)
    _check_quota_tree(tenant=tenant, flavor=flavor, new=cleaned)
    quota = Quota.objects.filter(tenant=tenant, flavor=flavor).first()
    before = quota.values() if quota else None
    if quota is None:
        quota = Quota.objects.create(tenant=tenant, flavor=flavor, **cleaned)
    else:
        for field, value in cleaned.items():
            setattr(quota, field, value)
        quota.save()
    audit_record(
        action="quota.update" if before else "quota.create",
        actor=actor,
        tenant=tenant,
        target=f"quota:{tenant.slug}/{_flavor_name(flavor)}",
        details={"before": before, "after": cleaned},
        request=request,
    )
    return quota


@transaction.atomic
def quota_set(*, actor: User | None, tenant: Tenant, flavor: Any, values: dict, request: Any = None) -> Any:
    """Set a tenant's quota for a flavor directly (system admins; tenant admins go through
    ``quota_change_request_create``). Refused, with the numbers, if it breaks the tree's rules."""
    _ensure_may_write(actor)
    if actor is not None:
        _require(is_system_admin(actor), "Only a system admin sets quotas directly; tenant admins request a change.")
    return _quota_apply(actor=actor, tenant=tenant, flavor=flavor, values=values, request=request)


# --- approvals (quota changes and job admissions share one inbox) ----------------------------------------

DEFAULT_APPROVAL_CHAINS = {
    "quota_change": ["parent_tenant_admin", "system_admin"],
    "job_admission": ["tenant_admin", "system_admin"],
}


def _configured_chain(kind: str, tenant: Tenant) -> list[str]:
    from tenants.models import ApprovalStepRole

    chains = getattr(settings, "GPUPOOL_APPROVAL_CHAINS", None) or DEFAULT_APPROVAL_CHAINS
    chain = list(chains.get(kind, DEFAULT_APPROVAL_CHAINS[kind]))
    unknown = [role for role in chain if role not in ApprovalStepRole.values]
    if unknown:
        raise DomainError(f"GPUPOOL_APPROVAL_CHAINS[{kind!r}] has unknown role(s) {unknown}.", code="misconfigured")
    if tenant.parent_id is None:
        # A top-level tenant has no parent tenant admin to ask.
        chain = [role for role in chain if role != ApprovalStepRole.PARENT_TENANT_ADMIN]
    return chain or [ApprovalStepRole.SYSTEM_ADMIN]


def _approval_chain(kind: str, tenant: Tenant, requester: User | None) -> tuple[list[str], list[dict]]:
    """The configured chain with the steps nobody but the requester could decide passed over
    (``tenants.approval_chain``), so every request reaches someone who can finish it."""
    from tenants.approval_chain import resolve_chain

    return resolve_chain(_configured_chain(kind, tenant), tenant, getattr(requester, "pk", None))


def _require_decision_comment(actor: User, approval: Any, comment: str) -> bool:
    """A system admin may decide a step that waits for someone else's role, saying why; returns whether this
    decision is such an override (it is audited as one)."""
    from tenants.permissions import is_approval_override

    override = is_approval_override(actor, approval)
    if override and not comment.strip():
        role = (approval.awaiting_role or "").replace("_", " ")
        raise DomainError(
            f"This step waits for a {role}; a system admin deciding it instead must say why (comment).",
            field="comment",
        )
    return override


def _approval_expiry() -> dt.datetime:
    return timezone.now() + dt.timedelta(hours=getattr(settings, "GPUPOOL_APPROVAL_TTL_HOURS", 72))


def _audit_prefix(approval: Any) -> str:
    from tenants.models import ApprovalKind

    return "quota_request" if approval.kind == ApprovalKind.QUOTA_CHANGE else "approval"


def _approval_audit(approval: Any, verb: str, *, actor: User | None, details: dict, request: Any = None) -> None:
    audit_record(
        action=f"{_audit_prefix(approval)}.{verb}",
        actor=actor,
        tenant=approval.tenant,
        target=f"approval:{approval.pk}",
        details={"kind": approval.kind, "status": approval.status, "step": approval.step, **details},
        request=request,
    )


def approvers_for(approval: Any) -> list[User]:
    """Who can take the decision ``approval`` waits for (for notifications)."""
    from tenants.approval_chain import eligible_approvers

    role = approval.awaiting_role
    if role is None:
        return []
    return eligible_approvers(role, approval.tenant, approval.requester_id)


def _notify(approval: Any, *, event: str, recipients: list[User], subject: str, body: str) -> None:
    """Queue one delivery per configured notifier; sent by a Celery task after commit (retried on failure)."""
    from tenants.models import NotificationDelivery

    paths = getattr(settings, "GPUPOOL_NOTIFIERS", None) or []
    for path in paths:
        delivery = NotificationDelivery.objects.create(
            approval=approval,
            event=event,
            notifier=path,
            recipients=[{"username": user.username, "email": user.email} for user in recipients],
            subject=subject[:200],
            body=body,
        )
        transaction.on_commit(lambda pk=delivery.pk: _enqueue_delivery(pk))


def _enqueue_delivery(delivery_id: int) -> None:
    from tenants.tasks import deliver_notification

    deliver_notification.delay(delivery_id)


def _describe(approval: Any) -> str:
    from tenants.models import ApprovalKind

    if approval.kind == ApprovalKind.QUOTA_CHANGE:
        values = ", ".join(f"{key}={value}" for key, value in approval.payload.items())
        return f"quota change for {approval.tenant.slug}/{approval.flavor.name}: {values}"
    return f"admission of job {approval.job_id} in {approval.tenant.slug} ({approval.payload.get('summary', '')})"


def _notify_approvers(approval: Any) -> None:
    role = approval.awaiting_role
    _notify(
        approval,
        event="approval.awaiting",
        recipients=approvers_for(approval),
        subject=f"[gpupool] Approval needed: {approval.get_kind_display()} #{approval.pk}",
        body=f"{_describe(approval)}\nRequested by {getattr(approval.requester, 'username', 'system')}; "
        f"waiting for a {role.replace('_', ' ')}.\nReason: {approval.reason or '-'}",
    )


def _notify_requester(approval: Any, *, comment: str) -> None:
    if approval.requester is None:
        return
    _notify(
        approval,
        event=f"approval.{approval.status}",
        recipients=[approval.requester],
        subject=f"[gpupool] {approval.get_kind_display()} #{approval.pk}: {approval.get_status_display()}",
        body=f"{_describe(approval)}\nStatus: {approval.get_status_display()}. {approval.result_message}\n"
        f"Comment: {comment or '-'}",
    )


@transaction.atomic
def quota_change_request_create(
    *, actor: User, tenant: Tenant, flavor: Any, values: dict, reason: str = "", request: Any = None
) -> Any:
    """A tenant admin asks for a new quota for ``tenant`` (its own or one below). The values are checked now
    (so an impossible request is refused at once) and again, under locks, when it is finally approved."""
    from tenants.models import ApprovalKind, ApprovalRequest, Quota

    _ensure_may_write(actor)
    _require(
        can_admin_tenant(actor, tenant), f"Only a tenant admin of {tenant.slug!r} may request a quota change for it."
    )
    current = Quota.objects.filter(tenant=tenant, flavor=flavor).first()
    merged = {**(current.values() if current else {}), **values}
    cleaned = _clean_quota_values(merged, tenant=tenant, flavor=flavor)
    _check_quota_tree(tenant=tenant, flavor=flavor, new=cleaned)
    chain, escalations = _approval_chain(ApprovalKind.QUOTA_CHANGE, tenant, actor)
    from tenants.approval_chain import eligible_approvers

    if is_system_admin(actor) and not all(eligible_approvers(role, tenant, actor.pk) for role in chain):
        # The platform's only system admin asking: nobody else exists to decide, and they need no one.
        # (A platform with no system admin at all keeps the request for the first one appointed.)
        raise DomainError(
            "Nobody but you could approve this request: as a system admin, set the quota directly "
            "(POST /api/v1/quotas/).",
            code="no_approver",
        )
    approval = ApprovalRequest.objects.create(
        kind=ApprovalKind.QUOTA_CHANGE,
        tenant=tenant,
        flavor=flavor,
        requester=actor,
        payload=cleaned,
        reason=reason,
        chain=chain,
        escalations=escalations,
        expires_at=_approval_expiry(),
    )
    _approval_audit(
        approval,
        "create",
        actor=actor,
        details={
            "before": current.values() if current else None,
            "after": cleaned,
            "chain": approval.chain,
            "escalations": escalations,
        },
        request=request,
    )
    _notify_approvers(approval)
    return approval


def _lock_approval(approval: Any) -> Any:
    from tenants.models import ApprovalRequest

    return (
        ApprovalRequest.objects.select_for_update(of=("self",), no_key=True)
        .select_related("tenant__parent", "flavor", "requester")
        .get(pk=approval.pk)
    )


def _require_open(approval: Any, *statuses: str) -> None:
    from tenants.models import ApprovalStatus

    allowed = statuses or (ApprovalStatus.PENDING,)
    if approval.status not in allowed:
        raise ConflictError(
            f"Request #{approval.pk} is {approval.status}; nothing more can be decided on it.", code="approval_closed"
        )


@transaction.atomic
def approval_approve(*, actor: User, approval: Any, comment: str = "", request: Any = None) -> Any:
    """Approve the awaited step. On the last step the change is applied: a quota change is re-validated
    under row locks and either applied whole or marked ``failed`` with the reason; an admitted job is
    released to the queue."""
    from tenants.models import ApprovalDecision, ApprovalKind, ApprovalStatus, ApprovalStep

    _ensure_may_write(actor)
    approval = _lock_approval(approval)
    _require_open(approval)
    from tenants.permissions import can_decide_approval

    _require(
        can_decide_approval(actor, approval),
        "You cannot approve this step: it waits for a "
        f"{(approval.awaiting_role or '').replace('_', ' ')}, and nobody approves their own request.",
    )
    override = _require_decision_comment(actor, approval, comment)
    if approval.step + 1 < len(approval.chain):
        # Who can decide the later steps may have changed since the request was made: pass over the ones
        # nobody but the requester could decide now, so the request cannot stall on them.
        from tenants.approval_chain import resolve_chain

        later, escalations = resolve_chain(approval.chain[approval.step + 1 :], approval.tenant, approval.requester_id)
        approval.chain = approval.chain[: approval.step + 1] + later
        approval.escalations = approval.escalations + escalations
    final = approval.step + 1 >= len(approval.chain)
    if final and approval.kind == ApprovalKind.QUOTA_CHANGE:
        # Locks first (before any audit write) so concurrent approvals queue here in one order.
        _lock_quota_path(tenant=approval.tenant, flavor=approval.flavor)
    ApprovalStep.objects.create(
        request=approval,
        step=approval.step,
        role=approval.awaiting_role,
        actor=actor,
        decision=ApprovalDecision.APPROVE,
        comment=comment,
    )
    if not final:
        approval.step += 1
        approval.save(update_fields=["step", "chain", "escalations", "updated_at"])
        _approval_audit(
            approval,
            "approve",
            actor=actor,
            details={"comment": comment, "final": False, "override": override, "chain": approval.chain},
            request=request,
        )
        _notify_approvers(approval)
        return approval
    approval.decided_at = timezone.now()
    if approval.kind == ApprovalKind.QUOTA_CHANGE:
        try:
            with transaction.atomic():
                _quota_apply(
                    actor=actor,
                    tenant=approval.tenant,
                    flavor=approval.flavor,
                    values=approval.payload,
                    request=request,
                )
        except DomainError as exc:
            approval.status = ApprovalStatus.FAILED
            approval.result_message = f"Approved, but it no longer fits: {exc.message}"[:500]
        else:
            approval.status = ApprovalStatus.APPROVED
            approval.result_message = "Applied."
    else:
        approval_handler(approval.kind).approved(approval, actor)
        approval.status = ApprovalStatus.APPROVED
        approval.result_message = "The job is queued."
    approval.step = len(approval.chain)
    approval.save()
    verb = "approve" if approval.status == ApprovalStatus.APPROVED else "fail"
    _approval_audit(
        approval,
        verb,
        actor=actor,
        details={"comment": comment, "final": True, "result": approval.result_message, "override": override},
        request=request,
    )
    _notify_requester(approval, comment=comment)
    return approval


@transaction.atomic
def approval_reject(*, actor: User, approval: Any, comment: str, request: Any = None) -> Any:
    """Refuse the request (any step's approver may). A job waiting for admission fails with the comment."""
    from tenants.models import ApprovalDecision, ApprovalKind, ApprovalStatus, ApprovalStep
    from tenants.permissions import can_decide_approval

    _ensure_may_write(actor)
    approval = _lock_approval(approval)
    _require_open(approval)
    _require(can_decide_approval(actor, approval), "You are not the approver this request is waiting for.")
    if not comment.strip():
        raise DomainError("Say why you reject the request (comment).", field="comment")
    override = _require_decision_comment(actor, approval, comment)
    ApprovalStep.objects.create(
        request=approval,
        step=approval.step,
        role=approval.awaiting_role,
        actor=actor,
        decision=ApprovalDecision.REJECT,
        comment=comment,
    )
    approval.status = ApprovalStatus.REJECTED
    approval.decided_at = timezone.now()
    approval.result_message = f"Rejected by {actor.username}."
    approval.save()
    if approval.kind == ApprovalKind.JOB_ADMISSION:
        approval_handler(approval.kind).closed(approval, actor, comment)
    _approval_audit(
        approval, "reject", actor=actor, details={"comment": comment, "override": override}, request=request
    )
    _notify_requester(approval, comment=comment)
    return approval


@transaction.atomic
def approval_request_changes(*, actor: User, approval: Any, comment: str, request: Any = None) -> Any:
    """Send a quota change back to its requester, who may resubmit changed values."""
    from tenants.models import ApprovalDecision, ApprovalKind, ApprovalStatus, ApprovalStep
    from tenants.permissions import can_decide_approval

    _ensure_may_write(actor)
    approval = _lock_approval(approval)
    _require_open(approval)
    _require(can_decide_approval(actor, approval), "You are not the approver this request is waiting for.")
    if approval.kind != ApprovalKind.QUOTA_CHANGE:
        raise DomainError("A job admission can be approved or rejected, not sent back for changes.")
    if not comment.strip():
        raise DomainError("Say which changes you need (comment).", field="comment")
    override = _require_decision_comment(actor, approval, comment)
    ApprovalStep.objects.create(
        request=approval,
        step=approval.step,
        role=approval.awaiting_role,
        actor=actor,
        decision=ApprovalDecision.REQUEST_CHANGES,
        comment=comment,
    )
    approval.status = ApprovalStatus.CHANGES_REQUESTED
    approval.save(update_fields=["status", "updated_at"])
    _approval_audit(
        approval, "request_changes", actor=actor, details={"comment": comment, "override": override}, request=request
    )
    _notify_requester(approval, comment=comment)
    return approval


@transaction.atomic
def approval_resubmit(
    *, actor: User, approval: Any, values: dict | None = None, comment: str = "", request: Any = None
) -> Any:
    """The requester answers "changes requested" with new values; the chain starts again from its first step."""
    from tenants.models import ApprovalDecision, ApprovalStatus, ApprovalStep

    _ensure_may_write(actor)
    approval = _lock_approval(approval)
    _require_open(approval, ApprovalStatus.CHANGES_REQUESTED)
    _require(actor.pk == approval.requester_id, "Only the requester may resubmit a request.")
    before = dict(approval.payload)
    if values:
        merged = {**approval.payload, **values}
        approval.payload = _clean_quota_values(merged, tenant=approval.tenant, flavor=approval.flavor)
        _check_quota_tree(tenant=approval.tenant, flavor=approval.flavor, new=approval.payload)
    ApprovalStep.objects.create(
        request=approval,
        step=approval.step,
        role="requester",
        actor=actor,
        decision=ApprovalDecision.RESUBMIT,
        comment=comment,
    )
    approval.status = ApprovalStatus.PENDING
    approval.step = 0
    approval.chain, approval.escalations = _approval_chain(approval.kind, approval.tenant, approval.requester)
    approval.expires_at = _approval_expiry()
    approval.save()
    _approval_audit(
        approval,
        "resubmit",
        actor=actor,
        details={"before": before, "after": approval.payload, "comment": comment},
        request=request,
    )
    _notify_approvers(approval)
    return approval


@transaction.atomic
def approval_cancel(*, actor: User, approval: Any, comment: str = "", request: Any = None) -> Any:
    """The requester (or a system admin) withdraws an open request; a waiting job fails."""
    from tenants.models import ApprovalDecision, ApprovalKind, ApprovalStatus, ApprovalStep

    _ensure_may_write(actor)
    approval = _lock_approval(approval)
    _require_open(approval, *OPEN_APPROVAL_STATUSES)
    _require(actor.pk == approval.requester_id or is_system_admin(actor), "Only the requester may cancel this request.")
    ApprovalStep.objects.create(
        request=approval,
        step=approval.step,
        role="requester",
        actor=actor,
        decision=ApprovalDecision.CANCEL,
        comment=comment,
    )
    approval.status = ApprovalStatus.CANCELLED
    approval.decided_at = timezone.now()
    approval.save()
    if approval.kind == ApprovalKind.JOB_ADMISSION:
        approval_handler(approval.kind).closed(approval, actor, comment or "approval request cancelled")
    _approval_audit(approval, "cancel", actor=actor, details={"comment": comment}, request=request)
    return approval


def approvals_expire(*, now: dt.datetime | None = None) -> int:
    """Expire open requests past ``expires_at`` (the periodic task calls this); returns how many."""
    from tenants.models import ApprovalDecision, ApprovalKind, ApprovalRequest, ApprovalStatus, ApprovalStep

    now = now or timezone.now()
    expired = 0
    due = ApprovalRequest.objects.filter(status__in=OPEN_APPROVAL_STATUSES, expires_at__lte=now).values_list(
        "pk", flat=True
    )
    for pk in list(due):
        with transaction.atomic():
            approval = _lock_approval(ApprovalRequest(pk=pk))
            if approval.status not in OPEN_APPROVAL_STATUSES or approval.expires_at > now:
                continue
            ApprovalStep.objects.create(
                request=approval, step=approval.step, role="system", decision=ApprovalDecision.EXPIRE
            )
            approval.status = ApprovalStatus.EXPIRED
            approval.decided_at = now
            approval.result_message = "Nobody decided in time."
            approval.save()
            if approval.kind == ApprovalKind.JOB_ADMISSION:
                approval_handler(approval.kind).closed(approval, None, "approval request expired")
            _approval_audit(approval, "expire", actor=None, details={})
            _notify_requester(approval, comment="")
            expired += 1
    return expired


# --- job admission (called by scheduler.services.job_submit) ---------------------------------------------

CRITICAL_PRIORITY = 1000


def job_admission_threshold_millis(tenant: Tenant) -> int | None:
    """The tenant's own threshold, else the nearest ancestor's, else ``GPUPOOL_JOB_APPROVAL_THRESHOLD_MILLIS``."""
    from tenants.permissions import ancestors_and_self

    for node in ancestors_and_self(tenant):
        if node.job_approval_threshold_millis is not None:
            return node.job_approval_threshold_millis
    return getattr(settings, "GPUPOOL_JOB_APPROVAL_THRESHOLD_MILLIS", None)


def job_admission_needs_approval(*, tenant: Tenant, total_millis: int, priority_class: int) -> bool:
    """Priority ``critical`` always waits for approval; so does a job above the tenant's size threshold."""
    if int(priority_class) >= CRITICAL_PRIORITY:
        return True
    threshold = job_admission_threshold_millis(tenant)
    return threshold is not None and total_millis > threshold


@transaction.atomic
def job_admission_request_create(*, job: Any, actor: User | None) -> Any:
    """Put ``job`` (already ``pending_approval``) in the approval inbox."""
    from tenants.models import ApprovalKind, ApprovalRequest

    requester = actor if actor is not None else job.submitter
    chain, escalations = _approval_chain(ApprovalKind.JOB_ADMISSION, job.tenant, requester)
    approval = ApprovalRequest.objects.create(
        kind=ApprovalKind.JOB_ADMISSION,
        tenant=job.tenant,
        job=job,
        requester=requester,
        payload={
            "job": job.pk,
            "name": job.name,
            "priority_class": int(job.priority_class),
            "total_millis": job.total_millis,
            "summary": f"{job.name}: {job.replicas} x {job.millis_per_replica} millis, priority {job.priority_class}",
        },
        chain=chain,
        escalations=escalations,
        expires_at=_approval_expiry(),
    )
    _approval_audit(
        approval,
        "request",
        actor=actor,
        details={"after": approval.payload, "chain": approval.chain, "escalations": escalations},
    )
    _notify_approvers(approval)
    return approval


@transaction.atomic
def tenant_set_job_approval_threshold(
    *, actor: User | None, tenant: Tenant, threshold_millis: int | None, request: Any = None
) -> Tenant:
    """Jobs larger than ``threshold_millis`` in total wait for approval (None: inherit)."""
    _ensure_may_write(actor)
    if actor is not None:
        _require(is_system_admin(actor), "Only a system admin sets the job approval threshold.")
    if threshold_millis is not None and threshold_millis < 0:
        raise DomainError("The threshold must be ≥ 0 millis.", field="job_approval_threshold_millis")
    before = tenant.job_approval_threshold_millis
    tenant.job_approval_threshold_millis = threshold_millis
    tenant.save(update_fields=["job_approval_threshold_millis"])
    audit_record(
        action="tenant.update",
        actor=actor,
        tenant=tenant,
        target=f"tenant:{tenant.pk}",
        details={
            "before": {"job_approval_threshold_millis": before},
            "after": {"job_approval_threshold_millis": threshold_millis},
        },
        request=request,
    )
    return tenant


# --- notifications -----------------------------------------------------------------------------------------

NOTIFICATION_MAX_ATTEMPTS = 5


def notification_deliver(*, delivery: Any) -> bool:
    """Try to send one delivery through its notifier; record the attempt. Returns True when sent."""
    from django.utils.module_loading import import_string

    from tenants.models import DeliveryStatus, NotificationDelivery

    with transaction.atomic():
        delivery = NotificationDelivery.objects.select_for_update(no_key=True).get(pk=delivery.pk)
        if delivery.status in (DeliveryStatus.SENT, DeliveryStatus.FAILED):
            return delivery.status == DeliveryStatus.SENT
        delivery.attempts += 1
        delivery.save(update_fields=["attempts", "updated_at"])
    error = ""
    try:
        import_string(delivery.notifier)().send(delivery)
    except Exception as exc:  # a notifier may fail in any way; the attempt is recorded, never raised
        error = f"{type(exc).__name__}: {exc}"[:2000]
        logger.warning(
            "notification %s via %s failed (attempt %s): %s", delivery.pk, delivery.notifier, delivery.attempts, error
        )
    with transaction.atomic():
        if error:
            delivery.last_error = error
            delivery.status = (
                DeliveryStatus.FAILED if delivery.attempts >= NOTIFICATION_MAX_ATTEMPTS else DeliveryStatus.RETRYING
            )
            if delivery.status == DeliveryStatus.FAILED:
                audit_record(
                    action="notification.failed",
                    actor=None,
                    tenant=delivery.approval.tenant if delivery.approval_id else None,
                    target=f"notification:{delivery.pk}",
                    outcome="failure",
                    details={"notifier": delivery.notifier, "attempts": delivery.attempts, "error": error},
                )
        else:
            delivery.status = DeliveryStatus.SENT
            delivery.sent_at = timezone.now()
            delivery.last_error = ""
        delivery.save(update_fields=["status", "last_error", "sent_at", "updated_at"])
    return not error


@transaction.atomic
def notification_retry(*, actor: User | None, delivery: Any, request: Any = None) -> Any:
    """Send a failed delivery again (admins, from the API), with a fresh attempt budget."""
    from tenants.models import DeliveryStatus, NotificationDelivery

    _ensure_may_write(actor)
    if actor is not None:
        _require(is_system_admin(actor) or is_security_admin(actor), "Only platform admins retry notifications.")
    delivery = NotificationDelivery.objects.select_for_update(no_key=True).get(pk=delivery.pk)
    if delivery.status == DeliveryStatus.SENT:
        raise ConflictError(f"Notification {delivery.pk} was already sent.", code="already_sent")
    delivery.status = DeliveryStatus.PENDING
    delivery.attempts = 0
    delivery.save(update_fields=["status", "attempts", "updated_at"])
    audit_record(action="notification.retry", actor=actor, target=f"notification:{delivery.pk}", request=request)
    transaction.on_commit(lambda: _enqueue_delivery(delivery.pk))
    return delivery


@transaction.atomic
def flavor_price_set(
    *, actor: User | None, flavor: Any, price_per_device_hour: Any, currency: str = "CNY", request: Any = None
) -> Any:
    """Set the showback price of one card-hour of ``flavor`` (system admins)."""
    from decimal import Decimal, InvalidOperation

    from tenants.models import FlavorPrice

    _ensure_may_write(actor)
    if actor is not None:
        _require(is_system_admin(actor), "Only a system admin sets prices.")
    try:
        price = Decimal(str(price_per_device_hour))
    except InvalidOperation:
        raise DomainError("price_per_device_hour must be a number.", field="price_per_device_hour") from None
    if price < 0 or not price.is_finite():
        raise DomainError("price_per_device_hour must be ≥ 0.", field="price_per_device_hour")
    existing = FlavorPrice.objects.filter(flavor=flavor).first()
    before = {"price": str(existing.price_per_device_hour), "currency": existing.currency} if existing else None
    row, _created = FlavorPrice.objects.update_or_create(
        flavor=flavor, defaults={"price_per_device_hour": price, "currency": currency.upper()[:3]}
    )
    audit_record(
        action="flavor.price.set",
        actor=actor,
        target=f"flavor:{flavor.pk}",
        details={"before": before, "after": {"price": str(price), "currency": row.currency}},
        request=request,
    )
    return row


# --- sign-in lockouts (django-axes) -----------------------------------------------------------------------


@transaction.atomic
def auth_lockout_reset(*, actor: User | None, attempt: Any, request: Any = None) -> int:
    """Lift a sign-in lockout: forget the failed sign-ins of one username from one address (django-axes'
    ``AccessAttempt``), so the person may try again at once instead of after the cool-off. Security admins
    only — they check who is asking first. Returns the failures cleared; lifting twice is harmless (0)."""
    from axes.models import AccessAttempt

    _ensure_may_write(actor)
    if actor is not None:
        _require(is_security_admin(actor), "Only a security admin may lift a sign-in lockout.")
    locked = AccessAttempt.objects.select_for_update().filter(pk=attempt.pk).first()
    if locked is None:
        return 0
    failures = locked.failures_since_start
    username = (locked.username or "")[:150]
    # Instance delete (not a queryset one): axes' post_delete handler clears its cache for this attempt.
    locked.delete()
    audit_record(
        action="auth.lockout.reset",
        actor=actor,
        target=f"username:{username}",
        details={"username": username, "ip_address": locked.ip_address, "failures": failures},
        request=request,
    )
    return failures
