"""Serializers of the tenants API: output shapes, and strict input shapes (unknown keys are a 400)."""

from __future__ import annotations

from typing import Any

from django_otp import user_has_device
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants.models import ApiToken, Membership, MembershipRole, PlatformRole, Tenant, TenantKind, TokenScope, User
from tenants.selectors import MAX_ID


class StrictInputSerializer(serializers.Serializer):
    """An input serializer that refuses keys it does not know, so a typo (``guaranted_millis``) is an error
    rather than a silently ignored field."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                allowed = ", ".join(sorted(self.fields))
                raise serializers.ValidationError(
                    {key: [f"Unknown field {key!r}; this endpoint accepts: {allowed}."] for key in unknown}
                )
        elif data is not None:
            raise serializers.ValidationError({"non_field_errors": ["Send a JSON object."]})
        return super().to_internal_value(data)


# --- tenants ----------------------------------------------------------------------------------------------


class TenantSerializer(serializers.ModelSerializer):
    parent_slug = serializers.SlugRelatedField(source="parent", slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "kind", "parent", "parent_slug", "depth", "description", "created_at"]
        read_only_fields = fields


class TenantCreateSerializer(StrictInputSerializer):
    name = serializers.CharField(max_length=100)
    slug = serializers.SlugField(max_length=100)
    kind = serializers.ChoiceField(choices=TenantKind.choices, default=TenantKind.TEAM)
    parent = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_ID, help_text="id of the parent"
    )
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class TenantUpdateSerializer(StrictInputSerializer):
    name = serializers.CharField(max_length=100, required=False)
    kind = serializers.ChoiceField(choices=TenantKind.choices, required=False)
    description = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    parent = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_ID,
        help_text="move under this tenant (null: to the top level)",
    )


# --- memberships ------------------------------------------------------------------------------------------


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    tenant_slug = serializers.CharField(source="tenant.slug", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "user", "username", "tenant", "tenant_slug", "role", "created_at"]
        read_only_fields = fields


class MembershipCreateSerializer(StrictInputSerializer):
    tenant = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    user = serializers.IntegerField(
        min_value=1, max_value=MAX_ID, required=False, help_text="user id (or give username)"
    )
    username = serializers.CharField(max_length=150, required=False)
    role = serializers.ChoiceField(choices=MembershipRole.choices, default=MembershipRole.MEMBER)

    def validate(self, attrs: dict) -> dict:
        if ("user" in attrs) == ("username" in attrs):
            raise serializers.ValidationError({"user": ["Give exactly one of 'user' (an id) or 'username'."]})
        return attrs


class MembershipUpdateSerializer(StrictInputSerializer):
    role = serializers.ChoiceField(choices=MembershipRole.choices)


# --- users ------------------------------------------------------------------------------------------------


class UserSerializer(serializers.ModelSerializer):
    class Meta:
        model = User
        fields = [
            "id",
            "username",
            "email",
            "first_name",
            "last_name",
            "platform_role",
            "is_active",
            "date_joined",
            "last_login",
        ]
        read_only_fields = fields


class UserCreateSerializer(StrictInputSerializer):
    username = serializers.RegexField(r"^[\w.@+-]+\Z", max_length=150)
    email = serializers.EmailField(required=False, allow_blank=True, default="")
    first_name = serializers.CharField(required=False, allow_blank=True, default="", max_length=150)
    last_name = serializers.CharField(required=False, allow_blank=True, default="", max_length=150)
    password = serializers.CharField(
        required=False,
        allow_null=True,
        default=None,
        write_only=True,
        max_length=256,
        help_text="omit for a single-sign-on-only account",
    )
    platform_role = serializers.ChoiceField(choices=PlatformRole.choices, required=False, default=PlatformRole.NONE)


class UserUpdateSerializer(StrictInputSerializer):
    email = serializers.EmailField(required=False, allow_blank=True)
    first_name = serializers.CharField(required=False, allow_blank=True, max_length=150)
    last_name = serializers.CharField(required=False, allow_blank=True, max_length=150)
    is_active = serializers.BooleanField(required=False)
    platform_role = serializers.ChoiceField(choices=PlatformRole.choices, required=False)


class PasswordSerializer(StrictInputSerializer):
    password = serializers.CharField(write_only=True, max_length=256)


class MfaResetResultSerializer(serializers.Serializer):
    removed = serializers.IntegerField()


# --- tokens -----------------------------------------------------------------------------------------------


class ApiTokenSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "user",
            "username",
            "key_prefix",
            "scope",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "active",
        ]
        read_only_fields = fields

    def get_active(self, token: ApiToken) -> bool:
        from django.utils import timezone

        return token.revoked_at is None and token.expires_at > timezone.now()


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    secret = serializers.CharField(read_only=True, help_text="shown only in this response; store it now")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class ApiTokenCreateSerializer(StrictInputSerializer):
    name = serializers.CharField(max_length=100)
    scope = serializers.ChoiceField(choices=TokenScope.choices, default=TokenScope.READ)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


# --- me ---------------------------------------------------------------------------------------------------


class MeMembershipSerializer(serializers.Serializer):
    tenant = serializers.IntegerField(source="tenant_id")
    tenant_slug = serializers.CharField(source="tenant.slug")
    role = serializers.CharField()


class MeSerializer(serializers.ModelSerializer):
    memberships = MeMembershipSerializer(many=True, read_only=True)
    mfa_enrolled = serializers.SerializerMethodField()

    class Meta:
        model = User
        fields = ["id", "username", "email", "first_name", "last_name", "platform_role", "memberships", "mfa_enrolled"]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField())
    def get_mfa_enrolled(self, user: User) -> bool:
        return user_has_device(user, confirmed=True)
