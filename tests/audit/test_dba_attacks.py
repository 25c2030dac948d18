"""Every database-administrator attack of issue 16, done with raw SQL as the superuser, and what an auditor sees.

Each test performs the attack the way a DBA would (raw SQL, triggers disabled where a superuser could disable
them) and then runs what an auditor runs: ``gpupool audit_verify`` (CommandError = exit 1, its FAILED line and
the finding lines it prints) or ``python -m audit.bundle_verifier`` (exit 1 and its FAILED line).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import zipfile

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.test import TestCase
from django.utils import timezone

from audit import bundle_verifier as offline
from audit import chain
from audit.exports import build_bundle, trust_root
from audit.models import PLATFORM_STREAM, AuditRecord, ChainHead, DataKey
from audit.services import (
    audit_record,
    checkpoint_all,
    legal_hold_place,
    record_header,
    tenant_keys_shred,
)
from audit.trail_verifier import verify_trail
from tests.audit.helpers import raw, row
from tests.factories import AuditorFactory, TenantFactory, UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.database_owner]  # a DBA, the audit admin
AFTER_RETENTION = dt.timedelta(days=400)


def sealed_by_beat() -> None:
    """What beat's ``audit.checkpoint`` does every GPUPOOL_AUDIT_CHECKPOINT_SECONDS: seal and witness."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint_all()


def tenant_with_records(count: int = 6):
    tenant, member = TenantFactory(), UserFactory()
    for index in range(count):
        audit_record(action="job.submit", actor=member, tenant=tenant, target=f"job:{index}", details={"i": index})
    return tenant


def auditor_runs_verify(capsys) -> tuple[str, str]:
    """``gpupool audit_verify`` as an auditor runs it: it must exit non-zero; returns (FAILED line, output)."""
    with pytest.raises(CommandError) as failed:
        call_command("audit_verify")
    message = str(failed.value)
    assert message.startswith("audit trail FAILED verification")
    return message, capsys.readouterr().out


def export_bundle(tmp_path) -> tuple[str, str]:
    now = timezone.now()
    with TestCase.captureOnCommitCallbacks(execute=True):
        body, _manifest = build_bundle(
            actor=AuditorFactory(), start=now - dt.timedelta(hours=1), end=now + dt.timedelta(hours=1)
        )
    path = tmp_path / "bundle.zip"
    path.write_bytes(body)
    return str(path), trust_root()  # what the auditor pinned at install (from the witness, not the bundle)


def offline_verify(capsys, *args: str) -> tuple[int, str]:
    code = offline.main(list(args))
    return code, capsys.readouterr().out


# --- 1. key destruction -------------------------------------------------------------------------------------


def test_key_destroyed_by_hand_then_record_edited_and_chain_recomputed_fails_naming_tenant_and_key(capsys):
    tenant = tenant_with_records(6)
    stream = f"tenant:{tenant.pk}"
    sealed_by_beat()
    key_id = DataKey.objects.get(tenant_id=tenant.pk).key_id
    # The DBA shreds by hand (so the seals can no longer be checked), edits record 3 and recomputes the chain.
    raw(
        "UPDATE audit_datakey SET destroyed_at = CURRENT_TIMESTAMP, wrapped_key = %s WHERE tenant_id = %s",
        [b"", tenant.pk],
    )
    prev = row(stream, 2).hash
    for seq in range(3, 7):
        record = row(stream, seq)
        if seq == 3:
            record.target = "job:innocent"
        record.prev_hash = prev
        record.hash = chain.record_hash(prev, record_header(record), bytes(record.ciphertext))
        raw(
            "UPDATE audit_auditrecord SET target = %s, prev_hash = %s, hash = %s WHERE id = %s",
            [record.target, record.prev_hash, record.hash, record.pk],
        )
        prev = record.hash
    raw("UPDATE audit_chainhead SET hash = %s WHERE stream = %s", [prev, stream])

    _message, out = auditor_runs_verify(capsys)
    assert (
        f"KEY: {stream}: data key {key_id} of tenant {tenant.pk} was destroyed (destroyed_at" in out
        and "without an audit.key.shred record naming it" in out
    )
    assert "CHECKPOINT" in out or "WITNESS" in out  # the recomputed chain contradicts the witnessed checkpoint


