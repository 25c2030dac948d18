"""Serializers of the tenants API: output shapes, and strict input shapes (unknown keys are a 400)."""

from __future__ import annotations

from typing import Any

from django_otp import user_has_device
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from catalog.models import FlavorPrice
from kernel.access_rules import TOKEN_SCOPE, Action
from kernel.filters import MAX_ID
from kernel.serializers import JsonTypedSerializer
from tenants.access import token_allows
from tenants.approval_chain import chain_plan
from tenants.models import (
    QUOTA_FIELDS,
    ApiToken,
    ApprovalRequest,
    ApprovalStep,
    ApprovalStepRole,
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


class StrictInputSerializer(JsonTypedSerializer):
    """An input serializer that refuses keys it does not know, so a typo (``guaranted_millis``) is an error
    rather than a silently ignored field, and JSON values of another type than the schema documents."""

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
        fields = [
            "id",
            "name",
            "slug",
            "kind",
            "parent",
            "parent_slug",
            "depth",
            "description",
            "job_approval_threshold_millis",
            "created_at",
        ]
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


@extend_schema_field(
    {
        "oneOf": [{"type": "string", "format": "email"}, {"type": "string", "maxLength": 0}],
        "description": 'an email address, or "" when the account has none',
    }
)
class OptionalEmailField(serializers.EmailField):
    """An account's email as stored: an address or blank (the schema's plain ``format: email`` refused "")."""


class UserSerializer(serializers.ModelSerializer):
    email = OptionalEmailField(read_only=True)

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


class MeTokenSerializer(serializers.ModelSerializer):
    """The token a request was made with, so that a client can say after ``login`` what it may do: its scope,
    and whether that scope submits jobs — a read token made by accepting a default could not, and nothing said
    so until the first submit was refused."""

    submits_jobs = serializers.SerializerMethodField(
        help_text="whether this token's scope lets it submit and cancel jobs (your roles decide the rest)"
    )
    submit_scope = serializers.SerializerMethodField(help_text="the scope a token needs to submit and cancel jobs")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "key_prefix", "scope", "expires_at", "submits_jobs", "submit_scope"]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField())
    def get_submits_jobs(self, token: ApiToken) -> bool:
        return token_allows(token, Action.JOB_SUBMIT) and token_allows(token, Action.JOB_MANAGE)

    # A plain string in the schema: a second choice field of the scopes would make the schema name the same
    # enum twice (ScopeEnum, SubmitScopeEnum).
    @extend_schema_field(serializers.CharField())
    def get_submit_scope(self, token: ApiToken) -> str:
        return str(TOKEN_SCOPE[Action.JOB_SUBMIT])


class MeSerializer(serializers.ModelSerializer):
    memberships = MeMembershipSerializer(many=True, read_only=True)
    email = OptionalEmailField(read_only=True)
    mfa_enrolled = serializers.SerializerMethodField()
    token = serializers.SerializerMethodField(
        help_text="the API token this request was made with; null for a console session"
    )

    class Meta:
        model = User
        fields = [
            "id",
            "username",
            "email",
            "first_name",
            "last_name",
            "platform_role",
            "memberships",
            "mfa_enrolled",
            "token",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField())
    def get_mfa_enrolled(self, user: User) -> bool:
        return user_has_device(user, confirmed=True)

    @extend_schema_field(MeTokenSerializer(allow_null=True))
    def get_token(self, user: User) -> dict[str, Any] | None:
        request = self.context.get("request")
        token = getattr(request, "auth", None)
        return MeTokenSerializer(token).data if isinstance(token, ApiToken) else None


# --- quotas -----------------------------------------------------------------------------------------------


def _millis_field(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=10**9, **kwargs)


class QuotaSerializer(serializers.ModelSerializer):
    tenant_slug = serializers.CharField(source="tenant.slug", read_only=True)
    flavor_name = serializers.CharField(source="flavor.name", read_only=True)

    class Meta:
        model = Quota
        fields = ["id", "tenant", "tenant_slug", "flavor", "flavor_name", *QUOTA_FIELDS, "updated_at"]
        read_only_fields = fields


