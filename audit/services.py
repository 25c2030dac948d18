"""Writes to the audit trail. ``audit_record`` is the one entry point every app calls.

Call it inside the service's transaction: the record (and its hash-chain link) commits together with the change,
or neither does. If the record cannot be written, the exception propagates and the caller's transaction fails —
nothing changes unaudited — and an alert is raised (PCI DSS 10.7.2).

Records are queued in the transaction and linked into their per-stream hash chains just before COMMIT
(``portal.db.precommit``): the chain-head rows are the last locks a transaction takes, in stream order, and
are held only for the commit. There is no global audit lock; see docs/locking.md for the project's lock order.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import logging
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import OperationalError, connection, transaction
from django.db.models import F, Max, Q
from django.utils import timezone
from django.utils.module_loading import import_string

from audit import chain, conf, crypto, events, witness
from audit import transparency as tp
from audit import witness_service as ws_errors
from audit.alerts import alert_store, may_take
from audit.context import Origin, current_origin, request_origin
from audit.models import (
    PLATFORM_STREAM,
    Alert,
    AuditRecord,
    ChainHead,
    Checkpoint,
    Cosignature,
    DataKey,
    KeyRotation,
    LegalHold,
    Outcome,
    SigningKey,
    Tombstone,
    tenant_stream,
)
from audit.signing import get_signer
from portal.api import ConflictError, DomainError, PermissionDeniedError
from portal.db import precommit
from portal.db.bulk import insert_instances, insert_rows, mark_saved, reserve_ids
from portal.policy import Action

logger = logging.getLogger(__name__)
alert_logger = logging.getLogger("audit.alert")

SHREDDED = "[shredded]"
SEAL_BROKEN = "[seal broken]"
_PLATFORM_ROLES = {"system_admin", "security_admin", "auditor"}
_json_encoder = DjangoJSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- alerts -----------------------------------------------------------------------------------------------


def raise_alert(*, event: str, message: str, details: dict | None = None) -> None:
    """Log at CRITICAL, keep the alert for the console's alerts page (``audit.alerts``) and call the optional hook
    (``GPUPOOL_AUDIT_ALERT_HOOK``: a dotted path to a callable ``hook(event: str, message: str, details: dict)``).
    A broken hook or store is logged, never raised."""
    alert_logger.critical("%s: %s", event, message, extra={"audit_event": event, "audit_details": details or {}})
    alert_store(event=event, message=message, details=details)
    path = conf.alert_hook_path()
    if not path:
        return
    try:
        import_string(path)(event, message, details or {})
    except Exception:
        alert_logger.exception("audit alert hook %s failed", path)


def alert_acknowledge(*, alert: Alert, actor: Any, request: Any | None = None) -> Alert:
    """Mark an open alert as seen and handled by ``actor`` (platform admins: ``alert.acknowledge``); audited.
    Acknowledging it again changes nothing. If it is raised again later, it opens a new alert."""
    if not may_take(actor, Action.ALERT_ACKNOWLEDGE):
        raise PermissionDeniedError("Only a system or security admin acknowledges alerts.")
    with transaction.atomic():
        alert = Alert.objects.select_for_update().get(pk=alert.pk)
        if alert.acknowledged_at is not None:
            return alert
        alert.acknowledged_at = timezone.now()
        alert.acknowledged_by_id = actor.pk
        alert.acknowledged_by_username = actor.get_username()
        alert.save(update_fields=["acknowledged_at", "acknowledged_by_id", "acknowledged_by_username"])
        audit_record(
            action="alert.acknowledge",
            actor=actor,
            target=f"alert:{alert.pk}",
            details={"event": alert.event, "times_raised": alert.times_raised},
            request=request,
        )
    return alert


# --- building a record ------------------------------------------------------------------------------------


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="microseconds")


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


def record_header(record: AuditRecord) -> dict[str, Any]:
    """The canonical header of a stored record (what its hash and its AEAD associated data cover)."""
    created = record.created_at
    return {
        "v": chain.HEADER_VERSION,
        "stream": record.stream,
        "seq": record.seq,
        "event_id": record.event_id,
        "time": _iso(created) if isinstance(created, dt.datetime) else str(created),
        "actor_id": record.actor_id,
        "actor_username": record.actor_username,
        "actor_role": record.actor_role,
        "actor_ip": record.actor_ip,
        "user_agent": record.user_agent,
        "tenant_id": record.tenant_id,
        "action": record.action,
        "target": record.target,
        "outcome": record.outcome,
        "request_id": record.request_id,
        "cipher": record.cipher,
        "key_id": record.key_id,
        "nonce": record.nonce,
    }


# --- data keys --------------------------------------------------------------------------------------------

# key_id → (master_key_id, wrapped bytes, raw key). Checked against the row on every use, so a re-wrapped or
# destroyed key (or a rolled-back test database) is never served stale.
_key_cache: dict[str, tuple[str, bytes, bytes]] = {}


def _raw_key(data_key: DataKey) -> bytes:
    wrapped = bytes(data_key.wrapped_key)
    if data_key.destroyed_at is not None or not wrapped:
        raise crypto.KeyUnavailable(f"data key {data_key.key_id} was destroyed")
    cached = _key_cache.get(data_key.key_id)
    if cached is not None and cached[0] == data_key.master_key_id and cached[1] == wrapped:
        return cached[2]
    raw = crypto.unwrap_data_key(
        key_id=data_key.key_id,
        tenant_id=data_key.tenant_id,
        cipher=data_key.cipher,
        master_key_id=data_key.master_key_id,
        wrapped=wrapped,
    )
    _key_cache[data_key.key_id] = (data_key.master_key_id, wrapped, raw)
    return raw


def open_details(record: AuditRecord, data_key: DataKey | None) -> dict | str:
    """The record's details, ``"[shredded]"`` when its key was destroyed, ``"[seal broken]"`` if tampered."""
    if data_key is None:
        return SHREDDED
    try:
        raw = _raw_key(data_key)
    except crypto.KeyUnavailable:
        return SHREDDED
    try:
        plaintext = crypto.open_sealed(
            record.cipher,
            raw,
            base64.b64decode(record.nonce),
            bytes(record.ciphertext),
            chain.canonical_json(record_header(record)),
        )
    except crypto.SealBroken:
        return SEAL_BROKEN
    return json.loads(plaintext)["details"]


