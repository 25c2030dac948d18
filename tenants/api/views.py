"""REST endpoints for tenants, memberships, users, API tokens and ``me``.

Reads are generic views over the selectors (so anything outside the caller's view is a 404); writes take a
strict input serializer and call one service.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from catalog.models import FlavorPrice, ResourceFlavor
from kernel.access_rules import Action
from kernel.api import NotFoundError, PermissionDeniedError
from tenants import messages as tenants_messages
from tenants import selectors
from tenants.api import serializers as s
from tenants.filtersets import (
    ApiTokenFilterSet,
    ApprovalFilterSet,
    MembershipFilterSet,
    NotificationFilterSet,
    QuotaFilterSet,
    TenantFilterSet,
    UserFilterSet,
)
from tenants.models import ApiToken, Membership, Quota, TenantStorageUsage, User
from tenants.permissions import can_manage_memberships
from tenants.services import admissions, approvals, identity, memberships, notifications, quotas, tenancy, tokens

ERROR = OpenApiResponse(description='Error: {"code": "...", "detail": "..."}')
ERRORS = {400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR}


def _validated(serializer_class: type, request: Request, **kwargs: Any) -> dict:
    serializer = serializer_class(data=request.data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class PolicyViewSet(viewsets.GenericViewSet):
    """A viewset of tenant-scoped objects: fetched through a selector (404 outside what the caller may read),
    then held to the policy's rule for the request's action (403)."""

    policy_hides_objects = True

    def _checked(self, obj: Any) -> Any:
        self.check_object_permissions(self.request, obj)
        return obj


@extend_schema_view(
    list=extend_schema(summary="Tenants visible to you", responses={200: s.TenantSerializer(many=True)}),
    retrieve=extend_schema(summary="One tenant", responses={200: s.TenantSerializer, **ERRORS}),
)
class TenantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PolicyViewSet):
    serializer_class = s.TenantSerializer
    policy_actions = {
        "list": Action.TENANT_VIEW,
        "retrieve": Action.TENANT_VIEW,
        "subtree": Action.TENANT_VIEW,
        "create": Action.TENANT_CREATE,
        # A move is decided in the service, one level up (tenant.move); renaming needs tenant.change.
        "partial_update": Action.TENANT_CHANGE,
        "destroy": Action.TENANT_DELETE,
    }
    policy_body_object = ("create",)  # the parent
    filterset_class = TenantFilterSet
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return selectors.tenants_visible_to(self.request.user).order_by("depth", "slug")

    def get_object(self):
        return self._checked(selectors.tenant_get_visible(user=self.request.user, pk=self.kwargs["pk"]))

    @extend_schema(
        summary="Create a tenant (top level: system admin; child: tenant admin of the parent)",
        request=s.TenantCreateSerializer,
        responses={201: s.TenantSerializer, **ERRORS},
    )
    def create(self, request: Request) -> Response:
        data = _validated(s.TenantCreateSerializer, request)
        parent_id = data.pop("parent", None)
        parent = selectors.tenant_get_visible(user=request.user, pk=parent_id) if parent_id else None
        tenant = tenancy.tenant_create(actor=request.user, parent=parent, request=request, **data)
        return Response(s.TenantSerializer(tenant).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Rename, describe or move a tenant (parent: new parent id, null = top level)",
        request=s.TenantUpdateSerializer,
        responses={200: s.TenantSerializer, **ERRORS},
    )
    def partial_update(self, request: Request, pk: str) -> Response:
        # Every tenant the request names is looked up before any rule is applied: an unseen new parent is a
        # 404 whatever the caller's role, like the tenant itself.
        tenant = selectors.tenant_get_visible(user=request.user, pk=pk)
        data = _validated(s.TenantUpdateSerializer, request)
        if "parent" in data:
            parent_id = data.pop("parent")
            data["parent"] = selectors.tenant_get_visible(user=request.user, pk=parent_id) if parent_id else None
        self._checked(tenant)
        tenant = tenancy.tenant_update(actor=request.user, tenant=tenant, request=request, **data)
        return Response(s.TenantSerializer(tenant).data)

    @extend_schema(summary="Delete an empty tenant", responses={204: None, 409: ERROR, **ERRORS})
    def destroy(self, request: Request, pk: str) -> Response:
        tenancy.tenant_delete(actor=request.user, tenant=self.get_object(), request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(summary="The tenant and everything below it", responses={200: s.TenantSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def subtree(self, request: Request, pk: str) -> Response:
        tenant = self.get_object()
        queryset = self.filter_queryset(selectors.tenant_subtree(tenant).order_by("depth", "slug"))
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(s.TenantSerializer(page, many=True).data)


@extend_schema_view(
    list=extend_schema(
        summary="Memberships in tenants visible to you", responses={200: s.MembershipSerializer(many=True)}
    ),
    retrieve=extend_schema(summary="One membership", responses={200: s.MembershipSerializer, **ERRORS}),
)
class MembershipViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PolicyViewSet):
    serializer_class = s.MembershipSerializer
    policy_actions = {
        "list": Action.MEMBERSHIP_VIEW,
        "retrieve": Action.MEMBERSHIP_VIEW,
        "create": Action.MEMBERSHIP_MANAGE,
        "partial_update": Action.MEMBERSHIP_MANAGE,
        "destroy": Action.MEMBERSHIP_MANAGE,
    }
    policy_body_object = ("create",)  # the tenant
    filterset_class = MembershipFilterSet
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return selectors.memberships_visible_to(self.request.user).order_by("tenant__slug", "user__username")

    def get_object(self) -> Membership:
        try:
            return self._checked(self.get_queryset().get(pk=selectors.parse_id(self.kwargs["pk"])))
        except Membership.DoesNotExist:
            raise NotFoundError(f"No membership with id {self.kwargs['pk']} is visible to you.") from None

    @extend_schema(
        summary="Add a user to a tenant (security admin, or tenant admin of the tenant)",
        request=s.MembershipCreateSerializer,
        responses={201: s.MembershipSerializer, **ERRORS},
    )
    def create(self, request: Request) -> Response:
        data = _validated(s.MembershipCreateSerializer, request)
        tenant = selectors.tenant_get_visible(user=request.user, pk=data["tenant"])
        if not can_manage_memberships(request.user, tenant):
            # Checked before the user lookup so that non-admins learn nothing about which usernames exist.
            raise PermissionDeniedError(tenants_messages.ONLY_TENANT_ADMIN_MAY_ADD(tenant=tenant.slug))
        lookup = {"pk": data["user"]} if "user" in data else {"username": data["username"]}
        user = User.objects.filter(is_active=True, **lookup).first()
        if user is None:
            # The same answer as for an account that cannot be added (services.cannot_add_member).
            raise memberships.cannot_add_member()
        membership = memberships.membership_create(
            actor=request.user, user=user, tenant=tenant, role=data["role"], request=request
        )
        return Response(s.MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Change a member's role",
        request=s.MembershipUpdateSerializer,
        responses={200: s.MembershipSerializer, **ERRORS},
    )
    def partial_update(self, request: Request, pk: str) -> Response:
        membership = self.get_object()
        data = _validated(s.MembershipUpdateSerializer, request)
        membership = memberships.membership_update(
            actor=request.user, membership=membership, role=data["role"], request=request
        )
        return Response(s.MembershipSerializer(membership).data)

    @extend_schema(summary="Remove a member", responses={204: None, **ERRORS})
    def destroy(self, request: Request, pk: str) -> Response:
        memberships.membership_delete(actor=request.user, membership=self.get_object(), request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    list=extend_schema(summary="Accounts visible to you", responses={200: s.UserSerializer(many=True)}),
    retrieve=extend_schema(summary="One account", responses={200: s.UserSerializer, **ERRORS}),
)
class UserViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PolicyViewSet):
    """Accounts and platform roles; changes are the security admin's (with an admin-scoped token)."""

    serializer_class = s.UserSerializer
    filterset_class = UserFilterSet
    http_method_names = ["get", "post", "patch", "head", "options"]
    policy_actions = {
        "list": Action.USER_VIEW,
        "retrieve": Action.USER_VIEW,
        "create": Action.USER_MANAGE,
        "partial_update": Action.USER_MANAGE,  # and user.platform_role for a role change (the service)
        "set_password": Action.USER_SET_PASSWORD,
        "mfa_reset": Action.USER_MANAGE,
    }

    def get_queryset(self):
        return selectors.users_visible_to(self.request.user)

    def get_object(self) -> User:
        return self._checked(selectors.user_get_visible(user=self.request.user, pk=self.kwargs["pk"]))

    @extend_schema(
        summary="Create an account (security admin)",
        request=s.UserCreateSerializer,
        responses={201: s.UserSerializer, **ERRORS},
    )
    def create(self, request: Request) -> Response:
        data = _validated(s.UserCreateSerializer, request)
        user = identity.user_create(actor=request.user, request=request, **data)
        return Response(s.UserSerializer(user).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Change an account or its platform role (security admin)",
        request=s.UserUpdateSerializer,
        responses={200: s.UserSerializer, **ERRORS},
    )
    def partial_update(self, request: Request, pk: str) -> Response:
        user = self.get_object()
        data = _validated(s.UserUpdateSerializer, request)
        role = data.pop("platform_role", None)
        if data or role is None:
            user = identity.user_update(actor=request.user, user=user, request=request, **data)
        if role is not None:
            user = identity.user_set_platform_role(actor=request.user, user=user, platform_role=role, request=request)
        return Response(s.UserSerializer(user).data)

    @extend_schema(
        summary="Set an account's password (security admin, or yourself)",
        request=s.PasswordSerializer,
        responses={204: None, **ERRORS},
    )
    @action(detail=True, methods=["post"], url_path="set-password")
    def set_password(self, request: Request, pk: str) -> Response:
        user = self.get_object()
        data = _validated(s.PasswordSerializer, request)
        identity.user_set_password(actor=request.user, user=user, password=data["password"], request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        summary="Remove an account's two-factor devices (security admin)",
        request=None,
        responses={200: s.MfaResetResultSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"], url_path="mfa-reset")
    def mfa_reset(self, request: Request, pk: str) -> Response:
        user = self.get_object()
        removed = identity.mfa_reset(actor=request.user, user=user, request=request)
        return Response({"removed": removed})


@extend_schema_view(
    list=extend_schema(
        summary="Your API tokens (security admins: everyone's)", responses={200: s.ApiTokenSerializer(many=True)}
    ),
    retrieve=extend_schema(summary="One API token", responses={200: s.ApiTokenSerializer, **ERRORS}),
)
class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PolicyViewSet):
    serializer_class = s.ApiTokenSerializer
    filterset_class = ApiTokenFilterSet
    http_method_names = ["get", "post", "delete", "head", "options"]
    policy_actions = {
        "list": Action.TOKEN_VIEW,
        "retrieve": Action.TOKEN_VIEW,
        "create": Action.TOKEN_CREATE,
        "destroy": Action.TOKEN_REVOKE,
    }

    def get_queryset(self):
        return selectors.tokens_visible_to(self.request.user)

    def get_object(self):
        return self._checked(selectors.token_get_visible(user=self.request.user, pk=self.kwargs["pk"]))

    @extend_schema(
        summary="Create a token for yourself; the response holds its secret, shown only this once",
        request=s.ApiTokenCreateSerializer,
        responses={201: s.ApiTokenCreatedSerializer, **ERRORS},
    )
    def create(self, request: Request) -> Response:
        data = _validated(s.ApiTokenCreateSerializer, request)
        via_token = request.auth if isinstance(request.auth, ApiToken) else None
        token, secret = tokens.api_token_create(actor=request.user, via_token=via_token, request=request, **data)
        token.secret = secret
        return Response(s.ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)

    @extend_schema(summary="Revoke a token (its owner or a security admin)", responses={204: None, **ERRORS})
    def destroy(self, request: Request, pk: str) -> Response:
        token = self.get_object()
        tokens.api_token_revoke(actor=request.user, token=token, request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    policy_actions = {"get": Action.ME_VIEW}

    @extend_schema(summary="Who you are: account, platform role, memberships", responses={200: s.MeSerializer})
    def get(self, request: Request) -> Response:
        user = User.objects.prefetch_related("memberships__tenant").get(pk=request.user.pk)
        return Response(s.MeSerializer(user, context={"request": request}).data)


# --- quotas -------------------------------------------------------------------------------------------------


def _flavor(name: str):

    flavor = ResourceFlavor.objects.filter(name=name).first()
    if flavor is None:
        raise NotFoundError(f"No flavor named {name!r}.")
    return flavor


@extend_schema_view(
    list=extend_schema(summary="Quotas of the tenants visible to you", responses={200: s.QuotaSerializer(many=True)}),
    retrieve=extend_schema(summary="One quota", responses={200: s.QuotaSerializer, **ERRORS}),
)
class QuotaViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PolicyViewSet):
    serializer_class = s.QuotaSerializer
    filterset_class = QuotaFilterSet
    http_method_names = ["get", "post", "head", "options"]
    policy_actions = {"list": Action.QUOTA_VIEW, "retrieve": Action.QUOTA_VIEW, "create": Action.QUOTA_SET}
    policy_body_object = ("create",)  # the tenant

    def get_queryset(self):
        return selectors.quotas_visible_to(self.request.user)

    def get_object(self):
        found = self.get_queryset().filter(pk=selectors.parse_id(self.kwargs["pk"])).first()
        if found is None:
            raise NotFoundError(f"No quota with id {self.kwargs['pk']} is visible to you.")
        return self._checked(found)

    @extend_schema(
        summary="Set a quota directly (system admin; tenant admins use /approvals/quota-change/)",
        request=s.QuotaSetSerializer,
        responses={200: s.QuotaSerializer, **ERRORS},
    )
    def create(self, request: Request) -> Response:
        data = dict(_validated(s.QuotaSetSerializer, request))
        tenant = selectors.tenant_get_visible(user=request.user, pk=data.pop("tenant"))
        flavor = _flavor(data.pop("flavor"))
        current = Quota.objects.filter(tenant=tenant, flavor=flavor).first()
        values = {**(current.values() if current else {}), **data}
        quota = quotas.quota_set(actor=request.user, tenant=tenant, flavor=flavor, values=values, request=request)
        return Response(s.QuotaSerializer(quota).data)


class TenantStorageUsageView(APIView):
    policy_actions = {"get": Action.QUOTA_VIEW}
    policy_hides_objects = True

    @extend_schema(summary="What a tenant's part of the shared storage holds (last measured)", responses={200: dict})
    def get(self, request: Request, pk: str) -> Response:
        tenant = selectors.tenant_get_visible(user=request.user, pk=pk)
        usage = TenantStorageUsage.objects.filter(tenant=tenant).first()
        return Response(
            {
                "tenant": tenant.slug,
                "used_bytes": usage.used_bytes if usage else None,
                "files": usage.files if usage else None,
                "measured_at": usage.measured_at if usage else None,
            }
        )


class TenantApprovalThresholdView(APIView):
    policy_actions = {"post": Action.TENANT_THRESHOLD}
    policy_hides_objects = True

    @extend_schema(
        summary="Set the size above which a tenant's jobs wait for approval (system admin)",
        request=s.ThresholdSerializer,
        responses={200: s.TenantSerializer, **ERRORS},
    )
    def post(self, request: Request, pk: str) -> Response:
        tenant = selectors.tenant_get_visible(user=request.user, pk=pk)
        self.check_object_permissions(request, tenant)
        data = _validated(s.ThresholdSerializer, request)
        tenant = admissions.tenant_set_job_approval_threshold(
            actor=request.user, tenant=tenant, threshold_millis=data["threshold_millis"], request=request
        )
        return Response(s.TenantSerializer(tenant).data)


# --- approvals ----------------------------------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(
        summary="Approval requests (?awaiting_me=true: your inbox)", responses={200: s.ApprovalSerializer(many=True)}
    ),
    retrieve=extend_schema(
        summary="One approval request with its history", responses={200: s.ApprovalSerializer, **ERRORS}
    ),
)
class ApprovalViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PolicyViewSet):
    serializer_class = s.ApprovalSerializer
    filterset_class = ApprovalFilterSet
    http_method_names = ["get", "post", "head", "options"]
    policy_actions = {
        "list": Action.APPROVAL_VIEW,
        "retrieve": Action.APPROVAL_VIEW,
        "quota_change": Action.QUOTA_REQUEST,
        "approve": Action.APPROVAL_DECIDE,
        "reject": Action.APPROVAL_DECIDE,
        "request_changes": Action.APPROVAL_DECIDE,
        "cancel": Action.APPROVAL_WITHDRAW,
        "resubmit": Action.APPROVAL_WITHDRAW,
    }
    policy_body_object = ("quota_change",)  # the tenant

    def get_queryset(self):
        return selectors.approvals_visible_to(self.request.user)

    def get_object(self):
        return self._checked(selectors.approval_get_visible(user=self.request.user, pk=self.kwargs["pk"]))

    @extend_schema(
        summary="Request a quota change for a tenant you administer",
        request=s.QuotaChangeRequestSerializer,
        responses={201: s.ApprovalSerializer, **ERRORS},
    )
    @action(detail=False, methods=["post"], url_path="quota-change")
    def quota_change(self, request: Request) -> Response:
        data = dict(_validated(s.QuotaChangeRequestSerializer, request))
        tenant = selectors.tenant_get_visible(user=request.user, pk=data.pop("tenant"))
        flavor = _flavor(data.pop("flavor"))
        reason = data.pop("reason", "")
        approval = approvals.quota_change_request_create(
            actor=request.user, tenant=tenant, flavor=flavor, values=data, reason=reason, request=request
        )
        return Response(s.ApprovalSerializer(approval).data, status=status.HTTP_201_CREATED)

    def _decide(self, request: Request, service, **extra: Any) -> Response:
        approval = self.get_object()
        data = _validated(s.DecisionSerializer, request)
        approval = service(actor=request.user, approval=approval, comment=data["comment"], request=request, **extra)
        return Response(s.ApprovalSerializer(approval).data)

    @extend_schema(
        summary="Approve the step the request waits for (on the last step the change is applied)",
        request=s.DecisionSerializer,
        responses={200: s.ApprovalSerializer, 409: ERROR, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str) -> Response:
        return self._decide(request, approvals.approval_approve)

    @extend_schema(
        summary="Reject (comment required)",
        request=s.DecisionSerializer,
        responses={200: s.ApprovalSerializer, 409: ERROR, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str) -> Response:
        return self._decide(request, approvals.approval_reject)

    @extend_schema(
        summary="Send back to the requester for changes (comment required)",
        request=s.DecisionSerializer,
        responses={200: s.ApprovalSerializer, 409: ERROR, **ERRORS},
    )
    @action(detail=True, methods=["post"], url_path="request-changes")
    def request_changes(self, request: Request, pk: str) -> Response:
        return self._decide(request, approvals.approval_request_changes)

    @extend_schema(
        summary="Withdraw your request",
        request=s.DecisionSerializer,
        responses={200: s.ApprovalSerializer, 409: ERROR, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        return self._decide(request, approvals.approval_cancel)

    @extend_schema(
        summary="Resubmit with changed values after changes were requested",
        request=s.ResubmitSerializer,
        responses={200: s.ApprovalSerializer, 409: ERROR, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def resubmit(self, request: Request, pk: str) -> Response:
        approval = self.get_object()
        data = _validated(s.ResubmitSerializer, request)
        approval = approvals.approval_resubmit(
            actor=request.user,
            approval=approval,
            values=dict(data.get("values") or {}),
            comment=data["comment"],
            request=request,
        )
        return Response(s.ApprovalSerializer(approval).data)


# --- notifications, prices, usage ---------------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(
        summary="Notification deliveries (platform admins)",
        responses={200: s.NotificationDeliverySerializer(many=True)},
    ),
    retrieve=extend_schema(summary="One delivery", responses={200: s.NotificationDeliverySerializer, **ERRORS}),
)
class NotificationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, PolicyViewSet):
    policy_hides_objects = False  # the platform's, not a tenant's: no rule, a 403
    serializer_class = s.NotificationDeliverySerializer
    filterset_class = NotificationFilterSet
    http_method_names = ["get", "post", "head", "options"]
    policy_actions = {
        "list": Action.NOTIFICATION_VIEW,
        "retrieve": Action.NOTIFICATION_VIEW,
        "retry": Action.NOTIFICATION_RETRY,
    }

    def get_queryset(self):
        return selectors.notifications_visible_to(self.request.user)

    def get_object(self):
        found = self.get_queryset().filter(pk=selectors.parse_id(self.kwargs["pk"])).first()
        if found is None:
            raise NotFoundError(f"No notification with id {self.kwargs['pk']} is visible to you.")
        return self._checked(found)

    @extend_schema(
        summary="Send a failed notification again",
        request=None,
        responses={200: s.NotificationDeliverySerializer, 409: ERROR, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str) -> Response:
        delivery = notifications.notification_retry(actor=request.user, delivery=self.get_object(), request=request)
        return Response(s.NotificationDeliverySerializer(delivery).data)


@extend_schema_view(
    list=extend_schema(summary="Prices per card-hour", responses={200: s.FlavorPriceSerializer(many=True)})
)
class FlavorPriceViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = s.FlavorPriceSerializer
    http_method_names = ["get", "post", "head", "options"]
    policy_actions = {"list": Action.PRICE_VIEW, "create": Action.PRICE_SET}
    queryset = FlavorPrice.objects.select_related("flavor").order_by("flavor__name")

    @extend_schema(
        summary="Set the price of a flavor's card-hour (system admin)",
        request=s.FlavorPriceSetSerializer,
        responses={200: s.FlavorPriceSerializer, **ERRORS},
    )
    def create(self, request: Request) -> Response:
        data = _validated(s.FlavorPriceSetSerializer, request)
        price = quotas.flavor_price_set(
            actor=request.user,
            flavor=_flavor(data["flavor"]),
            price_per_device_hour=data["price_per_device_hour"],
            currency=data["currency"],
            request=request,
        )
        return Response(s.FlavorPriceSerializer(price).data)
