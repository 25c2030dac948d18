"""Writes of the fleet: bootstrap tokens, registration, node credentials, inventory, lease and telemetry rollups.

Every state change is a function here, with keyword-only arguments, in a transaction, with an audit record.
Calls into the scheduler (``scheduler.services``) are guarded so the fleet works before those land.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction
from django.db.models import F, Max, Q
from django.utils import timezone
from django.utils.text import slugify

from audit.services import audit_record
from portal.api import ConflictError, DomainError, PermissionDeniedError
from scheduler.fleet.models import (
    AgentReport,
    BootstrapToken,
    NodeAgent,
    NodeCredential,
    TelemetryHour,
    TelemetryMinute,
)
from scheduler.fleet.telemetry import MinuteAggregate
from scheduler.models import AgentCommand, Allocation, Device, DeviceHealth, Node, NodeStatus, ResourceFlavor, Vendor

logger = logging.getLogger(__name__)

BOOTSTRAP_PREFIX = "gpb_"
CREDENTIAL_PREFIX = "gpn_"
MAX_TOKEN_TTL_S = 30 * 24 * 3600
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CLOSE_UNAUTHORIZED = 4401
CLOSE_REPLACED = 4409


class AuthenticationFailed(DomainError):
    code = "authentication_failed"
    status_code = 401


def agent_group(node_id: int) -> str:
    """The channel group of a node's agent socket (PROTOCOL.md: outbox events go here)."""
    return f"agent.node.{node_id}"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _request_cycle() -> None:
    # Imported here, not at the top: scheduler.services imports this module's app (the fleet) while loading.
    from scheduler.services.cycle import request_cycle

    transaction.on_commit(request_cycle)


def _group_send_on_commit(group: str, event: dict) -> None:
    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(group, event)

    transaction.on_commit(send)


# --- bootstrap tokens and registration ----------------------------------------------------------------------


@transaction.atomic
def bootstrap_token_create(
    *, actor: Any | None, ttl_s: int | None = None, description: str = "", request: Any | None = None
) -> tuple[BootstrapToken, str]:
    """Make a one-time bootstrap token valid for ``ttl_s`` seconds. Returns the row and the secret, which is
    shown to the caller this once and never stored."""
    ttl_s = settings.GPUPOOL_BOOTSTRAP_TOKEN_TTL_S if ttl_s is None else ttl_s
    if not 60 <= ttl_s <= MAX_TOKEN_TTL_S:
        raise DomainError(
            f"ttl must be between 60 seconds and {MAX_TOKEN_TTL_S // 86400} days; got {ttl_s} seconds.",
            code="invalid_ttl",
            field="ttl_s",
        )
    secret = BOOTSTRAP_PREFIX + secrets.token_urlsafe(32)
    token = BootstrapToken.objects.create(
        token_hash=_hash(secret),
        prefix=secret[:12],
        description=description[:200],
        created_by=actor if getattr(actor, "pk", None) else None,
        expires_at=timezone.now() + timedelta(seconds=ttl_s),
    )
    audit_record(
        action="agent.bootstrap_token.create",
        actor=actor,
        target=f"bootstrap_token:{token.pk}",
        details={"after": {"prefix": token.prefix, "expires_at": token.expires_at.isoformat(), "ttl_s": ttl_s}},
        request=request,
    )
    return token, secret


def _new_credential(node: Node) -> tuple[NodeCredential, str]:
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    credential = NodeCredential.objects.create(node=node, key_id=key_id, secret_hash=_hash(secret))
    return credential, f"{CREDENTIAL_PREFIX}{key_id}_{secret}"


def agent_register(
    *, token: str, node_name: str, hostname: str = "", agent_version: str = "", request: Any | None = None
) -> tuple[Node, str]:
    """Trade a valid, unused bootstrap token for a credential of node ``node_name`` (created if new).

    Registering an existing node again replaces its credentials: the old ones are revoked and its live
    socket is closed. The node stays ``not_ready`` until its agent says hello. A refused attempt is audited.
    """
    try:
        return _agent_register(
            token=token, node_name=node_name, hostname=hostname, agent_version=agent_version, request=request
        )
    except DomainError as exc:
        # Outside the failed transaction, so the refusal itself is on record.
        audit_record(
            action="agent.register",
            actor=None,
            target=f"node:{node_name}"[:200],
            outcome="failure",
            details={"reason": exc.code, "token_prefix": (token or "")[:12]},
            request=request,
        )
        raise