def record_view(record: AuditRecord, details: dict | str) -> dict[str, Any]:
    """A record as an auditor reads it: the header fields, the opened ``details`` and the chain fields."""
    return {
        "id": record.pk,
        **record_header(record),
        "created_at": record.created_at,
        "details": details,
        "prev_hash": record.prev_hash,
        "hash": record.hash,
    }


def record_details(record: AuditRecord) -> dict | str:
    """The opened details (before/after dict) of one record, ``"[shredded]"`` after crypto-shredding or
    ``"[seal broken]"`` if tampered. Only auditors' code paths (selectors, exports) and tests call this."""
    return open_details(record, DataKey.objects.filter(key_id=record.key_id).first())


def details_for(records: Iterable[AuditRecord]) -> dict[int, dict | str]:
    """Details of many records with one query for their keys."""
    records = list(records)
    keys = {k.key_id: k for k in DataKey.objects.filter(key_id__in={r.key_id for r in records})}
    return {r.pk: open_details(r, keys.get(r.key_id)) for r in records}


# --- appending --------------------------------------------------------------------------------------------
#
# ``audit_record`` validates the event, encodes its details and queues one pending record per stream on the
# connection; ``_link_and_insert`` runs just before COMMIT (portal/db/precommit.py). It locks the chain-head
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
        keys[tenant_id] = (data_key, _raw_key(data_key))
    for tenant_id in tenant_ids - keys.keys():
        key_id = uuid.uuid4().hex
        raw = crypto.new_data_key(cipher)
        master_id, wrapped = crypto.wrap_data_key(key_id=key_id, tenant_id=tenant_id, cipher=cipher, data_key=raw)
        data_key = DataKey.objects.create(
            key_id=key_id, tenant_id=tenant_id, cipher=cipher, master_key_id=master_id, wrapped_key=wrapped
        )
        _key_cache[key_id] = (master_id, wrapped, raw)
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
                keys[wanted] = (cached, _raw_key(cached))
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
            after_commit(lambda stream=head.stream: _checkpoint_after_commit(stream))
    if conf.siem_url():
        from audit.siem import forward_on_commit

        forward_on_commit(records, after_commit=after_commit)


