"""Writes to the audit trail. ``audit_record`` is the one entry point every app calls.

Call it inside the service's transaction: the record (and its hash-chain link) commits together with the change,
or neither does. If the record cannot be written, the exception propagates and the caller's transaction fails —
nothing changes unaudited — and an alert is raised (PCI DSS 10.7.2).

Records are queued in the transaction and linked into their per-stream hash chains just before COMMIT
(``kernel.db.precommit``): the chain-head rows are the last locks a transaction takes, in stream order, and
are held only for the commit. There is no global audit lock; see docs/locking.md for the project's lock order.

One module per seam, each importing only the ones above it in this list (imports run one way):

- ``alerting``: ``raise_alert`` (log, store, hook);
- ``records``: a record's canonical header, opening its sealed details, the data-key cache;
- ``checkpoints``: signing stream heads and having the witness cosign them;
- ``append``: ``audit_record`` and the pre-commit step that seals, chains and inserts;
- ``alert_review``, ``keys``, ``retention``: the audited services (acknowledging alerts; rotating the signing and
  master keys; legal holds, crypto-shredding, purging).

This package re-exports the names other apps use, so ``from audit.services import audit_record`` is the import.
"""

from audit.services.alert_review import alert_acknowledge
from audit.services.alerting import raise_alert
from audit.services.append import audit_record
from audit.services.checkpoints import checkpoint_all, checkpoint_create, compact_range_at, witness_genesis
from audit.services.keys import data_keys_rotate, signing_key_rotate
from audit.services.records import (
    SEAL_BROKEN,
    SHREDDED,
    details_for,
    open_details,
    record_details,
    record_header,
    record_view,
)
from audit.services.retention import legal_hold_place, legal_hold_release, records_purge, tenant_keys_shred

__all__ = [
    "SEAL_BROKEN",
    "SHREDDED",
    "alert_acknowledge",
    "audit_record",
    "checkpoint_all",
    "checkpoint_create",
    "compact_range_at",
    "data_keys_rotate",
    "details_for",
    "legal_hold_place",
    "legal_hold_release",
    "open_details",
    "raise_alert",
    "record_details",
    "record_header",
    "record_view",
    "records_purge",
    "signing_key_rotate",
    "tenant_keys_shred",
    "witness_genesis",
]