@transaction.atomic
def _agent_register(*, token: str, node_name: str, hostname: str, agent_version: str, request: Any | None):
    if not NODE_NAME_RE.match(node_name or ""):
        raise DomainError(
            "node_name must be 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit.",
            code="invalid_node_name",
            field="node_name",
        )
    row = BootstrapToken.objects.select_for_update().filter(token_hash=_hash(token or "")).first()
    if row is None:
        raise AuthenticationFailed(
            "The bootstrap token is not valid. Ask a system admin for a new one "
            "(gpupool agent_bootstrap_token, or POST /api/v1/agents/bootstrap-tokens/).",
            code="invalid_token",
        )
    if row.used_at is not None:
        raise AuthenticationFailed(
            "This bootstrap token was already used; tokens work once. Ask a system admin for a new one.",
            code="token_used",
        )
    now = timezone.now()
    if row.expires_at <= now:
        raise AuthenticationFailed(
            f"This bootstrap token expired at {row.expires_at:%Y-%m-%d %H:%M:%S} UTC. Ask a system admin for a "
            "new one.",
            code="token_expired",
        )
    node, created = Node.objects.get_or_create(
        name=node_name, defaults={"agent_version": agent_version[:32], "status": NodeStatus.NOT_READY}
    )
    replaced = 0
    if not created:
        replaced = NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=now)
        fields = {"agent_version": agent_version[:32]}
        if node.status == NodeStatus.READY:
            fields["status"] = NodeStatus.NOT_READY
        Node.objects.filter(pk=node.pk).update(**fields)
        node.refresh_from_db()
        if replaced:
            _group_send_on_commit(agent_group(node.pk), {"type": "agent.disconnect", "code": CLOSE_UNAUTHORIZED})
    NodeAgent.objects.update_or_create(node=node, defaults={"hostname": hostname[:255]})
    _credential, secret = _new_credential(node)
    row.used_at = now
    row.used_by_node = node
    row.save(update_fields=["used_at", "used_by_node"])
    audit_record(
        action="agent.register",
        actor=None,
        target=f"node:{node.pk}",
        details={
            "after": {"node": node.name, "hostname": hostname, "agent_version": agent_version, "new_node": created},
            "token_prefix": row.prefix,
            "credentials_replaced": replaced,
        },
        request=request,
    )
    return node, secret


@transaction.atomic
def node_credentials_revoke(*, actor: Any | None, node: Node, request: Any | None = None) -> int:
    """Revoke every active credential of ``node`` and close its live socket. Returns how many were revoked.

    The agent has to be registered again with a new bootstrap token to come back.
    """
    now = timezone.now()
    count = NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(
        revoked_at=now, revoked_by=actor if getattr(actor, "pk", None) else None
    )
    audit_record(
        action="agent.credential.revoke",
        actor=actor,
        target=f"node:{node.pk}",
        details={"node": node.name, "revoked": count},
        request=request,
    )
    _group_send_on_commit(agent_group(node.pk), {"type": "agent.disconnect", "code": CLOSE_UNAUTHORIZED})
    return count


def credential_authenticate(*, credential: str, peer: str = "") -> NodeCredential | None:
    """The active credential matching ``credential``, or None (and an audit record ``node.auth_failed``).

    The secret is compared in constant time; a revoked, replaced or forged credential is refused alike.
    """
    reason = "malformed"
    row = None
    if credential.startswith(CREDENTIAL_PREFIX):
        key_id, _, secret = credential[len(CREDENTIAL_PREFIX) :].partition("_")
        row = NodeCredential.objects.select_related("node").filter(key_id=key_id).first() if key_id else None
        if row is None:
            reason = "unknown_credential"
        elif not hmac.compare_digest(row.secret_hash, _hash(secret)):
            reason = "wrong_secret"
        elif row.revoked_at is not None:
            reason = "revoked"
        else:
            NodeCredential.objects.filter(pk=row.pk).update(last_seen_at=timezone.now())
            return row
    elif not credential:
        reason = "missing"
    audit_record(
        action="node.auth_failed",
        actor=None,
        target=f"node:{row.node_id}" if row is not None else "node:?",
        outcome="failure",
        details={"reason": reason, "peer": peer, "key_id": row.key_id if row is not None else ""},
    )
    return None


# --- inventory, lease -----------------------------------------------------------------------------------------


def _flavor_mapping() -> dict[str, str]:
    return {key.lower(): value for key, value in getattr(settings, "GPUPOOL_FLAVOR_MAP", {}).items()}


def flavor_for_device(*, vendor: str, model: str, memory_mib: int) -> ResourceFlavor:
    """The flavor of a device: an explicit mapping (``GPUPOOL_FLAVOR_MAP`` model → flavor name), else a
    flavor of the same vendor and model string with the closest memory, else a new flavor named from vendor,
    model and memory (``nvidia-h100-80gb-hbm3-80g``) that an admin may rename or merge later."""
    mapped = _flavor_mapping().get(model.lower())
    if mapped:
        flavor = ResourceFlavor.objects.filter(name=mapped).first()
        if flavor is not None:
            return flavor
    candidates = list(ResourceFlavor.objects.filter(vendor=vendor, model__iexact=model))
    if candidates:
        return min(candidates, key=lambda flavor: abs(flavor.memory_mib - memory_mib))
    gib = max(1, round(memory_mib / 1024))
    model_slug = slugify(model.lower().removeprefix(vendor.lower()).strip()) or "device"
    name = f"{slugify(vendor) or 'device'}-{model_slug}"[:58] + f"-{gib}g"
    flavor, _created = ResourceFlavor.objects.get_or_create(
        name=name,
        defaults={
            "vendor": vendor,
            "model": model[:64],
            "memory_mib": memory_mib,
            "description": "created automatically when a node reported this model",
        },
    )
    return flavor