# Above this many records in one transaction (a scheduling cycle, an array) COPY beats a multi-row INSERT: Django's
# bulk_create spends ~0.4 ms of Python per row building and splitting the statement (and a plain INSERT still
# prepares each value in Python).
_COPY_FROM = 64


def _insert_records(records: list[AuditRecord]) -> None:
    """Insert ``records`` (filling in their primary keys): one multi-row INSERT, or on PostgreSQL for a large
    batch, ids drawn from the sequence and the rows sent with COPY (``portal.db.bulk``)."""
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


# --- checkpoints ------------------------------------------------------------------------------------------


def _remember_signer_key() -> None:
    signer = get_signer()
    SigningKey.objects.get_or_create(
        key_id=signer.key_id, defaults={"algorithm": signer.algorithm, "public_key_pem": signer.public_key_pem()}
    )


CHECKPOINT_LOCK_TIMEOUT_MS = 1000


def _lock_head_briefly(stream: str) -> ChainHead | None:
    """The stream's head row FOR UPDATE, waiting at most ``CHECKPOINT_LOCK_TIMEOUT_MS``: an append holds it only
    for its COMMIT, so a longer wait means something holds it for long, and a checkpoint run (on the worker, every
    few seconds) must not queue the worker's other tasks behind it. None when it stays locked: the next run
    retries. Call inside a transaction."""
    query = ChainHead.objects.select_for_update().filter(stream=stream)
    if connection.vendor != "postgresql":
        return query.first()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
            [f"{CHECKPOINT_LOCK_TIMEOUT_MS}ms"],
        )
        previous = cursor.fetchone()[0]
    try:
        with transaction.atomic():  # a savepoint: a lock timeout rolls back only this statement
            return query.first()
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
            raise
        logger.info("audit: the head of %s stayed locked; it is checkpointed on the next run", stream)
        return None
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


def _note(signer: Any, body: str) -> str:
    """``body`` as a C2SP signed note by the log's key (the configured signer, whatever its backend)."""
    name = tp.log_key_name(witness.log_id())
    public_raw = tp.raw_public_key(signer.public_key_pem())
    blob = tp.key_hash(name, tp.ALG_ED25519, public_raw) + base64.b64decode(signer.sign(body.encode("utf-8")))
    return f"{body}\n{tp.NOTE_DASH} {name} {base64.b64encode(blob).decode('ascii')}\n"


def _hashes(stream: str, first: int, last: int) -> list[str]:
    """The record hashes of ``stream`` from seq ``first`` to ``last``; raises when any is missing."""
    if last < first:
        return []
    hashes = list(
        AuditRecord.objects.filter(stream=stream, seq__gte=first, seq__lte=last)
        .order_by("seq")
        .values_list("hash", flat=True)
    )
    if len(hashes) != last - first + 1:
        raise RuntimeError(f"{stream}: records seq {first}..{last} are incomplete ({len(hashes)} found)")
    return hashes


def compact_range_at(stream: str, size: int) -> tp.CompactRange:
    """The stream's tree at ``size`` leaves: the compact range of the newest checkpoint at or below it, extended
    by the records after that checkpoint."""
    base = (
        Checkpoint.objects.filter(stream=stream, seq__lte=size).exclude(compact_range="").order_by("-seq").first()
        if size
        else None
    )
    found = tp.CompactRange.decode(base.compact_range) if base else tp.CompactRange.empty()
    found.extend(tp.leaf_hash(h) for h in _hashes(stream, found.size + 1, size))
    return found