def test_key_destroyed_by_hand_fails_the_offline_verifier_naming_tenant_and_key(capsys, tmp_path):
    tenant = tenant_with_records(3)
    sealed_by_beat()
    key_id = DataKey.objects.get(tenant_id=tenant.pk).key_id
    raw(
        "UPDATE audit_datakey SET destroyed_at = CURRENT_TIMESTAMP, wrapped_key = %s WHERE tenant_id = %s",
        [b"", tenant.pk],
    )
    path, signing_key = export_bundle(tmp_path)
    code, out = offline_verify(capsys, path, "--trust-root", signing_key)
    assert code == 1
    assert out.startswith(f"FAILED: data key {key_id} of tenant {tenant.pk} was destroyed")
    assert "without an audit.key.shred record naming it" in out


def test_shred_by_hand_under_legal_hold_fails(capsys):
    tenant = tenant_with_records(2)
    legal_hold_place(actor=None, tenant_id=tenant.pk, reason="case 2026-17")
    sealed_by_beat()
    key_id = DataKey.objects.get(tenant_id=tenant.pk).key_id
    raw(
        "UPDATE audit_datakey SET destroyed_at = CURRENT_TIMESTAMP, wrapped_key = %s WHERE tenant_id = %s",
        [b"", tenant.pk],
    )
    _message, out = auditor_runs_verify(capsys)
    assert f"data key {key_id} of tenant {tenant.pk} was destroyed" in out


def test_shred_command_after_a_hold_was_released_by_hand_fails(capsys):
    """The DBA releases the hold in the table (no audit.legal_hold.release record), then the shred command runs:
    the shred record itself is valid, but the chain says the hold was still active."""
    tenant = tenant_with_records(2)
    hold = legal_hold_place(actor=None, tenant_id=tenant.pk, reason="case 2026-18")
    raw("UPDATE audit_legalhold SET released_at = CURRENT_TIMESTAMP WHERE id = %s", [hold.pk])
    with TestCase.captureOnCommitCallbacks(execute=True):
        tenant_keys_shred(actor=None, tenant_id=tenant.pk, now=timezone.now() + AFTER_RETENTION)
    sealed_by_beat()
    _message, out = auditor_runs_verify(capsys)
    assert f"destroyed tenant {tenant.pk}'s data keys while the legal hold legal_hold:{hold.pk}" in out


def test_shred_command_is_a_chain_event_that_both_verifiers_accept(capsys, tmp_path):
    tenant = tenant_with_records(3)
    key_id = DataKey.objects.get(tenant_id=tenant.pk).key_id
    sealed_by_beat()
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert tenant_keys_shred(actor=None, tenant_id=tenant.pk, now=timezone.now() + AFTER_RETENTION) == 1
    shred = AuditRecord.objects.get(action="audit.key.shred")
    assert shred.stream == PLATFORM_STREAM and shred.tenant_id is None  # sealed under the platform key
    # Checkpointed and witnessed right after the commit, without waiting for beat.
    assert ChainHead.objects.get(stream=PLATFORM_STREAM).witnessed_seq >= shred.seq
    call_command("audit_verify")
    assert "OK: " in capsys.readouterr().out
    path, signing_key = export_bundle(tmp_path)
    datakeys = json.loads(zipfile.ZipFile(path).read("datakeys.json"))
    assert datakeys["keys"][key_id]["destroyed"] and len(datakeys["shreds"]) == 1
    code, out = offline_verify(capsys, path, "--trust-root", signing_key)
    assert code == 0, out


# --- 2. the tail --------------------------------------------------------------------------------------------


def test_records_after_the_last_checkpoint_deleted_and_head_moved_back_fails(capsys):
    tenant = tenant_with_records(10)
    stream = f"tenant:{tenant.pk}"
    sealed_by_beat()  # checkpoint at 10
    member = UserFactory()
    for index in range(5):
        audit_record(action="job.cancel", actor=member, tenant=tenant, target=f"job:{index}")
    sealed_by_beat()  # beat's next run, at most GPUPOOL_AUDIT_CHECKPOINT_SECONDS later: checkpoint at 15
    # The DBA removes 11..15, the checkpoint row that names them, and moves the head back to 10.
    raw("DELETE FROM audit_auditrecord WHERE stream = %s AND seq > 10", [stream])
    raw("DELETE FROM audit_checkpoint WHERE stream = %s AND seq > 10", [stream])
    raw(
        "UPDATE audit_chainhead SET seq = 10, hash = %s, checkpoint_seq = 10, witnessed_seq = 10 WHERE stream = %s",
        [row(stream, 10).hash, stream],
    )
    _message, out = auditor_runs_verify(capsys)
    assert (
        f"TRUNCATED: {stream}: the witness cosigned 15 records of this stream, the database holds records only up to "
        "seq 10: records seq 11..15 were removed" in out
    )
    assert "warning: " in out  # (the trust root is unpinned in this test's settings)


