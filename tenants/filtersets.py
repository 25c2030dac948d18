"""django-filter filtersets for the tenants API. They narrow querysets already scoped by the selectors."""

from __future__ import annotations

import django_filters
from django.db.models import Q, QuerySet
from django.utils import timezone

from kernel.filters import IdFilter, StrictBooleanFilter
from tenants.models import (
    ApiToken,
    ApprovalKind,
    ApprovalRequest,
    ApprovalStatus,
    DeliveryStatus,
    Membership,
    MembershipRole,
    NotificationDelivery,
    PlatformRole,
    Quota,
    Tenant,
    TenantKind,
    TokenScope,
    User,
)
from tenants.selectors import approvals_awaiting, subtree_q


class TenantFilterSet(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    kind = django_filters.ChoiceFilter(choices=TenantKind.choices)
    parent = IdFilter(field_name="parent_id")
    depth = IdFilter(max_value=99)
    within = IdFilter(method="filter_within", label="subtree of this tenant id (itself included)")

    class Meta:
        model = Tenant
        fields = ["slug", "name", "kind", "parent", "depth", "within"]

    def filter_within(self, queryset: QuerySet, name: str, value: int) -> QuerySet:
        return queryset.filter(subtree_q([int(value)]))


class MembershipFilterSet(django_filters.FilterSet):
    tenant = IdFilter(field_name="tenant_id")
    user = IdFilter(field_name="user_id")
    username = django_filters.CharFilter(field_name="user__username")
    role = django_filters.ChoiceFilter(choices=MembershipRole.choices)

    class Meta:
        model = Membership
        fields = ["tenant", "user", "username", "role"]


class UserFilterSet(django_filters.FilterSet):
    username = django_filters.CharFilter(lookup_expr="icontains")
    platform_role = django_filters.ChoiceFilter(choices=PlatformRole.choices)
    is_active = StrictBooleanFilter()
    tenant = IdFilter(field_name="memberships__tenant_id", distinct=True)

    class Meta:
        model = User
        fields = ["username", "platform_role", "is_active", "tenant"]


class ApiTokenFilterSet(django_filters.FilterSet):
    user = IdFilter(field_name="user_id")
    scope = django_filters.ChoiceFilter(choices=TokenScope.choices)
    active = StrictBooleanFilter(method="filter_active")

    class Meta:
        model = ApiToken
        fields = ["user", "scope", "active"]

    def filter_active(self, queryset: QuerySet, name: str, value: bool) -> QuerySet:
        usable = Q(revoked_at__isnull=True, expires_at__gt=timezone.now())
        return queryset.filter(usable) if value else queryset.exclude(usable)


class QuotaFilterSet(django_filters.FilterSet):
    tenant = IdFilter(field_name="tenant_id")
    flavor = django_filters.CharFilter(field_name="flavor__name")

    class Meta:
        model = Quota
        fields = ["tenant", "flavor"]


class ApprovalFilterSet(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=ApprovalKind.choices)
    status = django_filters.ChoiceFilter(choices=ApprovalStatus.choices)
    tenant = IdFilter(field_name="tenant_id")
    awaiting_me = StrictBooleanFilter(method="filter_awaiting_me", label="only requests you can decide now")

    class Meta:
        model = ApprovalRequest
        fields = ["kind", "status", "tenant", "awaiting_me"]

    def filter_awaiting_me(self, queryset: QuerySet, name: str, value: bool) -> QuerySet:
        ids = [approval.pk for approval in approvals_awaiting(self.request.user)]
        return queryset.filter(pk__in=ids) if value else queryset.exclude(pk__in=ids)


class NotificationFilterSet(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=DeliveryStatus.choices)
    approval = IdFilter(field_name="approval_id")

    class Meta:
        model = NotificationDelivery
        fields = ["status", "approval"]
