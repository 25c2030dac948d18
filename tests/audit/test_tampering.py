"""audit_verify finds every kind of tampering a database administrator can do, directly in the tables."""

from __future__ import annotations

import base64
import logging
import os

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import translation

from audit import chain
from audit.models import AuditRecord, ChainHead
from audit.services import checkpoint_create, record_header
from audit.trail_verifier import verify_trail
from kernel.messages import Text, localize
from tests.audit.helpers import make_chain, raw, row

pytestmark = [pytest.mark.django_db, pytest.mark.database_owner]  # a DBA, the audit admin


def kinds(report) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for finding in report.findings:
        found.setdefault(finding.kind, []).extend(finding.seqs)
    return found


def test_untouched_trail_verifies():
    make_chain(10)
    report = verify_trail(record_result=False)
    assert report.ok and report.records == 10 and report.checkpoints == 1


def test_audit_verify_command_says_ok(capsys):
    make_chain(3)
    call_command("audit_verify")
    assert "OK: 3 records" in capsys.readouterr().out


def test_edited_record_is_named():
    stream = make_chain(10)
    raw("UPDATE audit_auditrecord SET target = 'job:evil' WHERE stream = %s AND seq = 4", [stream])
    found = kinds(verify_trail(record_result=False))
    assert found[chain.FINDING_EDITED] == [4]


def test_edited_ciphertext_is_named():
    stream = make_chain(5)
    record = row(stream, 2)
    flipped = bytearray(bytes(record.ciphertext))
    flipped[0] ^= 1
    raw("UPDATE audit_auditrecord SET ciphertext = %s WHERE id = %s", [bytes(flipped), record.pk])
    assert kinds(verify_trail(record_result=False))[chain.FINDING_EDITED] == [2]


def test_deleted_records_are_named():
    stream = make_chain(10)
    raw("DELETE FROM audit_auditrecord WHERE stream = %s AND seq IN (5, 6)", [stream])
    report = verify_trail(record_result=False)
    assert kinds(report)[chain.FINDING_DELETED] == [5, 6]
    assert any("5..6" in f.message for f in report.findings)


def test_reordered_records_are_named():
    stream = make_chain(10)
    raw("UPDATE audit_auditrecord SET seq = -3 WHERE stream = %s AND seq = 3", [stream])
    raw("UPDATE audit_auditrecord SET seq = 3 WHERE stream = %s AND seq = 4", [stream])
    raw("UPDATE audit_auditrecord SET seq = 4 WHERE stream = %s AND seq = -3", [stream])
    found = kinds(verify_trail(record_result=False))
    assert sorted(found[chain.FINDING_REORDERED]) == [3, 4]
    assert chain.FINDING_EDITED not in found


def _forged_row(stream: str, seq: int, prev_hash: str) -> list:
    """A well-formed record with a correct hash — everything an attacker without the keys can make."""
    template = row(stream, 1)
    record = AuditRecord(
        stream=stream,
        seq=seq,
        event_id="f" * 32,
        created_at=template.created_at,
        actor_id=None,
        actor_username="ghost",
        tenant_id=template.tenant_id,
        action="job.cancel",
        target="job:0",
        outcome="success",
        cipher=template.cipher,
        key_id=template.key_id,
        nonce=base64.b64encode(os.urandom(12)).decode(),
        prev_hash=prev_hash,
    )
    ciphertext = os.urandom(40)
    record.hash = chain.record_hash(prev_hash, record_header(record), ciphertext)
    return [record, ciphertext]


def _insert(record: AuditRecord, ciphertext: bytes) -> None:
    raw(
        "INSERT INTO audit_auditrecord (stream, seq, event_id, created_at, actor_username, actor_role, user_agent, "
        "tenant_id, action, target, outcome, request_id, cipher, key_id, nonce, ciphertext, prev_hash, hash) "
        "VALUES (%s, %s, %s, %s, %s, '', '', %s, %s, %s, %s, '', %s, %s, %s, %s, %s, %s)",
        [
            record.stream,
            record.seq,
            record.event_id,
            record.created_at,
            record.actor_username,
            record.tenant_id,
            record.action,
            record.target,
            record.outcome,
            record.cipher,
            record.key_id,
            record.nonce,
            ciphertext,
            record.prev_hash,
            record.hash,
        ],
    )


def test_inserted_record_is_named():
    stream = make_chain(10)
    prev_hash = row(stream, 4).hash
    # Make room at seq 5 the way an attacker must: renumber the rest (the unique constraint forbids two 5s).
    raw("UPDATE audit_auditrecord SET seq = seq + 1000 WHERE stream = %s AND seq >= 5", [stream])
    raw("UPDATE audit_auditrecord SET seq = seq - 999 WHERE stream = %s AND seq >= 1000", [stream])
    _insert(*_forged_row(stream, 5, prev_hash))
    report = verify_trail(record_result=False)
    found = kinds(report)
    assert found[chain.FINDING_INSERTED] == [5]
    assert sorted(found[chain.FINDING_REORDERED]) == list(range(6, 12))


