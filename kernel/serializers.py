"""Input serializers that hold a JSON body to the types the OpenAPI schema documents.

DRF's fields coerce: a ``CharField`` takes ``12`` as ``"12"``, an ``IntegerField`` takes ``"12"`` and ``12.0``, a
``BooleanField`` takes ``"yes"``. The schema promises a string, an integer, a boolean, so a client that sends the
wrong type has a bug the API should name instead of guessing (``POST /flavors/`` stored ``{"model": 12}``).
Form bodies (a ``QueryDict``: every value is text) keep DRF's coercion.

``FieldsBuiltOnce`` is for output serializers on hot paths: it builds a ``ModelSerializer``'s fields once per class.
"""

from __future__ import annotations

import copy
from typing import Any

from django.http import QueryDict
from django.utils.functional import cached_property
from rest_framework import serializers
from rest_framework.utils.serializer_helpers import BindingDict

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


class FieldsBuiltOnce:
    """Mixin for a ``ModelSerializer`` whose fields do not depend on the instance, the request or the context:
    its fields are built from the model once per class and each serializer binds shallow copies of them.

    DRF rebuilds every field from the model's metadata for each serializer it makes (``get_fields``): for a job's
    answer that was a third of a submit's CPU. Only for serializers whose ``get_fields`` is not overridden to
    vary per request; nested serializers' children are then shared, so they must not keep per-request state.
    """

    @cached_property
    def fields(self) -> BindingDict:
        cls = type(self)
        built = cls.__dict__.get("_fields_built_once")
        if built is None:
            built = self.get_fields()  # unbound fields, never used themselves: only copied
            cls._fields_built_once = built
        fields = BindingDict(self)
        for name, field in built.items():
            fields[name] = copy.copy(field)  # binding sets the copy's name and parent, not the prototype's
        return fields
