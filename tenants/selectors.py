"""Reads for tenants, users, memberships and tokens: querysets already limited to what the caller may see.

Objects outside what a caller may see are *missing* to that caller: the ``*_get_visible`` helpers raise the
same ``NotFoundError`` for "does not exist" and "not yours", so the API answers 404 and leaks nothing.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from kernel.access_rules import Action
from kernel.api import NotFoundError
from tenants import messages as tenants_messages
from tenants.access import restrict
from tenants.models import (
    ApiToken,
    ApprovalRequest,
    ApprovalStatus,
    Membership,
    NotificationDelivery,
    Quota,
    Tenant,
    User,
)
from tenants.permissions import can_decide_approval, is_approval_override
from tenants.tree import parse_id, subtree_q

__all__ = ["parse_id", "subtree_q"]  # re-exported: callers import the tree helpers from here too


def tenants_visible_to(user: Any) -> QuerySet[Tenant]:
    """Platform roles see every tenant (the auditor read-only); everybody else the subtrees of the tenants
    they are members of (policy action ``tenant.view``)."""
    return restrict(Tenant.objects.select_related("parent"), user, Action.TENANT_VIEW)


def tenants_administered_by(user: Any) -> QuerySet[Tenant]:
    """The tenants ``user`` may change (``tenants.permissions.can_admin_tenant``): all for a system admin, the
    subtrees where they are tenant admin for anyone else (policy action ``tenant.change``)."""
    return restrict(Tenant.objects.select_related("parent"), user, Action.TENANT_CHANGE)


def tenants_usage_visible_to(user: Any) -> QuerySet[Tenant]:
    """The tenants whose usage (device-hours, cost) ``user`` may read (policy action ``usage.view``)."""
    return restrict(Tenant.objects.all(), user, Action.USAGE_VIEW)


def tenant_ids_visible_to(user: Any) -> QuerySet:
    return tenants_visible_to(user).values("pk")


def tenant_subtree(tenant: Tenant) -> QuerySet[Tenant]:
    return Tenant.objects.filter(subtree_q([tenant.pk])).select_related("parent")


def tenant_subtree_ids(tenant: Tenant) -> list[int]:
    return list(Tenant.objects.filter(subtree_q([tenant.pk])).values_list("pk", flat=True))


def tenant_subtree_height(tenant: Tenant) -> int:
    """Levels in the subtree of ``tenant``, itself included (1 for a leaf)."""
    deepest = Tenant.objects.filter(subtree_q([tenant.pk])).order_by("-depth").values_list("depth", flat=True)[:1]
    return (deepest[0] if deepest else tenant.depth) - tenant.depth + 1


def tenant_get_visible(*, user: Any, pk: Any) -> Tenant:
    try:
        return tenants_visible_to(user).get(pk=parse_id(pk))
    except Tenant.DoesNotExist:
        raise NotFoundError(tenants_messages.NO_TENANT_ID_VISIBLE_YOU(pk=pk)) from None


def memberships_visible_to(user: Any) -> QuerySet[Membership]:
    return restrict(Membership.objects.select_related("user", "tenant"), user, Action.MEMBERSHIP_VIEW)


def users_visible_to(user: Any) -> QuerySet[User]:
    """Platform roles see every account; others see themselves and the members of the tenants they see."""
    return restrict(User.objects.all(), user, Action.USER_VIEW).order_by("username")


def user_get_visible(*, user: Any, pk: Any) -> User:
    try:
        return users_visible_to(user).get(pk=parse_id(pk))
    except User.DoesNotExist:
        raise NotFoundError(tenants_messages.NO_USER_ID_VISIBLE_YOU(pk=pk)) from None


def tokens_visible_to(user: Any) -> QuerySet[ApiToken]:
    """Everyone sees their own tokens; security admins see all (to revoke a leaked one)."""
    return restrict(ApiToken.objects.select_related("user"), user, Action.TOKEN_VIEW)


def token_get_visible(*, user: Any, pk: Any) -> ApiToken:
    try:
        return tokens_visible_to(user).get(pk=parse_id(pk))
    except ApiToken.DoesNotExist:
        raise NotFoundError(tenants_messages.NO_API_TOKEN_ID_VISIBLE(pk=pk)) from None


# --- quotas (their use now is the scheduler's: scheduler/quota_usage.py) -----------------------------------


def quotas_visible_to(user: Any) -> QuerySet:

    return restrict(Quota.objects.select_related("tenant", "flavor"), user, Action.QUOTA_VIEW)


# --- approvals and notifications ------------------------------------------------------------------------


def approvals_visible_to(user: Any) -> QuerySet:
    """Platform roles see every request; others those of the tenants they see (their inbox and requests)."""

    queryset = ApprovalRequest.objects.select_related("tenant__parent", "flavor", "requester").prefetch_related(
        "steps__actor"
    )
    return restrict(queryset, user, Action.APPROVAL_VIEW)


def approval_get_visible(*, user: Any, pk: Any) -> Any:

    try:
        return approvals_visible_to(user).get(pk=parse_id(pk))
    except ApprovalRequest.DoesNotExist:
        raise NotFoundError(tenants_messages.NO_APPROVAL_REQUEST_ID_VISIBLE(pk=pk)) from None


def approvals_awaiting(user: Any) -> list:
    """The caller's inbox: open requests whose current step waits for a role the caller holds."""

    return [
        approval
        for approval in approvals_visible_to(user).filter(status=ApprovalStatus.PENDING)
        if can_decide_approval(user, approval) and not is_approval_override(user, approval)
    ]


def approvals_overridable(user: Any) -> list:
    """For system admins: open requests waiting for someone else, which they may still decide (with a comment)."""

    return [
        approval
        for approval in approvals_visible_to(user).filter(status=ApprovalStatus.PENDING)
        if can_decide_approval(user, approval) and is_approval_override(user, approval)
    ]


def notifications_visible_to(user: Any) -> QuerySet:
    """Delivery records are for the platform's admins (system and security)."""

    return restrict(NotificationDelivery.objects.all(), user, Action.NOTIFICATION_VIEW)


# --- sign-in lockouts (django-axes) ---------------------------------------------------------------------


def auth_lockout_cool_off() -> Any:
    """How long failed sign-ins count (django-axes' AXES_COOLOFF_TIME as a timedelta; None = for ever)."""
    from axes.helpers import get_cool_off

    return get_cool_off()


def auth_lockouts_visible_to(user: Any) -> QuerySet:
    """Failed-sign-in records still inside the cool-off window, newest first, for security admins (nobody
    else). ``locked`` marks those at or over AXES_FAILURE_LIMIT: that username cannot sign in from that
    address until the cool-off after its last failure ends, or a security admin lifts the lockout."""
    from axes.models import AccessAttempt
    from django.conf import settings
    from django.db.models import BooleanField, ExpressionWrapper

    attempts = restrict(AccessAttempt.objects.all(), user, Action.LOCKOUT_VIEW)
    cool_off = auth_lockout_cool_off()
    if cool_off is not None:
        from django.utils import timezone

        attempts = attempts.filter(attempt_time__gte=timezone.now() - cool_off)
    return attempts.annotate(
        locked=ExpressionWrapper(Q(failures_since_start__gte=settings.AXES_FAILURE_LIMIT), output_field=BooleanField())
    ).order_by("-attempt_time", "-id")


def auth_lockout_get_visible(*, user: Any, pk: Any) -> Any:
    found = auth_lockouts_visible_to(user).filter(pk=parse_id(pk)).first()
    if found is None:
        raise NotFoundError(tenants_messages.NO_SIGN_LOCKOUT_ID_VISIBLE(pk=pk))
    return found
