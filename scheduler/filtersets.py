"""django-filter filtersets for the scheduler's list endpoints."""

from __future__ import annotations

import django_filters

from kernel.filters import UtcIsoDateTimeFilter
from scheduler.fleet.models import Device, DeviceHealth, Node, NodeStatus
from scheduler.models import Job, JobKind, JobState, PriorityClass


class JobFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    kind = django_filters.ChoiceFilter(choices=JobKind.choices)
    # The word the spec takes and the API shows ("normal"); the stored number (500) is still accepted.
    priority_class = django_filters.TypedChoiceFilter(
        choices=[(choice.name.lower(), choice.name.lower()) for choice in PriorityClass]
        + [(str(choice.value), str(choice.value)) for choice in PriorityClass],
        coerce=lambda value: int(value) if str(value).isdigit() else PriorityClass[str(value).upper()].value,
    )
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    submitter = django_filters.CharFilter(field_name="submitter__username")
    name = django_filters.CharFilter(lookup_expr="icontains")
    submitted_after = UtcIsoDateTimeFilter(field_name="submitted_at", lookup_expr="gte")
    submitted_before = UtcIsoDateTimeFilter(field_name="submitted_at", lookup_expr="lt")
    array = django_filters.UUIDFilter(field_name="array_id", help_text="the jobs of one array submit")

    class Meta:
        model = Job
        fields = ["state", "kind", "priority_class", "tenant", "submitter", "name", "array"]


class NodeFilterSet(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(choices=NodeStatus.choices)
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["status", "name"]


class DeviceFilterSet(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__name")
    flavor = django_filters.CharFilter(field_name="flavor__name")
    health = django_filters.ChoiceFilter(choices=DeviceHealth.choices)

    class Meta:
        model = Device
        fields = ["node", "flavor", "health", "vendor"]