def _checkpoint_stream(stream: str) -> Checkpoint | None:
    """Sign the head of ``stream``: the Merkle root of its records since the previous checkpoint and the root of its
    whole RFC 6962 tree, as a C2SP checkpoint note, in its own transaction (the head row locked FOR UPDATE for that
    moment only). None when nothing was appended since."""
    signer = get_signer()
    with transaction.atomic():
        head = _lock_head_briefly(stream)
        if head is None or head.seq <= head.checkpoint_seq:
            return None
        from_seq = head.checkpoint_seq + 1
        try:
            tree = compact_range_at(stream, head.checkpoint_seq)
            hashes = _hashes(stream, from_seq, head.seq)
        except RuntimeError as exc:
            raise_alert(event="audit.checkpoint_failed", message=f"not signing {stream}: {exc}", details={})
            return None
        tree.extend(tp.leaf_hash(h) for h in hashes)
        fields = {
            "stream": stream,
            "from_seq": from_seq,
            "seq": head.seq,
            "head_hash": head.hash,
            "merkle_root": chain.merkle_root(hashes),
            "signed_at": _iso(timezone.now()),
            "key_id": signer.key_id,
        }
        body = tp.Checkpoint(
            origin=tp.origin(witness.log_id(), stream),
            size=head.seq,
            root=tree.root(),
            head=head.hash,
            segment_from=from_seq,
            segment_root=fields["merkle_root"],
            time=fields["signed_at"],
        ).body()
        checkpoint = Checkpoint.objects.create(
            **fields,
            algorithm=signer.algorithm,
            signature=signer.sign(chain.checkpoint_payload(fields)),
            tree_root=tree.root().hex(),
            compact_range=tree.encode(),
            note=_note(signer, body),
        )
        ChainHead.objects.filter(stream=stream).update(checkpoint_seq=head.seq)
        _remember_signer_key()
    return checkpoint


# (witness, log id) → the witness's key, once this process has seen the log's genesis there: a checkpoint run
# (every second) then asks the witness nothing but to cosign.
_known_logs: dict[tuple[str, str], str] = {}


def _witness_key(client: Any) -> str:
    known = (witness.describe(), witness.log_id())
    if known not in _known_logs:
        _known_logs[known] = witness_genesis(client)["statement"]["witness_key"]
    return _known_logs[known]


def witness_genesis(client: Any | None = None) -> dict[str, Any]:
    """This log's genesis entry in the witness, made on first contact with the configured signing key as the root
    (what ``audit_trust_root`` prints for the auditor to pin)."""
    client = client or witness.get_witness()
    log = witness.log_id()
    try:
        return client.state(log)["genesis"]
    except witness.WitnessError as exc:
        if not isinstance(exc, ws_errors.UnknownLog):
            raise
    return client.genesis(log, get_signer().public_key_pem())


def _submit(client: Any, stream: str, old_size: int, checkpoint: Checkpoint) -> str:
    """Send one checkpoint with its consistency proof from ``old_size``; on a 409 retry once from the witness's
    size (a checkpoint the witness cosigned whose cosignature was not stored)."""
    for attempt in range(2):
        proof = tp.consistency_proof(
            compact_range_at(stream, old_size),
            [tp.leaf_hash(h) for h in _hashes(stream, old_size + 1, checkpoint.seq)],
        )
        try:
            return client.add_checkpoint(old_size, proof, checkpoint.note)
        except witness.Conflict as conflict:
            if attempt or conflict.size is None or conflict.size >= checkpoint.seq or conflict.size == old_size:
                raise
            old_size = conflict.size
    raise AssertionError("unreachable")


def _witness_pending(streams: list[str]) -> int:
    """Have the witness cosign every committed checkpoint of ``streams`` it has not cosigned yet (above the head's
    ``witnessed_seq``), in order, each with its RFC 9162 consistency proof, and store the cosignatures. A checkpoint
    whose cosigning failed (a crash, a witness outage) is sent by the next run. Returns the number cosigned."""
    behind = dict(
        ChainHead.objects.filter(stream__in=streams, checkpoint_seq__gt=F("witnessed_seq")).values_list(
            "stream", "witnessed_seq"
        )
    )
    if not behind:
        return 0
    client = witness.get_witness()
    cosigned = 0
    try:
        witness_key = _witness_key(client)
    except witness.WitnessError as exc:
        raise_alert(
            event="audit.witness_failed",
            message=f"could not reach {witness.describe()}: {exc}; the next checkpoint run retries",
            details={"streams": sorted(behind)},
        )
        return 0
    for stream, witnessed_seq in sorted(behind.items()):
        old_size = witnessed_seq
        for checkpoint in Checkpoint.objects.filter(stream=stream, seq__gt=witnessed_seq).order_by("seq"):
            try:
                line = _submit(client, stream, old_size, checkpoint)
            except (witness.WitnessError, RuntimeError, tp.ProofError) as exc:
                raise_alert(
                    event="audit.witness_failed",
                    message=f"{witness.describe()} refused the checkpoint of {stream} at seq {checkpoint.seq}: {exc}",
                    details={"stream": stream, "seq": checkpoint.seq},
                )
                break
            Cosignature.objects.get_or_create(
                stream=stream, seq=checkpoint.seq, defaults={"witness_key": witness_key, "cosignature": line}
            )
            ChainHead.objects.filter(stream=stream, witnessed_seq__lt=checkpoint.seq).update(
                witnessed_seq=checkpoint.seq
            )
            old_size = checkpoint.seq
            cosigned += 1
    return cosigned


