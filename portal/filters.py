"""Filters shared by the apps' filtersets."""

from __future__ import annotations

import datetime as dt

import django_filters
from django.core.exceptions import ValidationError
from django_filters.fields import IsoDateTimeField


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
                raise ValidationError(self.error_messages["invalid"], code="invalid") from exc
        return result


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField
