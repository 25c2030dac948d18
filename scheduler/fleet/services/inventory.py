"""Inventory: what an agent says it has (``hello``: devices, their flavors and health), a card moved to
another node, and reconciling the workloads an agent runs with the ones it should.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from audit.services import audit_record
from catalog.models import ResourceFlavor, Vendor
from kernel.access_rules import Action
from kernel.api import ConflictError, DomainError, PermissionDeniedError
from nodeagent import protocol
from scheduler import messages as scheduler_messages
from scheduler.fleet.models import AgentCommand, Device, DeviceHealth, Node, NodeAgent, NodeStatus
from scheduler.fleet.services.notify import cycle_request_after_commit
from scheduler.fleet.services.workload_reports import node_jobs_requeue, workload_status_report
from scheduler.models import Allocation
from tenants.access import allows

logger = logging.getLogger(__name__)


# --- inventory -----------------------------------------------------------------------------------------------


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


#: What an announced node address may be: an IPv4/IPv6 address or a DNS name.
_ADDRESS_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$|^[0-9A-Fa-f:.]+$")


def announced_address(value: object) -> str:
    """The hello's ``address`` if it is an IP address or a host name, else "" (the node's name is used)."""
    text = str(value or "").strip()
    if not text or len(text) > 255 or not _ADDRESS_RE.match(text):
        return ""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(text))
    return text if not text.replace(".", "").isdigit() else ""


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
    address = announced_address(hello.get("address"))
    if address:
        node.address = address
    if hello.get("job_ports"):
        try:
            node.job_port_first, node.job_port_last = protocol.parse_port_range(hello["job_ports"])
        except ValueError:
            logger.warning("node %s announced job ports %r; using the portal's range", node.name, hello["job_ports"])
            node.job_port_first = node.job_port_last = None
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
            "network_isolation": str(hello.get("network_isolation") or "")[:16],
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
    cycle_request_after_commit()
    return mapping


@transaction.atomic
def device_rehome(*, actor: Any, device: Device, node: Node, request: Any | None = None) -> Device:
    """Give ``device`` to ``node``: a system admin's answer to a card that really moved to another machine.

    Refused while the card holds an active allocation (stop or drain its jobs first). The card is parked on a
    free index of its new node and marked unhealthy until that node's agent reports it in a hello (which sets
    its real index and health); its old node's next hello no longer lists it and changes nothing more.
    """
    if not allows(actor, Action.FLEET_MANAGE):
        raise PermissionDeniedError(scheduler_messages.ONLY_SYSTEM_ADMIN_MAY_RE())
    # Lock order: Device before Allocation and Node rows.
    device = Device.objects.select_for_update(of=("self",), no_key=True).get(pk=device.pk)
    if Allocation.objects.filter(device=device, ended_at__isnull=True).exists():
        raise ConflictError(
            scheduler_messages.DEVICE_STILL_HOLDS_RUNNING_ALLOCATION(device=device.uuid, node=device.node.name),
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
            outcome = workload_status_report(
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
    if complete:
        held = set(Allocation.objects.active().filter(node=node).values_list("job_id", "replica"))
        starting = set(
            AgentCommand.objects.unacked()
            .filter(node=node, command_type="workload.start")
            .values_list("job_id", "payload__replica")
        )
        missing = sorted({job_id for job_id, replica in held - known - starting})
        if missing:
            logger.warning("node %s no longer has jobs %s: requeueing them", node.name, missing)
            requeued = node_jobs_requeue(
                node=node,
                reason="workload_missing",
                job_ids=missing,
                message=f"Node {node.name} reconnected without this job's workload.",
            )
    return Reconciled(requeued=requeued, stopped=tuple(stopped))
