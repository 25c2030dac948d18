"""The lease of a node: heartbeats keep it, a disconnect is noted, and ``lease_check`` marks a silent node lost
and, past the grace, requeues its jobs.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from scheduler.fleet.fencing import lease_timing
from scheduler.fleet.models import Node, NodeAgent, NodeStatus
from scheduler.fleet.services.notify import cycle_request_after_commit
from scheduler.fleet.services.workload_reports import node_jobs_requeue


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
        cycle_request_after_commit()
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
    lease_s = lease_timing().lease_s
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
            cycle_request_after_commit()
            lost.append(node.pk)
    grace_before = now - timedelta(seconds=settings.GPUPOOL_NODE_LOST_GRACE_S)
    overdue = NodeAgent.objects.filter(lost_at__lte=grace_before, jobs_requeued_at__isnull=True)

    for node_id in overdue.values_list("node_id", flat=True):
        with transaction.atomic():
            # Jobs first, the NodeAgent row last (the project's lock order: Job → ... → Node/NodeAgent); if the
            # node came back meanwhile the conditional update finds nothing and the requeue is rolled back.
            count = node_jobs_requeue(node=Node.objects.get(pk=node_id), reason="node_lost")
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
