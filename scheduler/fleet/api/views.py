"""Fleet API: the one Node API (``/api/v1/nodes/``), bootstrap tokens and node credentials (system admins), agent
registration (agents), and the
stored telemetry of the cards a person may watch (the minute rollups the console's charts open with)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.access_rules import Action
from kernel.api import PermissionDeniedError
from scheduler import selectors as scheduler_selectors
from scheduler.filtersets import NodeFilterSet
from scheduler.fleet import selectors
from scheduler.fleet.api.serializers import (
    BootstrapTokenCreateInput,
    BootstrapTokenOutput,
    DeviceRehomeInput,
    DeviceRehomeOutput,
    NodeDrainSerializer,
    NodeRevokeOutput,
    NodeSerializer,
    NodeWithAgentSerializer,
    RegisterInput,
    RegisterOutput,
    TelemetryHistoryOutput,
    TelemetryHistoryQuery,
)
from scheduler.fleet.models import Device, Node
from scheduler.fleet.services.enrolment import (
    agent_register,
    bootstrap_token_create,
    credential_authenticate,
    node_credentials_revoke,
)
from scheduler.fleet.services.inventory import device_rehome
from scheduler.fleet.services.nodes import node_cordon, node_drain, node_uncordon
from scheduler.services.outputs import job_output_store
from tenants.access import allows
from tenants.models import ApiToken


class BootstrapTokenCreateView(APIView):
    policy_actions = {"post": Action.FLEET_MANAGE}

    @extend_schema(request=BootstrapTokenCreateInput, responses={201: BootstrapTokenOutput})
    def post(self, request: Request) -> Response:
        data = BootstrapTokenCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        token, secret = bootstrap_token_create(
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
    policy_actions = {"post": Action.AGENT_REGISTER}

    @extend_schema(request=RegisterInput, responses={201: RegisterOutput})
    def post(self, request: Request) -> Response:
        data = RegisterInput(data=request.data)
        data.is_valid(raise_exception=True)
        node, credential = agent_register(**data.validated_data, request=request)
        body = {"node_id": node.pk, "node_name": node.name, "credential": credential, "ws_url": "/ws/agent/"}
        return Response(RegisterOutput(body).data, status=status.HTTP_201_CREATED)


class DeviceRehomeView(APIView):
    """A system admin gives a card that really moved to its new node (a hello claiming it is refused until then)."""

    policy_actions = {"post": Action.FLEET_MANAGE}

    @extend_schema(request=DeviceRehomeInput, responses={200: DeviceRehomeOutput})
    def post(self, request: Request, pk: int) -> Response:
        data = DeviceRehomeInput(data=request.data)
        data.is_valid(raise_exception=True)
        device = get_object_or_404(Device.objects.select_related("node"), pk=pk)
        self.check_object_permissions(request, device)
        node = get_object_or_404(Node, name=data.validated_data["node"])
        device = device_rehome(actor=request.user, device=device, node=node, request=request)
        body = {"id": device.pk, "uuid": device.uuid, "node": node.name, "index": device.index}
        return Response(DeviceRehomeOutput(body).data)


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The one Node API: nodes and their state for everyone (capacity is shared); their agents' hosts and
    connections for those who may read node agents (``fleet.view``). System admins cordon, drain, uncordon and
    revoke a node's credentials.

    ``/api/v1/agents/nodes/`` and ``/api/v1/agents/nodes/<id>/revoke/`` are the same view under the older
    paths, kept for clients written against them (the list there still asks ``fleet.view``)."""

    serializer_class = NodeSerializer
    filterset_class = NodeFilterSet
    policy_actions = {
        "list": Action.NODE_VIEW,
        "retrieve": Action.NODE_VIEW,
        "cordon": Action.NODE_OPERATE,
        "drain": Action.NODE_OPERATE,
        "uncordon": Action.NODE_OPERATE,
        "revoke": Action.FLEET_MANAGE,
    }

    def get_queryset(self):
        return scheduler_selectors.nodes_visible_to(self.request.user)

    def get_serializer_class(self):
        token = self.request.auth if isinstance(self.request.auth, ApiToken) else None
        if allows(self.request.user, Action.FLEET_VIEW, token=token):
            return NodeWithAgentSerializer
        return NodeSerializer

    def _respond(self, node: Node) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(request=None, responses={200: NodeWithAgentSerializer})
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: str) -> Response:
        return self._respond(node_cordon(node=self.get_object(), actor=request.user))

    @extend_schema(request=NodeDrainSerializer, responses={200: NodeWithAgentSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str) -> Response:
        data = NodeDrainSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node = node_drain(node=self.get_object(), actor=request.user, grace_s=data.validated_data["grace_s"])
        return self._respond(node)

    @extend_schema(request=None, responses={200: NodeWithAgentSerializer})
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: str) -> Response:
        return self._respond(node_uncordon(node=self.get_object(), actor=request.user))

    @extend_schema(request=None, responses={200: NodeRevokeOutput})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        """Revoke the node's credentials and close its agent's live socket (code 4401)."""
        node = self.get_object()
        revoked = node_credentials_revoke(actor=request.user, node=node, request=request)
        return Response(NodeRevokeOutput({"node_id": node.pk, "revoked": revoked}).data)


