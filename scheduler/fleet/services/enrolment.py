"""Enrolment: bootstrap tokens, an agent registering its node, and the node credentials it then signs in
with (revoke, authenticate).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from kernel.api import DomainError
from scheduler import messages as scheduler_messages
from scheduler.fleet.models import BootstrapToken, Node, NodeAgent, NodeCredential, NodeStatus
from scheduler.fleet.services.notify import agent_group, group_send_after_commit

BOOTSTRAP_PREFIX = "gpb_"
CREDENTIAL_PREFIX = "gpn_"
MAX_TOKEN_TTL_S = 30 * 24 * 3600
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CLOSE_UNAUTHORIZED = 4401
CLOSE_REPLACED = 4409


class AuthenticationFailed(DomainError):
    code = "authentication_failed"
    status_code = 401


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


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
            scheduler_messages.TTL_MUST_BETWEEN_SECONDS_DAYS(days=MAX_TOKEN_TTL_S // 86400, ttl=ttl_s),
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
            group_send_after_commit(agent_group(node.pk), {"type": "agent.disconnect", "code": CLOSE_UNAUTHORIZED})
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
    group_send_after_commit(agent_group(node.pk), {"type": "agent.disconnect", "code": CLOSE_UNAUTHORIZED})
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
