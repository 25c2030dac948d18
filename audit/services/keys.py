"""Key rotation: the checkpoint signing key (through a rotation statement the witness accepts) and the master key
that wraps the data keys."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from audit import conf, crypto, witness
from audit import transparency as tp
from audit.models import ChainHead, DataKey, KeyRotation
from audit.services.append import audit_record
from audit.services.checkpoints import checkpoint_all, witness_genesis, witness_pending
from audit.services.records import iso_utc, raw_data_key
from audit.signing import Ed25519Signer, get_signer
from kernel.api import ConflictError


def signing_key_rotate(*, actor: Any | None, new_seed: bytes) -> dict[str, Any]:
    """Rotate the checkpoint signing key: a rotation statement naming the new key, signed by the current one, is
    accepted by the witness (which refuses it unless the current key is the log's newest) and kept here. Then set
    ``GPUPOOL_AUDIT_SIGNING_KEY`` to the new seed and restart. Returns the rotation."""
    old, new = get_signer(), Ed25519Signer(new_seed)
    client = witness.get_witness()
    log = witness.log_id()
    with transaction.atomic():
        checkpoint_all()
    witness_pending(list(ChainHead.objects.values_list("stream", flat=True)))
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
        at=iso_utc(timezone.now()),
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


def data_keys_rotate(*, actor: Any | None) -> int:
    """Re-wrap every live data key under the newest master key (records are not touched). Returns the count."""
    active_id = conf.master_keys()[-1][0]
    with transaction.atomic():
        count = 0
        for data_key in (
            DataKey.objects.select_for_update().filter(destroyed_at__isnull=True).exclude(master_key_id=active_id)
        ):
            raw = raw_data_key(data_key)
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