def _vendor(value: str) -> str:
    value = (value or "").lower()
    return value if value in Vendor.values else Vendor.SIMULATED


def _device_fields(item: dict) -> dict[str, Any]:
    """Device columns from one ``hello`` device entry (names as in nodeagent.protocol.DeviceInfo)."""
    fields: dict[str, Any] = {
        "index": int(item.get("index") or 0),
        "vendor": _vendor(item.get("vendor", "")),
        "model": str(item.get("model") or "unknown")[:64],
        "memory_mib": int(item.get("memory_mib") or 0),
        "numa_node": item.get("numa_node"),
        "pci_bus_id": str(item.get("pci_bus_id") or "")[:32],
        "health": _health(item.get("health", "healthy")),
        "mig_mode": bool(item.get("mig_mode")),
    }
    for link in ("nvlink_domain", "pcie_switch"):
        if link in _DEVICE_FIELD_NAMES:
            fields[link] = str(item.get(link) or "")[:64]
    return fields


_DEVICE_FIELD_NAMES = {field.name for field in Device._meta.get_fields()}


def _health(value: str) -> str:
    value = (value or "").lower()
    return value if value in DeviceHealth.values else DeviceHealth.UNHEALTHY


class DeviceClaimRefused(DomainError):
    """A node's hello listed a device UUID that belongs to another node (:func:`node_hello`)."""

    code = "device_claimed"


def node_hello(*, node_id: int, hello: dict, now: datetime | None = None) -> dict[str, int]:
    """Apply an agent's ``hello``: node facts, device inventory (upserted by UUID), node ready.

    Devices the agent no longer reports are kept (allocations may point at them) but marked unhealthy and
    moved out of the way of index reuse. The workloads the hello lists are reconciled afterwards, in their own
    transactions (:func:`node_workloads_reconcile`): jobs are locked before nodes, never after. Returns device
    UUID → device id.

    A device belongs to the node that first reported it. A hello that lists a UUID another node owns — a stolen
    node credential replaying a card that every tenant could read, or a card moved between machines without
    telling the portal — is refused whole with :class:`DeviceClaimRefused` (the consumer answers an ``error``
    frame, the node stays not ready): nothing moves, the owner is unaffected, and a ``node.device_claim_refused``
    record is committed. A system admin moves a card that really moved with :func:`device_rehome`.
    """
    outcome = _node_hello(node_id=node_id, hello=hello, now=now)
    if isinstance(outcome, DeviceClaimRefused):
        raise outcome  # after the refusal's audit record committed
    return outcome


