"""Fleet API: bootstrap tokens and node credentials (system admins), agent registration (agents)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler.fleet import selectors, services
from scheduler.fleet.api.serializers import (
    BootstrapTokenCreateInput,
    BootstrapTokenOutput,
    DeviceRehomeInput,
    DeviceRehomeOutput,
    FleetNodeOutput,
    RegisterInput,
    RegisterOutput,
)
from scheduler.models import Device, Node


class IsSystemAdmin(BasePermission):
    message = "Only a system admin manages node agents."

    def has_permission(self, request, view) -> bool:
        return selectors.is_telemetry_admin(request.user)


class BootstrapTokenCreateView(APIView):
    permission_classes = [IsSystemAdmin]

    @extend_schema(request=BootstrapTokenCreateInput, responses={201: BootstrapTokenOutput})
    def post(self, request: Request) -> Response:
        data = BootstrapTokenCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        token, secret = services.bootstrap_token_create(
            actor=request.user,
            ttl_s=data.validated_data.get("ttl_s"),
            description=data.validated_data["description"],
            request=request,
        )
        body = {"id": token.pk, "token": secret, "prefix": token.prefix, "expires_at": token.expires_at}
        return Response(BootstrapTokenOutput(body).data, status=status.HTTP_201_CREATED)


class RegisterView(APIView):
    """An agent trades a bootstrap token for its node credential. No session: the token is the proof."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(request=RegisterInput, responses={201: RegisterOutput})
    def post(self, request: Request) -> Response:
        data = RegisterInput(data=request.data)
        data.is_valid(raise_exception=True)
        node, credential = services.agent_register(**data.validated_data, request=request)
        body = {"node_id": node.pk, "node_name": node.name, "credential": credential, "ws_url": "/ws/agent/"}
        return Response(RegisterOutput(body).data, status=status.HTTP_201_CREATED)


class NodeRevokeView(APIView):
    permission_classes = [IsSystemAdmin]

    @extend_schema(request=None, responses={200: dict})
    def post(self, request: Request, pk: int) -> Response:
        node = get_object_or_404(Node, pk=pk)
        revoked = services.node_credentials_revoke(actor=request.user, node=node, request=request)
        return Response({"node_id": node.pk, "revoked": revoked})


class DeviceRehomeView(APIView):
    """A system admin gives a card that really moved to its new node (a hello claiming it is refused until then)."""

    permission_classes = [IsSystemAdmin]
    required_scope = "admin"

    @extend_schema(request=DeviceRehomeInput, responses={200: DeviceRehomeOutput})
    def post(self, request: Request, pk: int) -> Response:
        data = DeviceRehomeInput(data=request.data)
        data.is_valid(raise_exception=True)
        device = get_object_or_404(Device.objects.select_related("node"), pk=pk)
        node = get_object_or_404(Node, name=data.validated_data["node"])
        device = services.device_rehome(actor=request.user, device=device, node=node, request=request)
        body = {"id": device.pk, "uuid": device.uuid, "node": node.name, "index": device.index}
        return Response(DeviceRehomeOutput(body).data)


class FleetNodeListView(generics.ListAPIView):
    permission_classes = [IsSystemAdmin]
    serializer_class = FleetNodeOutput

    def get_queryset(self):
        return selectors.nodes_for_fleet()
