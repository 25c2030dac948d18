"""Fleet API: bootstrap tokens and node credentials (system admins), agent registration (agents), and the
stored telemetry of the cards a person may watch (the minute rollups the console's charts open with)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.api import PermissionDeniedError
from kernel.policy import Action
from scheduler.fleet import selectors
from scheduler.fleet.api.serializers import (
    BootstrapTokenCreateInput,
    BootstrapTokenOutput,
    DeviceRehomeInput,
    DeviceRehomeOutput,
    FleetNodeOutput,
    RegisterInput,
    RegisterOutput,
    TelemetryHistoryOutput,
    TelemetryHistoryQuery,
)
from scheduler.fleet.services.enrolment import (
    agent_register,
    bootstrap_token_create,
    credential_authenticate,
    node_credentials_revoke,
)
from scheduler.fleet.services.inventory import device_rehome
from scheduler.models import Device, Node
from scheduler.services.outputs import job_output_store


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


class NodeRevokeView(APIView):
    policy_actions = {"post": Action.FLEET_MANAGE}

    @extend_schema(request=None, responses={200: dict})
    def post(self, request: Request, pk: int) -> Response:
        node = get_object_or_404(Node, pk=pk)
        self.check_object_permissions(request, node)
        revoked = node_credentials_revoke(actor=request.user, node=node, request=request)
        return Response({"node_id": node.pk, "revoked": revoked})


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


class FleetNodeListView(generics.ListAPIView):
    policy_actions = {"get": Action.FLEET_VIEW}
    serializer_class = FleetNodeOutput

    def get_queryset(self):
        return selectors.nodes_for_fleet()


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
