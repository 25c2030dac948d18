"""Appending to the audit trail: ``audit_record``, the one entry point every app calls, and the pre-commit step
that seals, chains and inserts the records a transaction queued.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import uuid
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.utils import timezone

from audit import chain, conf, crypto, events
from audit.context import Origin, current_origin, request_origin
from audit.models import PLATFORM_STREAM, AuditRecord, ChainHead, DataKey, tenant_stream
from audit.services.alerting import raise_alert
from audit.services.checkpoints import checkpoint_after_commit
from audit.services.records import data_key_cache, raw_data_key, record_header
from audit.siem import forward_on_commit
from kernel.db import precommit
from kernel.db.bulk import insert_instances, insert_rows, mark_saved, reserve_ids

_PLATFORM_ROLES = {"system_admin", "security_admin", "auditor"}
_json_encoder = DjangoJSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _clean_ip(raw: str | None) -> str | None:
    if not raw:
        return None
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return None
    # Store (and hash) the form the database gives back: IPv4-mapped IPv6 unwrapped, IPv6 compressed.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return str(address.ipv4_mapped)
    return str(address)


# --- appending --------------------------------------------------------------------------------------------
#
# ``audit_record`` validates the event, encodes its details and queues one pending record per stream on the
# connection; ``_link_and_insert`` runs just before COMMIT (kernel/db/precommit.py). It locks the chain-head
# rows of every stream the transaction wrote to — FOR UPDATE, in stream order, as the transaction's last locks —
# seals each record under its tenant's data key, links it to its stream's head, bulk-inserts the records and
# moves the heads. The heads stay locked only until the COMMIT that follows at once, so appends to one stream are
# serialised for about a commit's duration and appends to different streams not at all.

PRE_COMMIT_KEY = "audit.records"


@dataclass
class _Pending:
    """A record waiting for its transaction's COMMIT: everything but its place in the chain."""

    record: AuditRecord
    tenant_id: int | None
    cipher: str
    plaintext: bytes


# (tenant_id, cipher) → the tenant's newest live data key, as last seen. Re-checked at every flush (in the same
# statement that locks the chain heads), so a destroyed key is never used again.
_tenant_keys: dict[tuple[int | None, str], DataKey] = {}


# pg_advisory_xact_lock key taken to create missing chain heads: the first 8 bytes of SHA-256("gpupool-audit-heads").
HEAD_CREATE_LOCK_KEY = 0x3B1E_0D6A_92C4_7F05


def _lock_heads(
    streams: list[str], cached_key_ids: list[str], *, check_deferred: bool
) -> tuple[dict[str, ChainHead], set[str]]:
    """Lock the heads of ``streams`` in stream order (creating the missing ones first), and say which of
    ``cached_key_ids`` are still live — one round trip when every head exists.

    ``check_deferred`` first fires the transaction's deferred constraint checks (PostgreSQL checks foreign keys
    at COMMIT, taking FOR KEY SHARE locks on the rows they reference): done before the heads are locked, the
    heads really are the transaction's last locks.

    A missing head must not be created while this transaction holds other heads: an insert that conflicts with
    another transaction's uncommitted insert of the same head waits for it, a lock taken out of stream order.
    So the locking SELECT locks nothing unless every head exists (its guard counts them first, without locking);
    otherwise the missing heads are inserted under one advisory lock, before any head is locked, and the SELECT
    runs again."""
    table = ChainHead._meta.db_table
    postgres = connection.vendor == "postgresql"
    in_streams = ", ".join(["%s"] * len(streams))
    live = "''"
    if cached_key_ids:
        aggregate = "string_agg" if postgres else "group_concat"
        live = (
            f"(SELECT COALESCE({aggregate}(key_id, ','), '') FROM {DataKey._meta.db_table} "
            f"WHERE key_id IN ({', '.join(['%s'] * len(cached_key_ids))}) AND destroyed_at IS NULL)"
        )
    if postgres:
        query = (
            f"SELECT h.stream, h.seq, h.hash, h.checkpoint_seq, {live} FROM {table} h "
            f"WHERE h.stream IN ({in_streams}) "
            f"AND (SELECT count(*) FROM {table} WHERE stream IN ({in_streams})) = %s "
            "ORDER BY h.stream FOR UPDATE OF h"
        )
        params = [*cached_key_ids, *streams, *streams, len(streams)]
    else:  # SQLite runs one write transaction at a time: nothing to order
        query = (
            f"SELECT h.stream, h.seq, h.hash, h.checkpoint_seq, {live} FROM {table} h WHERE h.stream IN ({in_streams})"
        )
        params = [*cached_key_ids, *streams]
    with connection.cursor() as cursor:
        if check_deferred and postgres:
            # One round trip: psycopg sends both statements; the SELECT's rows are the second result.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE; " + query, params)
            cursor.cursor.nextset()
        else:
            cursor.execute(query, params)
        rows = cursor.fetchall()
        if len(rows) < len(streams):
            if postgres:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [HEAD_CREATE_LOCK_KEY])
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            cursor.execute(
                f"INSERT INTO {table} (stream, seq, hash, checkpoint_seq, updated_at) VALUES "
                + ", ".join(["(%s, 0, %s, 0, %s)"] * len(streams))
                + " ON CONFLICT (stream) DO NOTHING",
                [value for stream in streams for value in (stream, chain.GENESIS_HASH, now)],
            )
            cursor.execute(query, params)
            rows = cursor.fetchall()
    if len(rows) < len(streams):
        raise RuntimeError(f"audit chain heads {sorted(set(streams) - {r[0] for r in rows})} could not be created")
    heads = {row[0]: ChainHead(stream=row[0], seq=row[1], hash=row[2], checkpoint_seq=row[3]) for row in rows}
    live_ids = set(rows[0][4].split(",")) - {""} if rows else set()
    return heads, live_ids


