"""Checkpoints: signing each stream's head (a C2SP checkpoint note over its RFC 6962 tree) and having the
witness cosign it. Appends nothing to the trail itself, so appending can checkpoint after its COMMIT."""

from __future__ import annotations

import base64
import logging
from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from audit import chain, witness
from audit import transparency as tp
from audit import witness_service as ws_errors
from audit.models import AuditRecord, ChainHead, Checkpoint, Cosignature, SigningKey
from audit.services.alerting import raise_alert
from audit.services.records import iso_utc
from audit.signing import get_signer

logger = logging.getLogger(__name__)


def signer_key_remember() -> None:
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
            "signed_at": iso_utc(timezone.now()),
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
        signer_key_remember()
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


def witness_pending(streams: list[str]) -> int:
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


def checkpoint_after_commit(stream: str) -> None:
    checkpoint_create(stream=stream)
    witness_pending([stream])  # outside any transaction here: on_commit would run it at once anyway


def checkpoint_create(*, stream: str) -> Checkpoint | None:
    """Sign the head of ``stream`` (see ``_checkpoint_stream``) and have the witness cosign it once committed.
    None when nothing was appended since the last checkpoint."""
    checkpoint = _checkpoint_stream(stream)
    transaction.on_commit(lambda: witness_pending([stream]))
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
    transaction.on_commit(lambda: witness_pending(streams))
    return made