def _checkpoint_after_commit(stream: str) -> None:
    checkpoint_create(stream=stream)
    _witness_pending([stream])  # outside any transaction here: on_commit would run it at once anyway


def checkpoint_create(*, stream: str) -> Checkpoint | None:
    """Sign the head of ``stream`` (see ``_checkpoint_stream``) and have the witness cosign it once committed.
    None when nothing was appended since the last checkpoint."""
    checkpoint = _checkpoint_stream(stream)
    transaction.on_commit(lambda: _witness_pending([stream]))
    return checkpoint


def checkpoint_all() -> list[Checkpoint]:
    """Seal every stream whose head moved since its last checkpoint, and send the witness what it has not cosigned.
    Beat runs this every ``GPUPOOL_AUDIT_CHECKPOINT_SECONDS`` and the worker on shutdown, so it is one indexed
    query on the (one row per stream) head table when nothing changed."""
    streams = list(
        ChainHead.objects.filter(Q(seq__gt=F("checkpoint_seq")) | Q(checkpoint_seq__gt=F("witnessed_seq")))
        .order_by("stream")
        .values_list("stream", flat=True)
    )
    if not streams:
        return []
    made = [c for c in (_checkpoint_stream(stream) for stream in streams) if c is not None]
    transaction.on_commit(lambda: _witness_pending(streams))
    return made


def signing_key_rotate(*, actor: Any | None, new_seed: bytes) -> dict[str, Any]:
    """Rotate the checkpoint signing key: a rotation statement naming the new key, signed by the current one, is
    accepted by the witness (which refuses it unless the current key is the log's newest) and kept here. Then set
    ``GPUPOOL_AUDIT_SIGNING_KEY`` to the new seed and restart. Returns the rotation."""
    from audit.signing import Ed25519Signer

    old, new = get_signer(), Ed25519Signer(new_seed)
    client = witness.get_witness()
    log = witness.log_id()
    with transaction.atomic():
        checkpoint_all()
    _witness_pending(list(ChainHead.objects.values_list("stream", flat=True)))
    genesis = witness_genesis(client)
    state = client.state(log)
    keys = tp.key_chain(genesis["statement"]["root_key_pem"], state["rotations"])
    if keys[-1][0] != old.key_id:
        raise ConflictError(
            f"the configured signing key {old.key_id} is not the log's current key {keys[-1][0]}: rotate from the "
            "current key",
            code="not_current_key",
        )
    statement = tp.rotation_statement(
        log_id=log,
        number=len(keys),
        previous_key_id=old.key_id,
        public_key_pem=new.public_key_pem(),
        at=_iso(timezone.now()),
    )
    rotation = {"statement": statement, "signature": old.sign(tp.rotation_payload(statement))}
    client.add_rotation(log, rotation)
    with transaction.atomic():
        KeyRotation.objects.create(number=statement["number"], statement=statement, signature=rotation["signature"])
        audit_record(
            action="audit.signing_key.rotate",
            actor=actor,
            target=f"signing_key:{new.key_id}",
            details={"previous_key_id": old.key_id, "key_id": new.key_id, "number": statement["number"]},
        )
    return rotation


# --- keys -------------------------------------------------------------------------------------------------