@transaction.atomic
def _node_hello(*, node_id: int, hello: dict, now: datetime | None) -> dict[str, int] | DeviceClaimRefused:
    now = now or timezone.now()
    reported = [device for device in hello.get("devices") or [] if isinstance(device, dict) and device.get("uuid")]
    reported_uuids = {str(device["uuid"])[:96] for device in reported}
    # The project's lock order: device rows (in primary-key order) before the node row; FOR NO KEY UPDATE, so
    # the foreign-key checks of allocations inserted meanwhile never wait on either.
    locked = list(
        Device.objects.select_for_update(of=("self",), no_key=True)
        .filter(Q(node_id=node_id) | Q(uuid__in=reported_uuids))
        .order_by("pk")
        .values_list("pk", "uuid", "node_id")
    )
    claimed = sorted((uuid, owner) for _pk, uuid, owner in locked if owner != node_id and uuid in reported_uuids)
    if claimed:
        owners = dict(Node.objects.filter(pk__in={owner for _uuid, owner in claimed}).values_list("pk", "name"))
        audit_record(
            action="node.device_claim_refused",
            actor=None,
            target=f"node:{node_id}",
            details={"devices": [{"uuid": uuid, "owner": owners.get(owner, owner)} for uuid, owner in claimed]},
        )
        logger.warning("node %s claimed devices of other nodes: %s; hello refused", node_id, claimed)
        named = ", ".join(f"{uuid} (node {owners.get(owner, owner)})" for uuid, owner in claimed[:5])
        return DeviceClaimRefused(
            f"this hello lists devices that belong to other nodes: {named}. Nothing was changed. If a card really "
            "moved, a system admin re-homes it (POST /api/v1/agents/devices/<id>/rehome/) before this node says "
            "hello again."
        )
    node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
    before_status = node.status
    stale = list(node.devices.exclude(uuid__in=reported_uuids))
    for offset, device in enumerate(stale):
        device.health = DeviceHealth.UNHEALTHY
        device.index = 32767 - offset
    Device.objects.bulk_update(stale, ["health", "index"])
    existing = {device.uuid: device for device in Device.objects.filter(uuid__in=reported_uuids)}
    wanted = {str(item["uuid"])[:96]: _device_fields(item) for item in reported}
    # Indexes that moved between cards (a swap) would collide with the (node, index) uniqueness while the rows
    # are rewritten: park the moving rows on free indexes first. A hello that changes nothing skips all this.
    moving = [
        device
        for uuid, device in existing.items()
        if device.node_id != node.pk or device.index != wanted[uuid]["index"]
    ]
    for offset, device in enumerate(moving):
        device.index = 30000 + offset
    Device.objects.bulk_update(moving, ["index"])
    flavors: dict[tuple[str, str, int], ResourceFlavor] = {}
    new_devices, changed = [], []
    for uuid, fields in wanted.items():
        device = existing.get(uuid)
        key = (fields["vendor"], fields["model"], fields["memory_mib"])
        needs_flavor = (
            device is None or device.flavor_id is None or device.model != key[1] or device.memory_mib != key[2]
        )
        if needs_flavor:
            if key not in flavors:
                flavors[key] = flavor_for_device(vendor=key[0], model=key[1], memory_mib=key[2])
            fields["flavor"] = flavors[key]
        if device is None:
            new_devices.append(Device(uuid=uuid, node=node, **fields))
            continue
        device.node = node
        for name, value in fields.items():
            setattr(device, name, value)
        changed.append(device)
    Device.objects.bulk_create(new_devices)
    if changed:
        Device.objects.bulk_update(changed, ["node", *sorted({name for item in wanted.values() for name in item})])
    mapping = dict(Device.objects.filter(uuid__in=reported_uuids).values_list("uuid", "pk"))
    node.agent_version = str(hello.get("agent_version") or node.agent_version)[:32]
    node.cpu_cores = int(hello.get("cpu_cores") or node.cpu_cores or 0)
    node.memory_mib = int(hello.get("memory_mib") or node.memory_mib or 0)
    if isinstance(hello.get("labels"), dict):
        node.labels = hello["labels"]
    if isinstance(hello.get("topology"), dict):
        node.topology = hello["topology"]
    node.last_heartbeat_at = now
    if node.status == NodeStatus.NOT_READY:
        node.status = NodeStatus.READY
    node.save()
    NodeAgent.objects.update_or_create(
        node=node,
        defaults={
            "connected_at": now,
            "disconnected_at": None,
            "lost_at": None,
            "jobs_requeued_at": None,
            "sandbox": str(hello.get("sandbox") or "")[:16],
        },
    )
    audit_record(
        action="node.hello",
        actor=None,
        target=f"node:{node.pk}",
        details={
            "before": {"status": before_status},
            "after": {"status": node.status, "devices": len(mapping), "agent_version": node.agent_version},
            "stale_devices": [device.uuid for device in stale],
        },
    )
    _request_cycle()
    return mapping


@transaction.atomic
def device_rehome(*, actor: Any, device: Device, node: Node, request: Any | None = None) -> Device:
    """Give ``device`` to ``node``: a system admin's answer to a card that really moved to another machine.

    Refused while the card holds an active allocation (stop or drain its jobs first). The card is parked on a
    free index of its new node and marked unhealthy until that node's agent reports it in a hello (which sets
    its real index and health); its old node's next hello no longer lists it and changes nothing more.
    """
    from scheduler import access

    if not access.is_system_admin(actor):
        raise PermissionDeniedError("Only a system admin may re-home a device.")
    # Lock order: Device before Allocation and Node rows.
    device = Device.objects.select_for_update(of=("self",), no_key=True).get(pk=device.pk)
    if Allocation.objects.filter(device=device, ended_at__isnull=True).exists():
        raise ConflictError(
            f"Device {device.uuid} still holds a running allocation; drain node {device.node.name} or cancel the job "
            "first.",
            code="device_busy",
        )
    before = {"node": device.node.name, "index": device.index}
    if device.node_id != node.pk:
        used = set(Device.objects.filter(node=node).values_list("index", flat=True))
        device.index = next(index for index in range(32000, 0, -1) if index not in used)
        device.node = node
        device.health = DeviceHealth.UNHEALTHY  # until the new node's agent reports it
        device.save(update_fields=["node", "index", "health"])
    audit_record(
        action="device.rehome",
        actor=actor,
        target=f"device:{device.pk}",
        details={"uuid": device.uuid, "before": before, "after": {"node": node.name, "index": device.index}},
        request=request,
    )
    return device


@dataclass(frozen=True)
class Reconciled:
    """What :func:`node_workloads_reconcile` did: jobs requeued because the node no longer had them, and the
    (job, replica) pairs of workloads the node runs that are not its to run (told to stop)."""

    requeued: int = 0
    stopped: tuple[tuple[int, int], ...] = ()


