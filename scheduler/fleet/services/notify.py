"""What the fleet services tell the rest once their transaction commits: an agent's socket (through its channel
group) and the scheduler (a cycle is asked for). Nothing is sent for a transaction that rolls back.
"""

from __future__ import annotations

from django.db import transaction

from kernel.channel_send import group_send
from scheduler.services.cycle import request_cycle


def agent_group(node_id: int) -> str:
    """The channel group of a node's agent socket (PROTOCOL.md: outbox events go here)."""
    return f"agent.node.{node_id}"


def cycle_request_after_commit() -> None:
    """Ask for a scheduling cycle once the caller's transaction commits."""
    transaction.on_commit(request_cycle)


def group_send_after_commit(group: str, event: dict) -> None:
    """Send ``event`` to a channel group once the caller's transaction commits."""
    transaction.on_commit(lambda: group_send(group, event))