class TelemetryHistoryView(APIView):
    """The last minutes of stored telemetry (minute rollups) of the cards the caller may watch live: every card
    for a system admin, the cards their tenants hold now (from when the holding began) for tenant users."""

    policy_actions = {"get": Action.TELEMETRY_VIEW}
    #: Wall clock; tests replace it.
    clock = staticmethod(timezone.now)

    @extend_schema(
        operation_id="telemetry_history",
        summary="Minute rollups of the cards you may watch (the history a live chart opens with)",
        parameters=[TelemetryHistoryQuery],
        responses={200: TelemetryHistoryOutput},
    )
    def get(self, request: Request) -> Response:
        view = selectors.telemetry_view_for(request.user)
        if view is None:
            raise PermissionDeniedError(
                "You may watch no telemetry: tenant users see the cards their tenants' jobs hold, system admins "
                "every card."
            )
        query = TelemetryHistoryQuery(
            data={**request.query_params.dict(), "device": request.query_params.getlist("device")}
        )
        unknown = sorted(set(request.query_params) - set(query.fields) - {"format"})
        if unknown:
            raise ValidationError({unknown[0]: [f"is not a parameter here; accepted: {', '.join(query.fields)}."]})
        query.is_valid(raise_exception=True)
        options = query.validated_data
        now = self.clock()
        body: dict = {"minutes": options["minutes"], "until": now}
        if options["by"] == "flavor":
            body["flavors"] = selectors.telemetry_history_by_flavor(view=view, now=now, minutes=options["minutes"])
        else:
            body["devices"] = selectors.telemetry_history(
                view=view,
                now=now,
                minutes=options["minutes"],
                node_id=options.get("node"),
                uuids=options.get("device") or None,
            )
        return Response(body)


class OutputUploadView(APIView):
    """A node agent uploads the packed output dir of a replica it ran (``PUT``, ``application/gzip``, the body's
    sha256 in ``X-Content-Sha256``); its node credential is the proof (``Authorization: Bearer gpn_…``)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    policy_actions = {"put": Action.AGENT_UPLOAD}
    parser_classes: list = []

    def get_authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="gpupool-agent"'  # a missing or bad credential is a 401, as an agent expects

    @extend_schema(request=None, responses={201: dict, 401: dict, 404: dict})
    def put(self, request: Request, job_id: int, replica: int) -> Response:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        credential = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
        row = credential_authenticate(credential=credential, peer=request.META.get("REMOTE_ADDR", ""))
        if row is None:
            raise AuthenticationFailed(
                "A node credential is required (Authorization: Bearer gpn_...).", code="invalid_credential"
            )
        output = job_output_store(
            node=row.node,
            job_id=job_id,
            replica=replica,
            stream=request,
            sha256=request.META.get("HTTP_X_CONTENT_SHA256", ""),
        )
        return Response(
            {"job": job_id, "replica": replica, "size_bytes": output.size_bytes, "sha256": output.sha256},
            status=status.HTTP_201_CREATED,
        )