def node_workloads_reconcile(*, node_id: int, workloads: list[dict], complete: bool) -> Reconciled:
    """Make the portal and a (re)connected agent agree on what runs on the node, both ways.

    * A workload the agent runs goes through ``workload_status_report`` as ``running``: an ``admitted`` job
      becomes ``running``; one the node does not hold (ended, requeued elsewhere, never placed here, unknown)
      gets a ``workload.stop``.
    * When the hello lists every workload the agent knows (``complete``: running ones and finished ones whose
      report is not acknowledged yet), a job the portal believes runs on the node that the list lacks is
      requeued as if the node had been lost (reason ``workload_missing``): the agent lost it (a wiped work dir,
      a report refused for good). Replicas with a ``workload.start`` still unacknowledged are left alone: the
      agent hears of them right after the hello.

    Finished workloads are left to their reports, which follow the hello from the agent's outbox. Each job is
    its own transaction (the job lock is taken before any node row, as everywhere).
    """
    from scheduler.services.reports import node_jobs_requeue as requeue
    from scheduler.services.reports import workload_status_report as report

    node = Node.objects.get(pk=node_id)
    known: set[tuple[int, int]] = set()
    stopped: list[tuple[int, int]] = []
    for workload in workloads:
        try:
            key = (int(workload["job_id"]), int(workload.get("replica") or 0))
        except (KeyError, TypeError, ValueError):
            logger.warning("node %s listed a malformed workload in its hello: %r", node.name, workload)
            continue
        known.add(key)
        state = str(workload.get("state") or "running")
        if state not in ("starting", "running"):
            continue
        try:
            outcome = report(
                node=node,
                job_id=key[0],
                replica=key[1],
                state=state,
                exit_code=None,
                last_checkpoint_at=None,
                message="reported by the agent on reconnect",
                command_id=int(workload.get("command_id") or 0),
            )
        except DomainError as exc:
            logger.warning("node %s reported a workload the scheduler refused: %r (%s)", node.name, workload, exc)
            continue
        if outcome not in (None, "applied"):
            stopped.append(key)
    requeued = 0
    if complete and requeue is not None:
        held = set(Allocation.objects.active().filter(node=node).values_list("job_id", "replica"))
        starting = set(
            AgentCommand.objects.unacked()
            .filter(node=node, command_type="workload.start")
            .values_list("job_id", "payload__replica")
        )
        missing = sorted({job_id for job_id, replica in held - known - starting})
        if missing:
            logger.warning("node %s no longer has jobs %s: requeueing them", node.name, missing)
            requeued = requeue(
                node=node,
                reason="workload_missing",
                job_ids=missing,
                message=f"Node {node.name} reconnected without this job's workload.",
            )
    return Reconciled(requeued=requeued, stopped=tuple(stopped))


def node_heartbeat(*, node_id: int, now: datetime | None = None) -> bool:
    """Renew the node's lease. A node the lease check declared lost while its socket stayed open becomes
    ready again. Returns True when the node became ready."""
    now = now or timezone.now()
    Node.objects.filter(pk=node_id).update(last_heartbeat_at=now)
    lost = NodeAgent.objects.filter(node_id=node_id, lost_at__isnull=False).exists()
    if not lost:
        return False
    with transaction.atomic():
        NodeAgent.objects.filter(node_id=node_id).update(lost_at=None, jobs_requeued_at=None)
        revived = Node.objects.filter(pk=node_id, status=NodeStatus.NOT_READY).update(status=NodeStatus.READY)
        audit_record(
            action="node.ready",
            actor=None,
            target=f"node:{node_id}",
            details={"reason": "heartbeat resumed", "after": {"status": NodeStatus.READY if revived else "unchanged"}},
        )
        _request_cycle()
    return bool(revived)


def node_heartbeats_record(*, beats: dict[int, datetime]) -> list[int]:
    """Renew the leases of many nodes at once (the agent sockets of one web process batch their heartbeats
    and write them about once a second: one UPDATE per distinct second instead of one per heartbeat).

    Nodes the lease check had declared lost become ready again. Returns their ids.
    """
    if not beats:
        return []
    # Whole seconds (rounded down, so a lease never looks fresher than it is): a second's heartbeats from a
    # thousand nodes become one or two UPDATEs rather than one per node.
    by_time: dict[datetime, list[int]] = {}
    for node_id, moment in beats.items():
        by_time.setdefault(moment.replace(microsecond=0), []).append(node_id)
    for moment, node_ids in by_time.items():
        Node.objects.filter(pk__in=node_ids).update(last_heartbeat_at=moment)
    lost = list(
        NodeAgent.objects.filter(node_id__in=list(beats), lost_at__isnull=False).values_list("node_id", flat=True)
    )
    return [node_id for node_id in lost if node_heartbeat(node_id=node_id, now=beats[node_id])]


def node_disconnected(*, node_id: int, now: datetime | None = None) -> None:
    """Record that the agent's socket closed. The node keeps its status until its lease runs out."""
    NodeAgent.objects.filter(node_id=node_id).update(disconnected_at=now or timezone.now())