def _live_keys(tenant_ids: set[int | None], cipher: str) -> dict[int | None, tuple[DataKey, bytes]]:
    """The newest live data key of each tenant (creating one where there is none), with its raw bytes."""
    table = DataKey._meta.db_table
    known = [t for t in tenant_ids if t is not None]
    clauses = []
    params: list[Any] = []
    if None in tenant_ids:
        clauses.append("tenant_id IS NULL")
    if known:
        clauses.append(f"tenant_id IN ({', '.join(['%s'] * len(known))})")
        params.extend(known)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT key_id, tenant_id, master_key_id, wrapped_key FROM {table} WHERE ({' OR '.join(clauses)}) "
            "AND cipher = %s AND destroyed_at IS NULL ORDER BY created_at DESC",
            [*params, cipher],
        )
        found = cursor.fetchall()
    keys: dict[int | None, tuple[DataKey, bytes]] = {}
    for key_id, tenant_id, master_key_id, wrapped in found:
        if tenant_id in keys:
            continue
        data_key = DataKey(
            key_id=key_id, tenant_id=tenant_id, cipher=cipher, master_key_id=master_key_id, wrapped_key=bytes(wrapped)
        )
        keys[tenant_id] = (data_key, raw_data_key(data_key))
    for tenant_id in tenant_ids - keys.keys():
        key_id = uuid.uuid4().hex
        raw = crypto.new_data_key(cipher)
        master_id, wrapped = crypto.wrap_data_key(key_id=key_id, tenant_id=tenant_id, cipher=cipher, data_key=raw)
        data_key = DataKey.objects.create(
            key_id=key_id, tenant_id=tenant_id, cipher=cipher, master_key_id=master_id, wrapped_key=wrapped
        )
        data_key_cache[key_id] = (master_id, wrapped, raw)
        keys[tenant_id] = (data_key, raw)
    for tenant_id, (data_key, _raw) in keys.items():
        _tenant_keys[(tenant_id, cipher)] = data_key
    return keys


def _keys_for(payloads: list[_Pending], live_ids: set[str]) -> dict[tuple[int | None, str], tuple[DataKey, bytes]]:
    """Each payload's data key: the cached one where the head query found it live, else looked up."""
    keys: dict[tuple[int | None, str], tuple[DataKey, bytes]] = {}
    missing: dict[str, set[int | None]] = {}
    for wanted in {(p.tenant_id, p.cipher) for p in payloads}:
        cached = _tenant_keys.get(wanted)
        if cached is not None and cached.key_id in live_ids:
            try:
                keys[wanted] = (cached, raw_data_key(cached))
                continue
            except crypto.KeyUnavailable:
                pass
        _tenant_keys.pop(wanted, None)
        missing.setdefault(wanted[1], set()).add(wanted[0])
    for cipher, tenant_ids in missing.items():
        keys.update({(tenant_id, cipher): value for tenant_id, value in _live_keys(tenant_ids, cipher).items()})
    return keys


