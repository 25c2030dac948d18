"""Node status set by a system admin (cordon, drain, uncordon) and resource flavors."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from catalog.models import ResourceFlavor
from kernel.access_rules import Action
from kernel.api import ConflictError, PermissionDeniedError
from scheduler import messages as scheduler_messages
from scheduler.fleet import outbox
from scheduler.fleet.fencing import lease_timing
from scheduler.fleet.models import Node, NodeStatus
from scheduler.models import Allocation
from scheduler.services.cycle import request_cycle
from scheduler.transitions import S, job_lock_for_update, job_transition
from tenants.access import allows

# --- nodes and flavors (system admin) -----------------------------------------------------------------


def _require_allowed(actor: Any | None, action: Action = Action.NODE_OPERATE) -> None:
    if actor is not None and not allows(actor, action):
        raise PermissionDeniedError(scheduler_messages.ONLY_SYSTEM_ADMIN_MAY_CHANGE())


def _node_set_status(*, node: Node, actor: Any | None, status: str, action: str) -> Node:
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    before = node.status
    node.status = status
    node.save(update_fields=["status"])
    audit_record(
        action=action,
        actor=actor,
        target=f"node:{node.pk}",
        details={"before": {"status": before}, "after": {"status": status}, "node": node.name},
    )
    transaction.on_commit(request_cycle)
    return node


@transaction.atomic
def node_cordon(*, node: Node, actor: Any | None) -> Node:
    """No new work lands on the node; running work stays."""
    _require_allowed(actor)
    return _node_set_status(node=node, actor=actor, status=NodeStatus.CORDONED, action="node.cordon")


@transaction.atomic
def node_drain(*, node: Node, actor: Any | None, grace_s: float = outbox.DEFAULT_STOP_GRACE_S) -> Node:
    """Cordon the node and ask every job on it to checkpoint and stop; they are requeued when stopped."""
    _require_allowed(actor)
    node = _node_set_status(node=node, actor=actor, status=NodeStatus.DRAINING, action="node.drain")
    job_ids = sorted(set(Allocation.objects.active().filter(node=node).values_list("job_id", flat=True)))
    for job_id in job_ids:
        job = job_lock_for_update(job_id)
        if job.state not in (S.ADMITTED, S.RUNNING):
            continue
        outbox.stop_active_replicas(job=job, grace_s=grace_s, reason="node_drain")
        job_transition(
            job=job, to_state=S.PREEMPTING, actor=actor, reason="node_drain", message=f"Node {node.name} is draining."
        )
    return node


@transaction.atomic
def node_uncordon(*, node: Node, actor: Any | None) -> Node:
    """Schedulable again: ``ready`` if its agent is alive (recent heartbeat), else ``not_ready``."""
    _require_allowed(actor)
    lease_s = lease_timing().lease_s
    alive = node.last_heartbeat_at is not None and node.last_heartbeat_at >= timezone.now() - timedelta(seconds=lease_s)
    status = NodeStatus.READY if alive else NodeStatus.NOT_READY
    return _node_set_status(node=node, actor=actor, status=status, action="node.uncordon")


@transaction.atomic
def flavor_create(
    *,
    actor: Any | None,
    name: str,
    vendor: str,
    model: str,
    memory_mib: int,
    description: str = "",
    cpu_millicores_per_card: int = 0,
    host_memory_mib_per_card: int = 0,
) -> ResourceFlavor:
    """A new flavor. ``cpu_millicores_per_card`` / ``host_memory_mib_per_card``: the host CPU and memory a job
    that states none gets per card of this flavor (0: none)."""
    _require_allowed(actor, Action.FLAVOR_CREATE)
    if ResourceFlavor.objects.filter(name=name).exists():
        raise ConflictError(scheduler_messages.FLAVOR_NAMED_ALREADY_EXISTS(name=name), code="duplicate")
    flavor = ResourceFlavor.objects.create(
        name=name,
        vendor=vendor,
        model=model,
        memory_mib=memory_mib,
        description=description,
        cpu_millicores_per_card=cpu_millicores_per_card,
        host_memory_mib_per_card=host_memory_mib_per_card,
    )
    after: dict[str, Any] = {"name": name, "vendor": vendor, "model": model, "memory_mib": memory_mib}
    if cpu_millicores_per_card or host_memory_mib_per_card:
        after["cpu_millicores_per_card"] = cpu_millicores_per_card
        after["host_memory_mib_per_card"] = host_memory_mib_per_card
    audit_record(action="flavor.create", actor=actor, target=f"flavor:{flavor.pk}", details={"after": after})
    return flavor