def test_forged_record_appended_at_the_tail_is_named():
    stream = make_chain(5)
    head = row(stream, 5)
    record, ciphertext = _forged_row(stream, 6, head.hash)
    _insert(record, ciphertext)
    ChainHead.objects.filter(stream=stream).update(seq=6, hash=record.hash)
    report = verify_trail(record_result=False)
    assert kinds(report)[chain.FINDING_FORGED] == [6]
    # The finding is a catalogue message: the auditor reads it in the console's language.
    [forged] = [f for f in report.findings if f.kind == chain.FINDING_FORGED]
    assert isinstance(forged.message, Text) and "seq 6" in forged.message
    with translation.override("zh-hans"):
        assert "序号 6" in localize(forged.message) and "forged" not in localize(forged.message)


def test_tail_truncation_is_named_even_when_the_head_row_is_fixed_up():
    stream = make_chain(10)  # checkpointed at seq 10, witnessed in the file
    raw("DELETE FROM audit_auditrecord WHERE stream = %s AND seq > 7", [stream])
    raw(
        "UPDATE audit_chainhead SET seq = 7, hash = %s, checkpoint_seq = 0, witnessed_seq = 0 WHERE stream = %s",
        [row(stream, 7).hash, stream],
    )
    raw("DELETE FROM audit_checkpoint WHERE stream = %s", [stream])
    found = kinds(verify_trail(record_result=False))
    assert found[chain.FINDING_TRUNCATED] == [8, 9, 10]  # the witness cosigned 10 records


def test_tail_truncation_after_the_last_checkpoint_is_named_from_the_head_row():
    stream = make_chain(10, checkpoint=False)
    raw("DELETE FROM audit_auditrecord WHERE stream = %s AND seq > 8", [stream])
    assert kinds(verify_trail(record_result=False))[chain.FINDING_TRUNCATED] == [9, 10]


def test_full_rewrite_by_a_database_admin_is_detected_through_the_witness():
    stream = make_chain(6)
    # The admin rewrites every record (new target) and recomputes the whole chain, the head and checkpoints.
    prev = chain.GENESIS_HASH
    for seq in range(1, 7):
        record = row(stream, seq)
        record.target = "job:rewritten"
        record.prev_hash = prev
        record.hash = chain.record_hash(prev, record_header(record), bytes(record.ciphertext))
        raw(
            "UPDATE audit_auditrecord SET target = %s, prev_hash = %s, hash = %s WHERE id = %s",
            [record.target, record.prev_hash, record.hash, record.pk],
        )
        prev = record.hash
    raw("UPDATE audit_chainhead SET hash = %s, checkpoint_seq = 0, witnessed_seq = 0 WHERE stream = %s", [prev, stream])
    raw("DELETE FROM audit_checkpoint WHERE stream = %s", [stream])
    checkpoint_create(stream=stream)  # even a freshly signed checkpoint does not help: the witness remembers
    found = kinds(verify_trail(record_result=False))
    assert chain.FINDING_WITNESS in found or chain.FINDING_CHECKPOINT in found
    assert chain.FINDING_FORGED in found  # the headers no longer match the sealed ciphertexts


def test_forged_checkpoint_signature_is_detected():
    stream = make_chain(4)
    raw("UPDATE audit_checkpoint SET signature = %s WHERE stream = %s", [base64.b64encode(b"\0" * 64).decode(), stream])
    assert chain.FINDING_CHECKPOINT in kinds(verify_trail(record_result=False))


def test_failed_verification_is_audited_and_alerts(caplog, capsys):
    stream = make_chain(5)
    raw("UPDATE audit_auditrecord SET outcome = 'failure' WHERE stream = %s AND seq = 2", [stream])
    caplog.set_level(logging.CRITICAL, logger="audit.alert")
    with pytest.raises(CommandError, match="FAILED"):
        call_command("audit_verify")
    assert "EDITED" in capsys.readouterr().out
    assert AuditRecord.objects.filter(action="audit.tamper_detected", outcome="failure").exists()
    assert any(r.levelno == logging.CRITICAL for r in caplog.records)


@pytest.mark.services
def test_postgres_trigger_refuses_update_and_delete(postgres):
    from django.db import DatabaseError, transaction

    stream = make_chain(2, checkpoint=False)
    for sql in (
        "UPDATE audit_auditrecord SET target = 'x' WHERE stream = %s",
        "DELETE FROM audit_auditrecord WHERE stream = %s",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [stream])
    assert AuditRecord.objects.filter(stream=stream, target="x").count() == 0
    assert AuditRecord.objects.filter(stream=stream).count() == 2