def lease_check(*, now: datetime | None = None) -> dict[str, list[int]]:
    """Declare nodes whose lease ran out (``GPUPOOL_LEASE_MISSES`` heartbeats missed) lost — a ready node
    becomes ``not_ready`` so nothing new is placed on it — and requeue the jobs of nodes lost for longer than
    ``GPUPOOL_NODE_LOST_GRACE_S``. Idempotent; run periodically by Celery beat."""
    now = now or timezone.now()
    lease_s = settings.GPUPOOL_HEARTBEAT_INTERVAL_S * settings.GPUPOOL_LEASE_MISSES
    expired_before = now - timedelta(seconds=lease_s)
    lost: list[int] = []
    requeued: list[int] = []
    candidates = Node.objects.filter(last_heartbeat_at__lt=expired_before).exclude(agent__lost_at__isnull=False)
    for node_id in candidates.values_list("pk", flat=True):
        with transaction.atomic():
            node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
            if node.last_heartbeat_at is None or node.last_heartbeat_at >= expired_before:
                continue  # a heartbeat arrived in between
            before = node.status
            if node.status == NodeStatus.READY:
                node.status = NodeStatus.NOT_READY
                node.save(update_fields=["status"])
            NodeAgent.objects.update_or_create(node=node, defaults={"lost_at": now, "jobs_requeued_at": None})
            audit_record(
                action="node.not_ready",
                actor=None,
                target=f"node:{node.pk}",
                details={
                    "reason": "lease_expired",
                    "last_heartbeat_at": node.last_heartbeat_at.isoformat(),
                    "before": {"status": before},
                    "after": {"status": node.status},
                },
            )
            _request_cycle()
            lost.append(node.pk)
    grace_before = now - timedelta(seconds=settings.GPUPOOL_NODE_LOST_GRACE_S)
    overdue = NodeAgent.objects.filter(lost_at__lte=grace_before, jobs_requeued_at__isnull=True)
    from scheduler.services.reports import node_jobs_requeue as requeue

    for node_id in overdue.values_list("node_id", flat=True):
        with transaction.atomic():
            # Jobs first, the NodeAgent row last (the project's lock order: Job → ... → Node/NodeAgent); if the
            # node came back meanwhile the conditional update finds nothing and the requeue is rolled back.
            count = requeue(node=Node.objects.get(pk=node_id), reason="node_lost")
            still_lost = NodeAgent.objects.filter(pk=node_id, lost_at__isnull=False, jobs_requeued_at__isnull=True)
            lost_at = still_lost.values_list("lost_at", flat=True).first()
            if lost_at is None or not still_lost.update(jobs_requeued_at=now):
                transaction.set_rollback(True)
                continue
            audit_record(
                action="node.jobs_requeued",
                actor=None,
                target=f"node:{node_id}",
                details={"reason": "node_lost", "jobs": count, "lost_at": lost_at.isoformat()},
            )
            requeued.append(node_id)
    return {"lost": lost, "requeued": requeued}


# --- workloads and the outbox ------------------------------------------------------------------------------


def workload_status_forward(*, node_id: int, status: dict) -> bool:
    """Pass a ``workload.status`` frame to ``scheduler.services.workload_status_report``.

    Returns False when the scheduler does not take reports yet.
    """
    return _forward(node=Node.objects.get(pk=node_id), status=status) is not None


#: Errors after which a report is not acknowledged, so the agent sends it again: the database was busy or
#: away (deadlock, serialization failure, lost connection, lock timeout), or a copy of the same report was
#: being applied at the same moment (the unique (node, report id) row). Anything else is permanent.
RETRYABLE_REPORT_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, IntegrityError, OSError)


@dataclass(frozen=True)
class ReportOutcome:
    """The answer to one agent report (``report.ack``): ``code`` is empty when it was applied."""

    ok: bool = True
    code: str = ""
    detail: str = ""


def workload_report_apply(*, node_id: int, status: dict, now: datetime | None = None) -> ReportOutcome:
    """Apply a ``workload.status`` that carries a ``report_id``, exactly once per (node, report id).

    The report and the :class:`AgentReport` row that remembers it commit together: a report seen before (its
    ack was lost and the agent sent it again) is answered ``duplicate`` and changes nothing; a report whose
    transaction failed left no row and is applied when it comes again. Errors in
    :data:`RETRYABLE_REPORT_ERRORS` propagate (the caller does not ack); a ``DomainError`` propagates too and is
    acked as a refusal.
    """
    report_id = int(status["report_id"])
    if AgentReport.objects.filter(node_id=node_id, report_id=report_id).exists():
        return ReportOutcome(code="duplicate", detail=f"report {report_id} was applied before")
    with transaction.atomic():
        node = Node.objects.get(pk=node_id)
        outcome = _forward(node=node, status=status)
        # After the job (locked by the report) as the project's lock order wants: Job → ... → Node rows.
        AgentReport.objects.create(
            node=node,
            report_id=report_id,
            job_id=int(status["job_id"]),
            replica=int(status.get("replica") or 0),
            state=str(status["state"])[:16],
            outcome=(outcome or "unapplied")[:32],
            received_at=now or timezone.now(),
        )
    if outcome in (None, "applied"):
        return ReportOutcome()
    return ReportOutcome(code=outcome, detail=f"report {report_id} changed nothing: {outcome.replace('_', ' ')}")