def data_keys_rotate(*, actor: Any | None) -> int:
    """Re-wrap every live data key under the newest master key (records are not touched). Returns the count."""
    active_id = conf.master_keys()[-1][0]
    with transaction.atomic():
        count = 0
        for data_key in (
            DataKey.objects.select_for_update().filter(destroyed_at__isnull=True).exclude(master_key_id=active_id)
        ):
            raw = _raw_key(data_key)
            master_id, wrapped = crypto.wrap_data_key(
                key_id=data_key.key_id, tenant_id=data_key.tenant_id, cipher=data_key.cipher, data_key=raw
            )
            data_key.master_key_id, data_key.wrapped_key, data_key.rewrapped_at = master_id, wrapped, timezone.now()
            data_key.save(update_fields=["master_key_id", "wrapped_key", "rewrapped_at"])
            count += 1
        audit_record(
            action="audit.key.rotate",
            actor=actor,
            target=f"master_key:{active_id}",
            details={"rewrapped": count, "master_key_id": active_id},
        )
    return count


def _active_hold(tenant_id: int | None) -> LegalHold | None:
    return LegalHold.objects.filter(tenant_id=tenant_id, released_at__isnull=True).first()


def tenant_keys_shred(*, actor: Any | None, tenant_id: int, now: dt.datetime | None = None) -> int:
    """Destroy a tenant's data keys at the end of retention (crypto-shredding). Its records stay in the chain
    (hashes cover ciphertext, so the chain still verifies) but their details read as "[shredded]".

    Refused while the tenant is under legal hold or still has records inside the retention period. The
    destruction is itself a chain event: an ``audit.key.shred`` record naming the tenant and every key id is
    written in the same transaction, in the platform stream and sealed under the platform key (so it stays
    readable after the tenant's keys are gone), and the platform stream is checkpointed and witnessed right after
    the commit. ``audit_verify`` and the offline verifier fail on any destroyed key no such record names.
    Runs as the audit-admin database role (the portal's role cannot UPDATE data keys; docs/audit.md).
    """
    now = now or timezone.now()
    with transaction.atomic():
        hold = _active_hold(tenant_id)
        if hold is not None:
            raise ConflictError(
                f"Tenant {tenant_id} is under legal hold ({hold.reason!r}); release the hold before shredding.",
                code="legal_hold",
            )
        newest = AuditRecord.objects.filter(tenant_id=tenant_id).aggregate(newest=Max("created_at"))["newest"]
        keep_until = newest + dt.timedelta(days=conf.retention_days()) if newest else None
        if keep_until is not None and keep_until > now:
            raise ConflictError(
                f"Tenant {tenant_id} has audit records inside the {conf.retention_days()}-day retention period "
                f"until {keep_until:%Y-%m-%d}; shred after that date.",
                code="inside_retention",
            )
        keys = list(
            DataKey.objects.select_for_update().filter(tenant_id=tenant_id, destroyed_at__isnull=True).order_by("pk")
        )
        # The record first: no key is destroyed without it (it commits with the destruction or neither does).
        audit_record(
            action="audit.key.shred",
            actor=actor,
            target=f"tenant:{tenant_id}",
            details={"tenant_id": tenant_id, "key_ids": [k.key_id for k in keys], "destroyed_at": _iso(now)},
        )
        for data_key in keys:
            data_key.wrapped_key, data_key.destroyed_at = b"", now
            data_key.save(update_fields=["wrapped_key", "destroyed_at"])
            _key_cache.pop(data_key.key_id, None)
        transaction.on_commit(lambda: checkpoint_create(stream=PLATFORM_STREAM))
    return len(keys)


def legal_hold_place(*, actor: Any | None, tenant_id: int | None, reason: str) -> LegalHold:
    if not reason.strip():
        raise DomainError("Give the reason for the legal hold (case or request number).", field="reason")
    with transaction.atomic():
        existing = _active_hold(tenant_id)
        if existing is not None:
            return existing
        hold = LegalHold.objects.create(
            tenant_id=tenant_id, reason=reason, placed_by=getattr(actor, "username", "") or ""
        )
        audit_record(
            action="audit.legal_hold.set",
            actor=actor,
            tenant=tenant_id,
            target=f"legal_hold:{hold.pk}",
            details={"reason": reason},
        )
    return hold


def legal_hold_release(*, actor: Any | None, tenant_id: int | None) -> int:
    with transaction.atomic():
        holds = list(LegalHold.objects.filter(tenant_id=tenant_id, released_at__isnull=True))
        for hold in holds:
            hold.released_at = timezone.now()
            hold.save(update_fields=["released_at"])
            audit_record(
                action="audit.legal_hold.release", actor=actor, tenant=tenant_id, target=f"legal_hold:{hold.pk}"
            )
    return len(holds)