def _link_and_insert(db: Any, payloads: list[_Pending], after_commit: Any) -> None:
    """The pre-commit handler: seal, chain and insert every pending record of the transaction."""
    try:
        cached_ids = sorted(
            {k.key_id for k in (_tenant_keys.get((p.tenant_id, p.cipher)) for p in payloads) if k is not None}
        )
        heads, live_ids = _lock_heads(
            sorted({p.record.stream for p in payloads}), cached_ids, check_deferred=db.in_pre_commit
        )
        keys = _keys_for(payloads, live_ids)
        for pending in payloads:
            record, head = pending.record, heads[pending.record.stream]
            data_key, raw_key = keys[(pending.tenant_id, pending.cipher)]
            nonce = os.urandom(crypto.NONCE_BYTES)
            record.seq = head.seq + 1
            record.key_id = data_key.key_id
            record.nonce = base64.b64encode(nonce).decode("ascii")
            record.prev_hash = head.hash
            header = record_header(record)
            record.ciphertext = crypto.seal(
                pending.cipher, raw_key, nonce, pending.plaintext, chain.canonical_json(header)
            )
            record.hash = chain.record_hash(head.hash, header, record.ciphertext)
            head.seq, head.hash = record.seq, record.hash
        records = [p.record for p in payloads]
        if connection.vendor == "postgresql" and len(records) < _COPY_FROM:
            # One round trip: the heads' UPDATE runs as a WITH of the records' INSERT (neither reads the other's
            # rows; no trigger on the heads looks at the records).
            insert_instances(records, returning_ids=True, with_first=_move_heads_statement(list(heads.values())))
        else:
            _insert_records(records)
            _move_heads(list(heads.values()))
    except Exception as exc:
        raise_alert(
            event="audit.write_failed",
            message=f"could not write {len(payloads)} audit record(s): {exc!r}; the change they audit is rolled back",
            details={"actions": sorted({p.record.action for p in payloads})},
        )
        raise
    urgent = {p.record.stream for p in payloads if p.record.action in events.WITNESS_AT_COMMIT}
    for head in heads.values():
        if head.stream in urgent or head.seq - head.checkpoint_seq >= conf.checkpoint_every_records():
            after_commit(lambda stream=head.stream: checkpoint_after_commit(stream))
    if conf.siem_url():
        forward_on_commit(records, after_commit=after_commit)


# Above this many records in one transaction (a scheduling cycle, an array) COPY beats a multi-row INSERT: Django's
# bulk_create spends ~0.4 ms of Python per row building and splitting the statement (and a plain INSERT still
# prepares each value in Python).
_COPY_FROM = 64


def _insert_records(records: list[AuditRecord]) -> None:
    """Insert ``records`` (filling in their primary keys): one multi-row INSERT, or on PostgreSQL for a large
    batch, ids drawn from the sequence and the rows sent with COPY (``kernel.db.bulk``)."""
    ids = reserve_ids(AuditRecord, len(records)) if len(records) >= _COPY_FROM else None
    if ids is None:
        # A few records (a request's): one plain INSERT … RETURNING, without bulk_create's composition.
        insert_instances(records, returning_ids=True)
        return
    for record, pk in zip(records, ids, strict=True):
        record.pk = pk
    columns = [field.attname for field in AuditRecord._meta.concrete_fields]
    insert_rows(AuditRecord, columns, [[getattr(record, column) for column in columns] for record in records])
    mark_saved(records)