def _forward(*, node: Node, status: dict) -> str | None:
    """``workload_status_report`` for one frame: its outcome, or None when the scheduler takes no reports."""
    from scheduler.fleet.telemetry import parse_time
    from scheduler.services.reports import workload_status_report as report

    checkpoint = status.get("last_checkpoint_at")
    outcome = report(
        node=node,
        job_id=int(status["job_id"]),
        replica=int(status.get("replica") or 0),
        state=str(status["state"]),
        exit_code=status.get("exit_code"),
        last_checkpoint_at=parse_time(checkpoint, default=None) if checkpoint else None,
        message=str(status.get("message") or ""),
        log_tail=str(status.get("log_tail") or ""),
        reason=str(status.get("reason") or ""),
        command_id=int(status.get("command_id") or 0),
    )
    return outcome if isinstance(outcome, str) else "applied"


def commands_pending(*, node_id: int, command_id: int | None = None) -> list[tuple[int, dict]]:
    """Unacknowledged commands of the node (or just ``command_id``), oldest first, marked sent now.

    Sent-but-unacked commands are sent again on reconnect; the agent deduplicates by ``command_id``.
    """
    rows = AgentCommand.objects.filter(node_id=node_id, acked_at__isnull=True).order_by("pk")
    if command_id is not None:
        rows = rows.filter(pk=command_id)
    commands = [(row.pk, row.payload) for row in rows]
    if commands:
        AgentCommand.objects.filter(pk__in=[pk for pk, _ in commands]).update(
            sent_at=timezone.now(), attempts=F("attempts") + 1
        )
    return commands


def command_ack(*, node_id: int, command_id: int, ok: bool = True, error: str = "") -> bool:
    """Mark the node's command acknowledged. Returns False for an id that is not this node's."""
    update = {
        "acked_at": timezone.now(),
        "ack_ok": ok,
        "error": error[: AgentCommand._meta.get_field("error").max_length],
    }
    return bool(AgentCommand.objects.filter(pk=command_id, node_id=node_id).update(**update))


# --- telemetry rollups ---------------------------------------------------------------------------------------


def _merge(
    row: TelemetryMinute | TelemetryHour,
    *,
    samples: int,
    util_avg: float,
    util_max: float,
    mem_avg: float,
    mem_max: float,
    power_avg: float | None,
    temp_max: float | None,
) -> None:
    total = row.samples + samples
    row.utilization_avg_pct = (row.utilization_avg_pct * row.samples + util_avg * samples) / total
    row.memory_used_avg_mib = (row.memory_used_avg_mib * row.samples + mem_avg * samples) / total
    row.utilization_max_pct = max(row.utilization_max_pct, util_max)
    row.memory_used_max_mib = max(row.memory_used_max_mib, mem_max)
    if power_avg is not None:
        row.power_avg_w = (
            power_avg if row.power_avg_w is None else ((row.power_avg_w * row.samples + power_avg * samples) / total)
        )
    if temp_max is not None:
        row.temperature_max_c = temp_max if row.temperature_max_c is None else max(row.temperature_max_c, temp_max)
    row.samples = total


