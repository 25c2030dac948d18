"""Filters for the console tables. Values come from the query string, so a filtered view is a link."""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import Q
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from audit import selectors as audit_selectors
from audit.models import Outcome
from catalog.models import ResourceFlavor
from frontend.forms import DateInput
from frontend.tables import PENDING_REASON_WORDS
from scheduler.core.types import PendingReason
from scheduler.fleet.models import Node, NodeStatus
from scheduler.models import ACTIVE_JOB_STATES, FINAL_JOB_STATES, PENDING_JOB_STATES, JobKind, JobState, PriorityClass


class NodeFilterSet(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label=_("Search"))
    status = django_filters.ChoiceFilter(choices=NodeStatus.choices, label=_("Status"), empty_label=_("any"))
    flavor = django_filters.ModelChoiceFilter(
        queryset=ResourceFlavor.objects.all(),
        field_name="devices__flavor",
        to_field_name="name",
        label=_("Flavor"),
        empty_label=_("any"),
        distinct=True,
    )

    class Meta:
        model = Node
        fields = ["q", "status", "flavor"]

    def search(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(devices__uuid__icontains=value)).distinct()


class AuditFilterSet(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label=_("Search"))
    action = django_filters.CharFilter(field_name="action", lookup_expr="startswith", label=_("Action starts with"))
    actor = django_filters.CharFilter(field_name="actor_username", lookup_expr="iexact", label=_("Actor"))
    outcome = django_filters.ChoiceFilter(
        field_name="outcome", choices=Outcome.choices, label=_("Outcome"), empty_label=_("any")
    )
    stream = django_filters.CharFilter(field_name="stream", label=_("Stream"))
    tenant = django_filters.ChoiceFilter(field_name="tenant_id", label=_("Tenant"), empty_label=_("any"))
    since = django_filters.DateFilter(
        field_name="created_at", lookup_expr="date__gte", label=_("From (date)"), widget=DateInput
    )
    until = django_filters.DateFilter(
        field_name="created_at", lookup_expr="date__lte", label=_("To (date)"), widget=DateInput
    )

    def __init__(self, *args, tenants: list[tuple[str, str]] = (), **kwargs) -> None:
        """``tenants``: (id, name) of the tenants to pick from (the ``tenant`` parameter stays the id)."""
        super().__init__(*args, **kwargs)
        self.filters["tenant"].extra["choices"] = tenants

    def search(self, queryset, name, value):
        return audit_selectors.records_search(queryset, value)


class JobFilterSet(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label=_("Search"))
    state = django_filters.ChoiceFilter(
        choices=[
            ("waiting", _("waiting (submitted, approval, queued)")),
            ("active", _("active (admitted, running, preempting)")),
            ("finished", _("finished (succeeded, failed, cancelled)")),
            *JobState.choices,
        ],
        method="by_state",
        label=_("State"),
        empty_label=_("any"),
    )
    tenant = django_filters.ChoiceFilter(field_name="tenant__slug", label=_("Tenant"), empty_label=_("any"))
    # Why a waiting job waits (the engine's code): "every job of mine held back by quota" as a saved filter.
    reason = django_filters.ChoiceFilter(
        choices=[(str(code), format_lazy("{} ({})", word, code)) for code, word in PENDING_REASON_WORDS.items()],
        method="by_reason",
        label=_("Reason"),
        empty_label=_("any"),
    )
    kind = django_filters.ChoiceFilter(choices=JobKind.choices, label=_("Kind"), empty_label=_("any"))
    priority_class = django_filters.ChoiceFilter(
        choices=PriorityClass.choices, label=_("Priority"), empty_label=_("any")
    )
    mine = django_filters.BooleanFilter(method="only_mine", label=_("Only mine"), widget=forms.CheckboxInput)

    def __init__(self, *args, tenants: list[tuple[str, str]] = (), **kwargs) -> None:
        """``tenants``: (slug, name) of the tenants the caller sees (the ``tenant`` parameter stays the slug)."""
        super().__init__(*args, **kwargs)
        self.filters["tenant"].extra["choices"] = tenants

    def search(self, queryset, name, value):
        query = Q(name__icontains=value)
        if value.isdigit():
            query |= Q(pk=int(value))
        return queryset.filter(query)

    def by_state(self, queryset, name, value):
        groups = {
            "waiting": [JobState.SUBMITTED, *PENDING_JOB_STATES],
            "active": list(ACTIVE_JOB_STATES),
            "finished": list(FINAL_JOB_STATES),
        }
        return queryset.filter(state__in=groups.get(value, [value]))

    def by_reason(self, queryset, name, value):
        # A job awaiting approval may not have been explained by a cycle yet; the list shows it as "approval".
        if value == PendingReason.AWAITING_APPROVAL:
            return queryset.filter(state=JobState.PENDING_APPROVAL)
        return queryset.filter(state__in=PENDING_JOB_STATES, pending_reason_code=value)

    def only_mine(self, queryset, name, value):
        return queryset.filter(submitter=self.request.user) if value and self.request else queryset