def test_records_the_witness_has_not_sealed_within_the_window_fail(settings, capsys):
    settings.GPUPOOL_AUDIT_CHECKPOINT_SECONDS = 1
    settings.GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS = 0
    tenant = tenant_with_records(3)
    sealed_by_beat()
    audit_record(action="job.cancel", actor=None, tenant=tenant, target="job:late")
    report = verify_trail(record_result=False)
    assert report.ok and any("not witnessed yet" in w for w in report.warnings)  # inside the window
    time.sleep(1.2)  # beat did not run (stopped, or cannot write the witness)
    _message, out = auditor_runs_verify(capsys)
    assert f"WITNESS: tenant:{tenant.pk}: the witness is behind the database: records seq 4" in out


def test_witness_entries_missing_for_checkpoints_fail(settings, capsys):
    settings.GPUPOOL_AUDIT_CHECKPOINT_SECONDS = 1
    settings.GPUPOOL_AUDIT_WITNESS_SLACK_SECONDS = 0
    tenant = tenant_with_records(3)
    sealed_by_beat()
    audit_record(action="job.cancel", actor=None, tenant=tenant, target="job:1")
    checkpoint_all()  # committed in the database, but the witness never cosigned it (never run here)
    time.sleep(1.2)
    _message, out = auditor_runs_verify(capsys)
    assert f"WITNESS: tenant:{tenant.pk}: the witness is behind the database: records seq 4 are covered by no " in out


# --- 3. purge and TRUNCATE ----------------------------------------------------------------------------------


@pytest.mark.services
def test_purge_through_the_old_setting_is_refused_and_a_superuser_delete_is_detected(postgres, capsys):
    tenant = tenant_with_records(5)
    stream = f"tenant:{tenant.pk}"
    sealed_by_beat()
    # The old escape hatch no longer opens anything: the trigger deletes only what a signed tombstone covers.
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL gpupool.audit_purge = 'on'")
        cursor.execute("DELETE FROM audit_auditrecord WHERE stream = %s", [stream])
    assert AuditRecord.objects.filter(stream=stream).count() == 5
    # A superuser can disable the trigger: the witness still knows.
    raw("DELETE FROM audit_auditrecord WHERE stream = %s AND seq <= 2", [stream])
    _message, out = auditor_runs_verify(capsys)
    assert f"DELETED: {stream}: records seq 1..2 were deleted" in out


@pytest.mark.services
def test_truncating_every_audit_table_with_witness_entries_fails(postgres, capsys):
    tenant = tenant_with_records(4)
    sealed_by_beat()
    with connection.cursor() as cursor:  # as the superuser (owner): privileges do not stop it
        cursor.execute(
            "TRUNCATE audit_auditrecord, audit_chainhead, audit_checkpoint, audit_tombstone, audit_datakey, "
            "audit_legalhold, audit_signingkey"
        )
    message, out = auditor_runs_verify(capsys)
    assert (
        f"TRUNCATED: tenant:{tenant.pk}: the witness cosigned 4 records of this stream, the database holds records "
        "only up to seq 0: records seq 1..4 were removed (the whole stream is gone)" in out
    )
    assert "0 records" in message or "records in" in message


@pytest.mark.services
def test_no_witness_entries_while_the_database_has_history_fails(postgres, settings, capsys, tmp_path):
    tenant_with_records(4)
    with TestCase.captureOnCommitCallbacks(execute=False):
        checkpoint_all()  # checkpoints exist, but the witness never got them (not configured, or lost)
    _message, out = auditor_runs_verify(capsys)
    assert "WITNESS: the embedded witness in" in out and "has no trust root for this database" in out
    # --no-witness says loudly what it cannot see, and still checks the database.
    call_command("audit_verify", "--no-witness")
    captured = capsys.readouterr()
    assert "NO WITNESS" in captured.err and "OK: " in captured.out and "NO WITNESS" in captured.out


# --- 4. the offline verifier --------------------------------------------------------------------------------


def test_offline_verify_without_a_pinned_key_fails(capsys, tmp_path):
    tenant_with_records(2)
    path, signing_key = export_bundle(tmp_path)
    code, out = offline_verify(capsys, path)
    assert code == 1 and out.startswith("FAILED: the trust root is not pinned: the bundle is internally consistent")
    assert f"--trust-root {signing_key}" in out