class QuotaValuesSerializer(StrictInputSerializer):
    guaranteed_millis = _millis_field(required=False)
    limit_millis = _millis_field(required=False, allow_null=True)
    lending_limit_millis = _millis_field(required=False, allow_null=True)
    guaranteed_memory_mib = serializers.IntegerField(min_value=0, max_value=2**53, required=False)
    max_running_jobs = serializers.IntegerField(min_value=0, max_value=10**6, required=False, allow_null=True)


class QuotaSetSerializer(QuotaValuesSerializer):
    tenant = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    flavor = serializers.SlugField(max_length=64, help_text="flavor name, e.g. nvidia-h100-80g")


class ThresholdSerializer(StrictInputSerializer):
    threshold_millis = serializers.IntegerField(
        min_value=0, max_value=10**9, allow_null=True, help_text="null: inherit from the parent / the setting"
    )


# --- approvals --------------------------------------------------------------------------------------------


class ApprovalStepSerializer(serializers.ModelSerializer):
    actor_username = serializers.CharField(source="actor.username", read_only=True, default=None, allow_null=True)

    class Meta:
        model = ApprovalStep
        fields = ["step", "role", "actor", "actor_username", "decision", "comment", "created_at"]
        read_only_fields = fields


class ApprovalPlanStepSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    role = serializers.ChoiceField(choices=ApprovalStepRole.choices)
    state = serializers.ChoiceField(choices=["done", "awaiting", "upcoming"])
    approvers = serializers.ListField(child=serializers.CharField(), help_text="usernames who may decide this step")


class ApprovalSerializer(serializers.ModelSerializer):
    tenant_slug = serializers.CharField(source="tenant.slug", read_only=True)
    flavor_name = serializers.CharField(source="flavor.name", read_only=True, default=None, allow_null=True)
    requester_username = serializers.CharField(
        source="requester.username", read_only=True, default=None, allow_null=True
    )
    awaiting_role = serializers.CharField(read_only=True, allow_null=True)
    job = serializers.IntegerField(
        source="job_id", read_only=True, allow_null=True, help_text="The job waiting for admission (job_admission)."
    )
    steps = ApprovalStepSerializer(many=True, read_only=True)
    plan = serializers.SerializerMethodField(
        help_text="Each step of the chain with its state (done, awaiting, upcoming) and the users who may decide it."
    )

    @extend_schema_field(ApprovalPlanStepSerializer(many=True))
    def get_plan(self, approval: ApprovalRequest) -> list[dict]:
        return chain_plan(approval)

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "kind",
            "status",
            "tenant",
            "tenant_slug",
            "flavor",
            "flavor_name",
            "job",
            "requester",
            "requester_username",
            "payload",
            "reason",
            "chain",
            "escalations",
            "plan",
            "step",
            "awaiting_role",
            "result_message",
            "created_at",
            "updated_at",
            "expires_at",
            "decided_at",
            "steps",
        ]
        read_only_fields = fields


class QuotaChangeRequestSerializer(QuotaValuesSerializer):
    tenant = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    flavor = serializers.SlugField(max_length=64)
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class DecisionSerializer(StrictInputSerializer):
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class ResubmitSerializer(StrictInputSerializer):
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    values = QuotaValuesSerializer(required=False)


# --- notifications, prices, usage --------------------------------------------------------------------------


class NotificationDeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = NotificationDelivery
        fields = [
            "id",
            "approval",
            "event",
            "notifier",
            "recipients",
            "subject",
            "status",
            "attempts",
            "last_error",
            "created_at",
            "updated_at",
            "sent_at",
        ]
        read_only_fields = fields


class FlavorPriceSerializer(serializers.ModelSerializer):
    flavor_name = serializers.CharField(source="flavor.name", read_only=True)

    class Meta:
        model = FlavorPrice
        fields = ["id", "flavor", "flavor_name", "price_per_device_hour", "currency"]
        read_only_fields = fields


class FlavorPriceSetSerializer(StrictInputSerializer):
    flavor = serializers.SlugField(max_length=64)
    price_per_device_hour = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0)
    currency = serializers.RegexField(r"^[A-Za-z]{3}\Z", required=False, default="CNY")
