"""Every sentence the audit trail's exports may show a user: a stable code and its English template
(``kernel.messages``).

Raise one as ``DomainError(messages.NAME(param=value))``; the console, the API and e-mail render it in the
reader's language from the template, which is the gettext msgid (translations: frontend/locale).
"""

from __future__ import annotations

from django.utils.translation import gettext_noop

from kernel.messages import Message

WITNESSS_LATEST_CHECKPOINT_NOT_DATABASE = Message(
    "audit.witnesss_latest_checkpoint_not_database",
    gettext_noop("%(stream)s: the witness's latest checkpoint is not in the database; run audit_verify."),
)
WITNESS_CANNOT_READ_EXPORT_MUST = Message(
    "audit.witness_cannot_read_export_must",
    gettext_noop("The witness cannot be read (%(error)s); an export must carry its statement."),
)
EXPORT_RANGE_EMPTY_MUST_AFTER = Message(
    "audit.export_range_empty_must_after",
    gettext_noop("The export range is empty: 'to' must be after 'from'."),
)

# --- what the stored trail's verifier finds (audit.trail_verifier), shown on the console's audit page
FINDING_NO_TRUST_ROOT_DATABASE_LOG = Message(
    "audit.finding_no_trust_root_database_log",
    gettext_noop(
        "%(value)s has no trust root for this database (%(value_2)s, log %(value_3)s), but the database has "
        "%(old_records)s records older than %(window_seconds)s s, %(checkpoints)s checkpoints, %(tombstones)s "
        "tombstones and %(checkpointed_heads)s checkpointed chain heads: the witness was lost or never reached, or "
        "the database was replaced. Point GPUPOOL_AUDIT_WITNESS_URL at the witness (or run with --no-witness, "
        "which cannot detect a rewrite)"
    ),
)
FINDING_CONFIGURED_SIGNING_KEY_NOT_CERTIFIED = Message(
    "audit.finding_configured_signing_key_not_certified",
    gettext_noop(
        "the configured signing key %(key_id)s is not certified by the trust root (keys %(value)s): the witness "
        "refuses what it signs; rotate to it with `gpupool audit_rotate_signing_key` from the current key"
    ),
)
FINDING_RECORDS_BEFORE_SEQ_EXIST_ALTHOUGH = Message(
    "audit.finding_records_before_seq_exist_although",
    gettext_noop("records before seq %(start_seq)s exist although a tombstone says they were purged"),
)
FINDING_CHAIN_TRUNCATED_RECORDS_SEQ_MISSING = Message(
    "audit.finding_chain_truncated_records_seq_missing",
    gettext_noop("the chain was truncated: records seq %(value)s..%(value_2)s are missing at the tail"),
)
FINDING_WITNESS_COSIGNED_RECORDS_STREAM_THEM = Message(
    "audit.finding_witness_cosigned_records_stream_them",
    gettext_noop("the witness cosigned %(size)s records of this stream; %(value)s of them are gone from the database"),
)
FINDING_WITNESS_CANNOT_READ_NOTHING_OUTSIDE = Message(
    "audit.finding_witness_cannot_read_nothing_outside",
    gettext_noop("the witness cannot be read (%(error)s): nothing outside the database vouches for the trail"),
)
FINDING_TRUST_ROOT_DOES_NOT_HOLD = Message(
    "audit.finding_trust_root_does_not_hold", gettext_noop("the trust root does not hold: %(error)s")
)
FINDING_RECORD_SEQ_NAMES_UNKNOWN_DATA = Message(
    "audit.finding_record_seq_names_unknown_data",
    gettext_noop("record seq %(seq)s names an unknown data key %(key_id)s"),
)
FINDING_CHECKPOINT_SEQ_SIGNED_NOTE_DOES = Message(
    "audit.finding_checkpoint_seq_signed_note_does",
    gettext_noop(
        "checkpoint at seq %(seq)s: its signed note does not verify under the trust root's keys or says something "
        "else than the row"
    ),
)
FINDING_CHECKPOINT_SEQ_STORED_COSIGNATURE_NOT = Message(
    "audit.finding_checkpoint_seq_stored_cosignature_not",
    gettext_noop("checkpoint at seq %(seq)s: its stored cosignature is not the pinned witness's"),
)
FINDING_CHECKPOINT_SEQ_COMPACT_RANGE_DOES = Message(
    "audit.finding_checkpoint_seq_compact_range_does",
    gettext_noop("checkpoint at seq %(seq)s: its compact range does not give its signed root"),
)
FINDING_STORED_RECORDS_DO_NOT_GIVE = Message(
    "audit.finding_stored_records_do_not_give",
    gettext_noop("the stored records do not give the tree root checkpoint seq %(seq)s signed (rewritten)"),
)
FINDING_STORED_RECORDS_DO_NOT_GIVE_ROOT = Message(
    "audit.finding_stored_records_do_not_give_root",
    gettext_noop(
        "the stored records do not give the root the witness cosigned at size %(witnessed_size)s: history the "
        "witness saw was rewritten"
    ),
)
FINDING_TOMBSTONE_THROUGH_SEQ_NOT_SIGNED = Message(
    "audit.finding_tombstone_through_seq_not_signed",
    gettext_noop("tombstone through seq %(through_seq)s is not signed by a key of the trust root (forged purge)"),
)
FINDING_TOMBSTONE_THROUGH_SEQ_NEVER_RECORDED = Message(
    "audit.finding_tombstone_through_seq_never_recorded",
    gettext_noop(
        "tombstone through seq %(through_seq)s was never recorded by the witness (a purge the witness did not see)"
    ),
)
FINDING_WITNESS_HOLDS_TOMBSTONE_THROUGH_SEQ = Message(
    "audit.finding_witness_holds_tombstone_through_seq",
    gettext_noop("the witness holds a tombstone through seq %(through_seq)s that the database lacks"),
)
FINDING_CHAIN_HEAD_NAMES_DIFFERENT_HASH = Message(
    "audit.finding_chain_head_names_different_hash",
    gettext_noop("the chain head names a different hash for seq %(last)s than the stored record"),
)
FINDING_CHECKPOINT_WITNESS_COSIGNED_SIZE_MISSING = Message(
    "audit.finding_checkpoint_witness_cosigned_size_missing",
    gettext_noop("the checkpoint the witness cosigned at size %(size)s is missing or different in the database"),
)
FINDING_TOMBSTONE_THROUGH_SEQ_PURGED_TENANT = Message(
    "audit.finding_tombstone_through_seq_purged_tenant",
    gettext_noop(
        "the tombstone through seq %(through_seq)s purged tenant %(tenant_id)s's records while the legal hold "
        "%(items)s was active"
    ),
)
FINDING_DATA_KEY_DESTROYED_WITHOUT_AUDIT = Message(
    "audit.finding_data_key_destroyed_without_audit",
    gettext_noop(
        "data key %(key_id)s of %(owner)s was destroyed (%(items)s) without an audit.key.shred record naming it: "
        "it was shredded outside `gpupool audit_shred_tenant`"
    ),
)
FINDING_SHRED_RECORD_PLATFORM_SEQ_DESTROYED = Message(
    "audit.finding_shred_record_platform_seq_destroyed",
    gettext_noop(
        "the shred record platform seq %(seq)s destroyed tenant %(tenant_id)s's data keys while the legal hold "
        "%(holds)s was active (no audit.legal_hold.release record before it)"
    ),
)
FINDING_RECORD_SEQ_DATA_KEY_DOES = Message(
    "audit.finding_record_seq_data_key_does",
    gettext_noop(
        "record seq %(seq)s: its data key %(key_id)s does not unwrap (%(error)s), so its seal cannot be checked: "
        "the key was overwritten or planted"
    ),
)
FINDING_RECORD_SEQ_DOES_NOT_OPEN = Message(
    "audit.finding_record_seq_does_not_open",
    gettext_noop("record seq %(seq)s does not open under its data key: it was forged or rewritten"),
)
FINDING_DATA_KEY_NAMED_SHRED_RECORD = Message(
    "audit.finding_data_key_named_shred_record",
    gettext_noop(
        "data key %(key_id)s of %(owner)s is named by the shred record platform seq %(seq)s for tenant %(value)s, "
        "not its own tenant"
    ),
)
FINDING_WITNESS_COSIGNED_RECORDS_DATABASE_HOLDS = Message(
    "audit.finding_witness_cosigned_records_database_holds",
    gettext_noop(
        "the witness cosigned %(size)s records of this stream, the database holds records only up to seq %(last)s: "
        "records %(span)s were removed"
    ),
)
FINDING_WITNESS_COSIGNED_RECORDS_WHOLE_STREAM_GONE = Message(
    "audit.finding_witness_cosigned_records_whole_stream_gone",
    gettext_noop(
        "the witness cosigned %(size)s records of this stream, the database holds records only up to seq %(last)s: "
        "records %(span)s were removed (the whole stream is gone)"
    ),
)
FINDING_WITNESS_BEHIND_DATABASE = Message(
    "audit.finding_witness_behind_database",
    gettext_noop(
        "the witness is behind the database: records %(span)s are covered by no cosigned checkpoint, the oldest "
        "written %(age)s s ago (allowed: %(window_seconds)s s = GPUPOOL_AUDIT_CHECKPOINT_SECONDS + "
        "GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS); is beat running audit.checkpoint, and can it reach the witness?"
    ),
)
