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
from tenants.models import (
    MAX_TENANT_DEPTH,
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
)

# Marks "argument not given" where None is a meaningful value (e.g. parent=None moves a tenant to the top).
UNSET: Any = object()

TOKEN_DEFAULT_LIFETIME_DAYS = 90
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
    user = User.objects.select_for_update().get(pk=user.pk)
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
    user = User.objects.select_for_update().get(pk=user.pk)
    before = user.platform_role
    if before == platform_role:
        return user
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
    tenant = Tenant.objects.select_for_update().select_related("parent").get(pk=tenant.pk)
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
    if user.platform_role == PlatformRole.AUDITOR:
        raise DomainError(
            f"{user.username} is an auditor; auditors cannot be tenant members.", code="separation_of_duties"
        )
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
    membership = Membership.objects.select_for_update().select_related("user", "tenant").get(pk=membership.pk)
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
    request: Any = None,
) -> tuple[ApiToken, str]:
    """Create a token for ``actor`` itself and return it with its secret — the only time the secret exists
    outside the caller's hands. Tokens always expire (default 90 days, at most a year)."""
    if not actor.is_active:
        raise PermissionDeniedError("This account is deactivated.")
    if scope not in TokenScope.values:
        raise DomainError(f"Unknown scope {scope!r}; use read, write or admin.", field="scope")
    if scope == TokenScope.ADMIN and not (is_system_admin(actor) or is_security_admin(actor)):
        raise DomainError("Only system and security admins may create admin-scoped tokens.", field="scope")
    if is_auditor(actor) and scope != TokenScope.READ:
        raise DomainError("Auditors may only create read-scoped tokens.", field="scope")
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
    token = ApiToken.objects.select_for_update().get(pk=token.pk)
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
