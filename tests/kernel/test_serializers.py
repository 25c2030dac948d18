"""``FieldsBuiltOnce``: a model serializer's fields are built once per class, yet each serializer answers for its
own object with fields bound to itself."""

from __future__ import annotations

from unittest import mock

import pytest
from rest_framework import serializers

from kernel.serializers import FieldsBuiltOnce
from tenants.models import Tenant
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


class _TenantOut(FieldsBuiltOnce, serializers.ModelSerializer):
    shout = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = ["id", "slug", "shout"]

    def get_shout(self, tenant: Tenant) -> str:
        return tenant.slug.upper()


def test_fields_are_built_once_and_each_serializer_answers_for_its_own_object():
    first, second = TenantFactory(slug="alpha"), TenantFactory(slug="beta")
    already_built = "_fields_built_once" in _TenantOut.__dict__
    calls = []
    original = serializers.ModelSerializer.get_fields

    def counting(self):
        calls.append(type(self))
        return original(self)

    with mock.patch.object(serializers.ModelSerializer, "get_fields", counting):
        a, b = _TenantOut(first), _TenantOut(second)
        assert a.data == {"id": first.pk, "slug": "alpha", "shout": "ALPHA"}
        assert b.data == {"id": second.pk, "slug": "beta", "shout": "BETA"}
    assert calls.count(_TenantOut) == (0 if already_built else 1)
    assert a.fields["shout"] is not b.fields["shout"]
    assert a.fields["shout"].parent is a and b.fields["shout"].parent is b
