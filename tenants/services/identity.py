"""Users, platform roles, passwords, two-factor sign-in and sign-in lockouts."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from audit.services import audit_record
from kernel.access_rules import Action
from kernel.api import DomainError, PermissionDeniedError
from tenants import messages as tenants_messages
from tenants.access import allows
from tenants.models import Membership, PlatformRole, User
from tenants.services.guards import UNSET, ensure_may_write, require_permission

# --- users and platform roles -----------------------------------------------------------------------------


def _user_snapshot(user: User) -> dict:
    return {
        "username": user.username,
        "email": user.email,
        "platform_role": user.platform_role,
        "is_active": user.is_active,
        "first_name": user.first_name,
        "last_name": user.last_name,
    }


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
    ensure_may_write(actor)
    if actor is not None:
        require_permission(allows(actor, Action.USER_MANAGE), tenants_messages.ONLY_SECURITY_ADMIN_MAY_CREATE())
    if platform_role not in PlatformRole.values:
        raise DomainError(
            tenants_messages.UNKNOWN_PLATFORM_ROLE(value=platform_role), code="invalid", field="platform_role"
        )
    if User.objects.filter(username__iexact=username).exists():
        raise DomainError(
            tenants_messages.USER_NAMED_ALREADY_EXISTS_CHOOSE(name=username), code="duplicate", field="username"
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
    ensure_may_write(actor)
    if actor is not None:
        require_permission(allows(actor, Action.USER_MANAGE, user), tenants_messages.ONLY_SECURITY_ADMIN_MAY_CHANGE())
        if is_active is False and actor.pk == user.pk:
            raise DomainError(tenants_messages.YOU_CANNOT_DEACTIVATE_YOUR_OWN())
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
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            allows(actor, Action.USER_PLATFORM_ROLE, user), tenants_messages.ONLY_SECURITY_ADMIN_MAY_GRANT()
        )
        if actor.pk == user.pk:
            raise DomainError(tenants_messages.YOU_CANNOT_CHANGE_YOUR_OWN())
    if platform_role not in PlatformRole.values:
        raise DomainError(
            tenants_messages.UNKNOWN_PLATFORM_ROLE_USE_ONE(
                value=platform_role, choices=", ".join(repr(v) for v in PlatformRole.values)
            ),
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
            tenants_messages.MEMBER_TENANTS_PLATFORM_ACCOUNT_HOLDS(user=user.username),
            code="separation_of_duties",
            field="platform_role",
        )
    if before and platform_role:
        raise DomainError(
            tenants_messages.ALREADY_HOLDS_PLATFORM_ROLE_ONE(user=user.username, before=before, after=platform_role),
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
    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            allows(actor, Action.USER_SET_PASSWORD, user), tenants_messages.ONLY_SECURITY_ADMIN_MAY_SET()
        )
    _validate_new_password(password, user)
    user.set_password(password)
    user.save(update_fields=["password"])
    audit_record(action="user.password.set", actor=actor, target=f"user:{user.pk}", request=request)
    return user


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
        require_permission(actor.pk == user.pk, tenants_messages.YOU_CAN_ONLY_ENROL_TWO())
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
        raise PermissionDeniedError(tenants_messages.DEVICE_BELONGS_ANOTHER_ACCOUNT())
    if not device.verify_token(otp.strip()):
        audit_record(
            action="auth.mfa.enrol.confirm", actor=actor, target=f"user:{actor.pk}", outcome="failure", request=request
        )
        raise DomainError(tenants_messages.CODE_NOT_VALID_CHECK_CLOCK(), code="otp_invalid")
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

    ensure_may_write(actor)
    if actor is not None:
        require_permission(
            allows(actor, Action.USER_MANAGE, user),
            tenants_messages.ONLY_SECURITY_ADMIN_MAY_RESET(),
        )
    removed = 0
    for device in list(devices_for_user(user, confirmed=None)):
        device.delete()
        removed += 1
    audit_record(
        action="auth.mfa.reset", actor=actor, target=f"user:{user.pk}", details={"removed": removed}, request=request
    )
    return removed


# --- sign-in lockouts (django-axes) -----------------------------------------------------------------------


@transaction.atomic
def auth_lockout_reset(*, actor: User | None, attempt: Any, request: Any = None) -> int:
    """Lift a sign-in lockout: forget the failed sign-ins of one username from one address (django-axes'
    ``AccessAttempt``), so the person may try again at once instead of after the cool-off. Security admins
    only — they check who is asking first. Returns the failures cleared; lifting twice is harmless (0)."""
    from axes.models import AccessAttempt

    ensure_may_write(actor)
    if actor is not None:
        require_permission(allows(actor, Action.LOCKOUT_RESET), tenants_messages.ONLY_SECURITY_ADMIN_MAY_LIFT())
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


def user_language_set(*, user: User, language: str) -> None:
    """Remember the language ``user`` reads (the console's language menu): their notifications are written in it.
    A preference of their own, not a change to the pool: no audit record."""
    if language not in dict(settings.LANGUAGES):
        raise DomainError(
            tenants_messages.UNKNOWN_LANGUAGE_USE_ONE(value=language, choices=", ".join(dict(settings.LANGUAGES))),
            field="language",
        )
    User.objects.filter(pk=user.pk).update(language=language)
    user.language = language
