"""Input serializers that hold a JSON body to the types the OpenAPI schema documents.

DRF's fields coerce: a ``CharField`` takes ``12`` as ``"12"``, an ``IntegerField`` takes ``"12"`` and ``12.0``, a
``BooleanField`` takes ``"yes"``. The schema promises a string, an integer, a boolean, so a client that sends the
wrong type has a bug the API should name instead of guessing (``POST /flavors/`` stored ``{"model": 12}``).
Form bodies (a ``QueryDict``: every value is text) keep DRF's coercion.
"""

from __future__ import annotations

from typing import Any

from django.http import QueryDict
from rest_framework import serializers

_TEXT_FIELDS = (
    serializers.CharField,
    serializers.DateTimeField,
    serializers.DateField,
    serializers.TimeField,
    serializers.DurationField,
    serializers.UUIDField,
)


def json_type_problem(field: serializers.Field, value: Any) -> str | None:
    """Why ``value`` (decoded JSON) is not of the JSON type ``field`` documents, or None. ``null`` is left to the
    field (``allow_null``); fields whose schema admits several types are not checked."""
    if value is None:
        return None
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else "Must be true or false."
    if isinstance(field, serializers.IntegerField):
        return None if isinstance(value, int) and not isinstance(value, bool) else "Must be an integer."
    if isinstance(field, serializers.FloatField):
        return None if isinstance(value, int | float) and not isinstance(value, bool) else "Must be a number."
    if isinstance(field, serializers.MultipleChoiceField):
        return None if isinstance(value, list) else "Must be a list."
    if isinstance(field, serializers.ChoiceField):
        kinds = {type(choice) for choice in field.choices}
        if kinds == {str}:
            return None if isinstance(value, str) else "Must be a string."
        if kinds == {int}:
            return None if isinstance(value, int) and not isinstance(value, bool) else "Must be an integer."
        return None
    if isinstance(field, _TEXT_FIELDS):
        return None if isinstance(value, str) else "Must be a string."
    if isinstance(field, serializers.ListField | serializers.ListSerializer):
        return None if isinstance(value, list) else "Must be a list."
    return None


class JsonTypedSerializer(serializers.Serializer):
    """A ``Serializer`` whose JSON input values must have their fields' documented types (see the module)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data, QueryDict):
            errors = {
                name: [problem]
                for name, field in self.fields.items()
                if not field.read_only
                and field.source != "*"
                and name in data
                and (problem := json_type_problem(field, data[name]))
            }
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)