def _move_heads_statement(heads: list[ChainHead]) -> tuple[str, list]:
    """The PostgreSQL UPDATE that moves ``heads`` to their new (seq, hash), with its parameters."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    sql = (
        f"UPDATE {ChainHead._meta.db_table} AS h SET seq = v.seq, hash = v.hash, updated_at = %s FROM (VALUES "
        + ", ".join(["(%s, %s::bigint, %s)"] * len(heads))
        + ") AS v(stream, seq, hash) WHERE h.stream = v.stream"
    )
    return sql, [now, *[value for head in heads for value in (head.stream, head.seq, head.hash)]]


def _move_heads(heads: list[ChainHead]) -> None:
    table = ChainHead._meta.db_table
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(*_move_heads_statement(heads))
        else:
            for head in heads:
                cursor.execute(
                    f"UPDATE {table} SET seq = %s, hash = %s, updated_at = %s WHERE stream = %s",
                    [head.seq, head.hash, now, head.stream],
                )


precommit.register(PRE_COMMIT_KEY, _link_and_insert)


def _tenant_id(tenant: Any) -> int | None:
    if tenant is None:
        return None
    if isinstance(tenant, int):
        return tenant
    return getattr(tenant, "pk", None)


def _streams(tenant_id: int | None, actor_role: str) -> list[str]:
    if tenant_id is None:
        return [PLATFORM_STREAM]
    if actor_role in _PLATFORM_ROLES:
        return [tenant_stream(tenant_id), PLATFORM_STREAM]
    return [tenant_stream(tenant_id)]


def audit_record(
    *,
    action: str,
    actor: Any | None,
    tenant: Any | None = None,
    target: str = "",
    outcome: str = "success",
    details: dict | None = None,
    request: Any | None = None,
) -> AuditRecord:
    """Record that ``actor`` did ``action`` on ``target`` (within ``tenant``) with ``outcome``.

    ``details`` holds before/after values (sealed, readable only by auditors). ``request`` — a DRF Request,
    Django HttpRequest or ASGI scope — supplies IP, user agent and request id; without it, the origin of the
    request being served (set by ``audit.context.RequestIdMiddleware``) is used. ``actor`` None means the
    system itself.

    Call it inside the transaction of the change it records. The record is written in that transaction and
    linked into its stream's hash chain just before the COMMIT (its ``seq``, ``hash`` and ``pk`` are filled in
    then, on the returned object); if that fails, the whole transaction rolls back and the error propagates.
    Returns the record of the tenant's stream (or of the platform stream when there is no tenant).
    Raises (and alerts) at once when the event is unknown or its details cannot be encoded.
    """
    try:
        with transaction.atomic(savepoint=False):
            pending = _pending_records(
                action=action,
                actor=actor,
                tenant=tenant,
                target=target,
                outcome=outcome,
                details=details,
                request=request,
            )
            for item in pending:
                connection.defer_to_commit(PRE_COMMIT_KEY, item)
            return pending[0].record
    except Exception as exc:
        raise_alert(
            event="audit.write_failed",
            message=f"could not write audit record {action!r}: {exc!r}; the change it audits is rolled back",
            details={"action": action, "target": target},
        )
        raise


def _pending_records(
    *, action: str, actor: Any, tenant: Any, target: str, outcome: str, details: dict | None, request: Any
) -> list[_Pending]:
    events.lookup(action)
    origin: Origin = request_origin(request) if request is not None else (current_origin() or Origin())
    actor_id = getattr(actor, "pk", None) if actor is not None else None
    actor_role = (getattr(actor, "platform_role", "") or "") if actor is not None else ""
    tenant_id = _tenant_id(tenant)
    fields = {
        "event_id": uuid.uuid4().hex,
        "created_at": timezone.now(),
        "actor_id": actor_id,
        "actor_username": (getattr(actor, "username", "") or "")[:150] if actor is not None else "",
        "actor_role": str(actor_role)[:32],
        "actor_ip": _clean_ip(origin.ip),
        "user_agent": origin.user_agent[:300],
        "tenant_id": tenant_id,
        "action": action[:64],
        "target": str(target)[:200],
        "outcome": str(outcome)[:16],
        "request_id": origin.request_id[:64],
    }
    cipher = conf.cipher()
    plaintext = _json_encoder.encode({"details": details or {}}).encode("utf-8")
    # Details about a tenant are sealed under the tenant's key in every stream, so shredding the tenant's keys
    # makes them unreadable everywhere.
    return [
        _Pending(
            record=AuditRecord(stream=stream, cipher=cipher, **fields),
            tenant_id=tenant_id,
            cipher=cipher,
            plaintext=plaintext,
        )
        for stream in _streams(tenant_id, actor_role)
    ]
