"""Filters shared by the apps' filtersets."""

from __future__ import annotations

import datetime as dt
from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django_filters.fields import IsoDateTimeField
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend, OrderingFilter, SearchFilter
from rest_framework.request import Request

# The largest id a BIGINT (and SQLite's INTEGER) holds: a larger number in a URL is "not found", in a filter a 400.
MAX_ID = 2**63 - 1


class _IdField(forms.IntegerField):
    def to_python(self, value: Any) -> int | None:
        # A parameter left out arrives as None and filters nothing; one sent empty (``?within=``) is refused,
        # as the schema's integer type says, rather than silently ignored (the API fuzz found it answered 200).
        if value == "":
            raise DjangoValidationError("Enter a whole number, or leave the parameter out.", code="invalid")
        return super().to_python(value)


class IdFilter(django_filters.NumberFilter):
    """An id: a whole number the database can hold (a 20-digit id is a 400, not a database overflow); an empty
    value is a 400 too."""

    field_class = _IdField

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)


class _StrictBooleanField(forms.NullBooleanField):
    TRUE = frozenset({"true", "True", "1"})
    FALSE = frozenset({"false", "False", "0"})

    def to_python(self, value: Any) -> bool | None:
        # Django's NullBooleanField reads anything it does not know (``?active=null``, ``?active=1.2e240``) as
        # "not given", so the list answered 200 unfiltered (the API fuzz found it); here it is a 400.
        if value is None or isinstance(value, bool):
            return value
        if value in self.TRUE:
            return True
        if value in self.FALSE:
            return False
        raise DjangoValidationError("Enter true or false, or leave the parameter out.", code="invalid")

    def validate(self, value: Any) -> None:
        return None


class StrictBooleanFilter(django_filters.BooleanFilter):
    """A boolean query parameter: ``true``/``false`` (or ``1``/``0``); anything else is a 400, not ignored."""

    field_class = _StrictBooleanField

    def __init__(self, *args, **kwargs) -> None:
        # The default widget (NullBooleanSelect) turns an unknown value into None before the field sees it.
        kwargs.setdefault("widget", forms.TextInput)
        super().__init__(*args, **kwargs)


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, converted to UTC. Python accepts offsets up to ±23:59 but PostgreSQL refuses
    those beyond ±15:59 ("time zone displacement out of range"), which turned ``?x=2000-01-01T00:00+16:00``
    into a 500; in UTC every valid date-time is a valid query."""

    def to_python(self, value):
        result = super().to_python(value)
        if result is not None and result.tzinfo is not None:
            try:
                return result.astimezone(dt.UTC)
            except OverflowError as exc:  # e.g. 0001-01-01T00:00+01:00 is before year 1 in UTC
                raise DjangoValidationError(self.error_messages["invalid"], code="invalid") from exc
        return result


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


# Query parameters every list takes besides its filters: pagination (kernel.pagination) and DRF's format.
COMMON_LIST_PARAMETERS = frozenset({"limit", "offset", "format"})


class KnownQueryParameters(BaseFilterBackend):
    """Refuse what a list would otherwise ignore: an unknown query parameter (``?serach=x``), ``ordering`` on a
    field the list cannot be ordered by, or ``search`` on a list without search. A silently ignored parameter
    answers a different question than the one asked; here it is a 400 naming the parameter and what is
    accepted. Only list actions are checked (a detail action may take its own parameters)."""

    def filter_queryset(self, request: Request, queryset: QuerySet, view: Any) -> QuerySet:
        if getattr(view, "action", None) != "list":
            return queryset
        allowed = set(COMMON_LIST_PARAMETERS)
        filterset_class = getattr(view, "filterset_class", None)
        if filterset_class is not None:
            allowed.update(filterset_class.base_filters)
        ordering = OrderingFilter()
        if getattr(view, "ordering_fields", None):
            allowed.add(ordering.ordering_param)
        if getattr(view, "search_fields", None):
            allowed.add(SearchFilter.search_param)
        unknown = sorted(set(request.query_params) - allowed)
        if unknown:
            name = unknown[0]
            if name == ordering.ordering_param:
                detail = "this list cannot be ordered."
            elif name == SearchFilter.search_param:
                detail = "this list has no search; use its filters."
            else:
                detail = f"is not a parameter of this list; accepted: {', '.join(sorted(allowed))}."
            raise ValidationError({name: [detail]})
        if ordering.ordering_param in request.query_params:
            valid = {field for field, _label in ordering.get_valid_fields(queryset, view, {"request": request})}
            terms = [term.strip() for term in request.query_params[ordering.ordering_param].split(",")]
            wrong = [term for term in terms if term.lstrip("-") not in valid]
            if wrong:
                raise ValidationError(
                    {ordering.ordering_param: [f"cannot order by {wrong[0]!r}; accepted: {', '.join(sorted(valid))}."]}
                )
        return queryset


class OfferedOrderingFilter(OrderingFilter):
    """``?ordering=`` where a list offers it (``ordering_fields`` on the view), and only there in the schema."""

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        if not getattr(view, "ordering_fields", None):
            return []
        parameters = super().get_schema_operation_parameters(view)
        fields = sorted(view.ordering_fields)
        for parameter in parameters:
            parameter["description"] = f"Comma-separated fields, '-' for descending: {', '.join(fields)}."
            parameter["schema"] = {"type": "string", "example": f"-{fields[0]}"}
        return parameters


class OfferedSearchFilter(SearchFilter):
    """``?search=`` where a list offers it (``search_fields`` on the view), and only there in the schema."""

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        if not getattr(view, "search_fields", None):
            return []
        return super().get_schema_operation_parameters(view)