# --- purge ------------------------------------------------------------------------------------------------


def records_purge(*, actor: Any | None, now: dt.datetime | None = None) -> list[Tombstone]:
    """Remove records older than the retention period and not under legal hold, leaving a signed tombstone per
    stream. Purges stop at a checkpoint boundary, so the tombstone names a signed head and the verifier starts
    the chain there. Runs as the audit-admin database role (the portal's role cannot DELETE records; see
    docs/audit.md). Returns the tombstones written."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=conf.retention_days())
    signer = get_signer()
    tombstones: list[Tombstone] = []
    with transaction.atomic():
        # Every head, in stream order: no record may be appended to a stream while it is being cut.
        list(ChainHead.objects.select_for_update().order_by("stream"))
        held = set(LegalHold.objects.filter(released_at__isnull=True).values_list("tenant_id", flat=True))
        for head in ChainHead.objects.order_by("stream"):
            stream_tenant = None if head.stream == PLATFORM_STREAM else int(head.stream.split(":", 1)[1])
            if stream_tenant in held:
                continue
            last = Tombstone.objects.filter(stream=head.stream).order_by("-through_seq").first()
            start = last.through_seq if last else 0
            limit_seq = None
            held_tenants = {t for t in held if t is not None}
            if head.stream == PLATFORM_STREAM and held_tenants:
                # Platform copies of actions on a held tenant's objects are held too.
                limit_seq = (
                    AuditRecord.objects.filter(stream=head.stream, seq__gt=start, tenant_id__in=held_tenants)
                    .order_by("seq")
                    .values_list("seq", flat=True)
                    .first()
                )
            old_seqs = AuditRecord.objects.filter(stream=head.stream, seq__gt=start, created_at__lt=cutoff)
            newest_old = old_seqs.aggregate(top=Max("seq"))["top"]
            if newest_old is None:
                continue
            # Only a checkpoint the witness cosigned: the witness accepts a purge only of what it has seen.
            cosigned = Cosignature.objects.filter(stream=head.stream).values("seq")
            candidates = Checkpoint.objects.filter(
                stream=head.stream, seq__gt=start, seq__lte=newest_old, seq__in=cosigned
            )
            if limit_seq is not None:
                candidates = candidates.filter(seq__lt=limit_seq)
            checkpoint = candidates.order_by("-seq").first()
            if checkpoint is None:
                continue
            doomed = AuditRecord.objects.filter(stream=head.stream, seq__gt=start, seq__lte=checkpoint.seq)
            purged = doomed.count()
            fields = {
                "stream": head.stream,
                "through_seq": checkpoint.seq,
                "through_hash": checkpoint.head_hash,
                "purged_count": purged + (last.purged_count if last else 0),
                "purged_at": _iso(now),
                "key_id": signer.key_id,
            }
            tombstone = Tombstone.objects.create(
                **fields, algorithm=signer.algorithm, signature=signer.sign(chain.tombstone_payload(fields))
            )
            # The tombstone first: the database's trigger lets a record be deleted only once a tombstone covers
            # it (migration 0003), so nothing but a purge that leaves signed proof can remove records.
            deleted, _ = doomed.delete()
            if deleted != purged:
                raise ConflictError(f"{head.stream}: expected to purge {purged} records, deleted {deleted}")
            tombstones.append(tombstone)
            # The witness records the purge before it commits: refused (or unreachable), nothing is purged.
            try:
                witness.get_witness().add_tombstone(witness.log_id(), tombstone.as_dict())
            except witness.WitnessError as exc:
                raise ConflictError(
                    f"{head.stream}: {witness.describe()} did not record the purge ({exc}); nothing was purged",
                    code="witness_refused",
                ) from exc
        _remember_signer_key()
        audit_record(
            action="audit.purge",
            actor=actor,
            target="audit",
            outcome=Outcome.SUCCESS,
            details={
                "cutoff": _iso(cutoff),
                "tombstones": [{"stream": t.stream, "through_seq": t.through_seq} for t in tombstones],
            },
        )
    return tombstones
