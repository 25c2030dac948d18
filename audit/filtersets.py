"""Filters of the audit record list: time range, actor, tenant, action (prefix), outcome, stream, free text."""

from __future__ import annotations

import django_filters

from audit.models import AuditRecord, Outcome
from audit.selectors import records_search
from kernel.filters import IdFilter, UtcIsoDateTimeFilter


class AuditRecordFilterSet(django_filters.FilterSet):
    # The console's search box: action, target or actor contains it, or the action's description does.
    q = django_filters.CharFilter(
        method="search", help_text='Free text: action, target (job:42) or actor contains it; "cancel" finds job.cancel.'
    )
    created_after = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    actor = django_filters.CharFilter(field_name="actor_username")
    # Whole-number ids (a NumberFilter took 9.4e-240 as a decimal, against the schema's integer).
    actor_id = IdFilter(field_name="actor_id")
    tenant = IdFilter(field_name="tenant_id")
    action = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    outcome = django_filters.ChoiceFilter(choices=Outcome.choices)
    stream = django_filters.CharFilter(field_name="stream")
    target = django_filters.CharFilter(field_name="target")
    request_id = django_filters.CharFilter(field_name="request_id")

    class Meta:
        model = AuditRecord
        fields = ["created_after", "created_before", "actor", "actor_id", "tenant", "action", "outcome", "stream"]

    def search(self, queryset, name, value):
        return records_search(queryset, value)