def telemetry_minutes_write(*, aggregates: Iterable[MinuteAggregate], device_ids: dict[str, int]) -> int:
    """Store finished minute aggregates, merging aggregates of the same device and minute (an agent that
    reconnected within the minute) with each other and with rows that already exist. Returns the number of
    (device, minute) rows written."""
    by_key: dict[tuple[int, datetime], MinuteAggregate] = {}
    for aggregate in aggregates:
        device_id = device_ids.get(aggregate.uuid)
        if device_id is None or aggregate.samples == 0:
            continue
        key = (device_id, aggregate.minute)
        by_key[key] = by_key[key].merged(aggregate) if key in by_key else aggregate
    if not by_key:
        return 0
    rows = [
        (
            device_id,
            _MINUTE_FIELD.get_db_prep_value(minute, connection),
            agg.samples,
            agg.utilization_avg,
            agg.utilization_max,
            agg.memory_avg,
            agg.memory_max,
            agg.power_avg,
            agg.temperature_max,
        )
        for (device_id, minute), agg in by_key.items()
    ]
    sql = _minute_upsert_sql()
    per_statement = min(1000, (connection.features.max_query_params or 65535) // len(_MINUTE_COLUMNS))
    with transaction.atomic(), connection.cursor() as cursor:
        for start in range(0, len(rows), per_statement):
            chunk = rows[start : start + per_statement]
            values = ", ".join(["(" + ", ".join(["%s"] * len(_MINUTE_COLUMNS)) + ")"] * len(chunk))
            cursor.execute(sql.format(values=values), [value for row in chunk for value in row])
    return len(rows)


_MINUTE_COLUMNS = (
    "device_id",
    "minute",
    "samples",
    "utilization_avg_pct",
    "utilization_max_pct",
    "memory_used_avg_mib",
    "memory_used_max_mib",
    "power_avg_w",
    "temperature_max_c",
)
_MINUTE_FIELD = TelemetryMinute._meta.get_field("minute")


def _minute_upsert_sql() -> str:
    """One INSERT … ON CONFLICT for many minute rows, merging into an existing row as ``_merge`` does
    (sample-weighted averages, larger maxima). It replaces a SELECT FOR UPDATE + bulk insert + bulk update
    that cost a second of the agent process's time each minute at 1,000 nodes. PostgreSQL and SQLite."""
    quote = connection.ops.quote_name
    table = quote(TelemetryMinute._meta.db_table)

    def old(column: str) -> str:
        return f"{table}.{quote(column)}"

    def new(column: str) -> str:
        return f"excluded.{quote(column)}"

    total = f"({old('samples')} + {new('samples')})"

    def weighted(column: str) -> str:
        return f"({old(column)} * {old('samples')} + {new(column)} * {new('samples')}) / {total}"

    def larger(column: str) -> str:
        bigger = f"{old(column)} IS NULL OR {new(column)} > {old(column)}"
        return f"CASE WHEN {bigger} THEN {new(column)} ELSE {old(column)} END"

    power = "power_avg_w"
    updates = {
        "samples": total,
        "utilization_avg_pct": weighted("utilization_avg_pct"),
        "utilization_max_pct": larger("utilization_max_pct"),
        "memory_used_avg_mib": weighted("memory_used_avg_mib"),
        "memory_used_max_mib": larger("memory_used_max_mib"),
        power: f"CASE WHEN {new(power)} IS NULL THEN {old(power)} WHEN {old(power)} IS NULL THEN {new(power)} "
        f"ELSE {weighted(power)} END",
        "temperature_max_c": larger("temperature_max_c"),
    }
    columns = ", ".join(quote(column) for column in _MINUTE_COLUMNS)
    assignments = ", ".join(f"{quote(column)} = {expression}" for column, expression in updates.items())
    # {values} is filled per statement; literal braces cannot occur in the generated SQL above.
    return (
        f"INSERT INTO {table} ({columns}) VALUES {{values}} "
        f"ON CONFLICT ({quote('device_id')}, {quote('minute')}) DO UPDATE SET {assignments}"
    )


@transaction.atomic
def telemetry_hours_rollup(*, now: datetime | None = None) -> int:
    """(Re)build the hourly rows of every hour that has minutes and is over, up to the current hour.

    Rebuilding an hour from its minutes (rather than adding to it) keeps the task idempotent. Only hours after
    the newest finished hour row minus one hour are touched, so the work stays bounded.
    """
    now = now or timezone.now()
    current_hour = now.replace(minute=0, second=0, microsecond=0)
    newest = TelemetryHour.objects.aggregate(newest=Max("hour"))["newest"]
    start = newest - timedelta(hours=1) if newest else None
    minutes = TelemetryMinute.objects.filter(minute__lt=current_hour)
    if start is not None:
        minutes = minutes.filter(minute__gte=start)
    buckets: dict[tuple[int, datetime], TelemetryHour] = {}
    for row in minutes.order_by("minute").iterator():
        hour = row.minute.replace(minute=0, second=0, microsecond=0)
        bucket = buckets.get((row.device_id, hour))
        if bucket is None:
            buckets[(row.device_id, hour)] = TelemetryHour(
                device_id=row.device_id,
                hour=hour,
                samples=row.samples,
                utilization_avg_pct=row.utilization_avg_pct,
                utilization_max_pct=row.utilization_max_pct,
                memory_used_avg_mib=row.memory_used_avg_mib,
                memory_used_max_mib=row.memory_used_max_mib,
                power_avg_w=row.power_avg_w,
                temperature_max_c=row.temperature_max_c,
            )
        else:
            _merge(
                bucket,
                samples=row.samples,
                util_avg=row.utilization_avg_pct,
                util_max=row.utilization_max_pct,
                mem_avg=row.memory_used_avg_mib,
                mem_max=row.memory_used_max_mib,
                power_avg=row.power_avg_w,
                temp_max=row.temperature_max_c,
            )
    if not buckets:
        return 0
    TelemetryHour.objects.filter(hour__in={hour for _device, hour in buckets}).delete()
    TelemetryHour.objects.bulk_create(buckets.values())
    return len(buckets)


def telemetry_purge(*, now: datetime | None = None) -> dict[str, int]:
    """Delete minute rows older than 30 days and hour rows older than a year (configurable), and the
    remembered agent reports older than ``GPUPOOL_AGENT_REPORT_RETENTION_DAYS`` (30)."""
    now = now or timezone.now()
    minute_days = getattr(settings, "GPUPOOL_TELEMETRY_MINUTE_RETENTION_DAYS", 30)
    hour_days = getattr(settings, "GPUPOOL_TELEMETRY_HOUR_RETENTION_DAYS", 365)
    report_days = getattr(settings, "GPUPOOL_AGENT_REPORT_RETENTION_DAYS", 30)
    minutes, _ = TelemetryMinute.objects.filter(minute__lt=now - timedelta(days=minute_days)).delete()
    hours, _ = TelemetryHour.objects.filter(hour__lt=now - timedelta(days=hour_days)).delete()
    reports, _ = AgentReport.objects.filter(received_at__lt=now - timedelta(days=report_days)).delete()
    return {"minutes": minutes, "hours": hours, "agent_reports": reports}
