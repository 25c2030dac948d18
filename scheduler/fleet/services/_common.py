"""Helpers the fleet services share: an agent's channel group, sending to it after commit, asking for a
scheduling cycle after commit.
"""

from __future__ import annotations

from django.db import transaction

from portal.channel_send import group_send


def agent_group(node_id: int) -> str:
    """The channel group of a node's agent socket (PROTOCOL.md: outbox events go here)."""
    return f"agent.node.{node_id}"


def _request_cycle() -> None:
    # Imported here, not at the top: scheduler.services imports this module's app (the fleet) while loading.
    from scheduler.services.cycle import request_cycle

    transaction.on_commit(request_cycle)


def _group_send_on_commit(group: str, event: dict) -> None:
    transaction.on_commit(lambda: group_send(group, event))
