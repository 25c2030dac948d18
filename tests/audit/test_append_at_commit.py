"""Audit records are written in their change's transaction and linked into the chain just before its COMMIT.

These tests commit for real (``transaction=True``): under a test-case transaction the records are linked at once.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from audit import crypto
from audit.models import AuditRecord, ChainHead
from audit.services import audit_record
from audit.trail_verifier import verify_trail
from tenants.models import Tenant
from tests.factories import TenantFactory

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_record_gets_its_place_in_the_chain_at_commit(postgres):
    tenant = TenantFactory()
    with transaction.atomic():
        record = audit_record(action="quota.update", actor=None, tenant=tenant, target="quota:1")
        assert record.pk is None and not AuditRecord.objects.filter(target="quota:1").exists()
    stored = AuditRecord.objects.get(target="quota:1")
    assert (record.pk, record.seq, record.hash) == (stored.pk, stored.seq, stored.hash)
    assert ChainHead.objects.get(stream=f"tenant:{tenant.pk}").hash == stored.hash
    assert verify_trail(record_result=False).ok


def test_a_record_written_in_a_rolled_back_savepoint_is_not_kept(postgres):
    tenant = TenantFactory()
    with transaction.atomic():
        audit_record(action="quota.update", actor=None, tenant=tenant, target="kept")
        try:
            with transaction.atomic():
                audit_record(action="quota.update", actor=None, tenant=tenant, target="undone")
                raise RuntimeError("the nested change fails")
        except RuntimeError:
            pass
    assert list(AuditRecord.objects.values_list("target", flat=True)) == ["kept"]
    assert AuditRecord.objects.get(target="kept").seq == 1


def test_a_failed_audit_write_rolls_the_change_back(postgres, monkeypatch):
    def broken_seal(*args, **kwargs):
        raise crypto.KeyUnavailable("the key store is unreachable")

    monkeypatch.setattr(crypto, "seal", broken_seal)
    with pytest.raises(crypto.KeyUnavailable), transaction.atomic():
        tenant = Tenant.objects.create(name="Ghost", slug="ghost")
        audit_record(action="tenant.create", actor=None, tenant=tenant, target="tenant:ghost")
    assert not Tenant.objects.filter(slug="ghost").exists()
    assert not AuditRecord.objects.exists()
    # The connection is usable again: the next change commits with its record.
    monkeypatch.undo()
    with transaction.atomic():
        audit_record(action="tenant.create", actor=None, target="tenant:next")
    assert AuditRecord.objects.filter(target="tenant:next").count() == 1


def test_a_long_transaction_does_not_hold_up_other_writers_of_its_stream(postgres):
    """The chain head is locked at commit, not when the record is written: a slow transaction that has written
    a record does not block another transaction appending to the same stream."""
    tenant = TenantFactory()
    written, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def slow() -> None:
        try:
            with transaction.atomic():
                audit_record(action="quota.update", actor=None, tenant=tenant, target="slow")
                written.set()
                release.wait(timeout=30)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=slow)
    thread.start()
    assert written.wait(timeout=30)
    done = threading.Event()

    def fast() -> None:
        try:
            with transaction.atomic():
                audit_record(action="quota.update", actor=None, tenant=tenant, target="fast")
            done.set()
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    other = threading.Thread(target=fast)
    other.start()
    committed_while_slow_was_open = done.wait(timeout=10)
    release.set()
    thread.join()
    other.join()
    assert not failures, failures
    assert committed_while_slow_was_open
    seqs = dict(AuditRecord.objects.values_list("target", "seq"))
    assert seqs == {"fast": 1, "slow": 2}
    assert verify_trail(record_result=False).ok


def test_a_large_batch_is_copied_in_and_verifies(postgres):
    """A scheduling cycle writes thousands of records in one transaction: above a threshold they go in by COPY
    with ids drawn from the sequence; they must read back, open and chain exactly like single inserts."""
    tenant = TenantFactory()
    with transaction.atomic():
        records = [
            audit_record(action="job.transition", actor=None, tenant=tenant, target=f"job:{n}", details={"n": n})
            for n in range(300)
        ]
    stored = dict(AuditRecord.objects.filter(stream=f"tenant:{tenant.pk}").values_list("pk", "seq"))
    assert {record.pk: record.seq for record in records} == stored
    assert sorted(stored.values()) == list(range(1, 301))
    from audit.services import record_details

    assert record_details(AuditRecord.objects.get(pk=records[-1].pk)) == {"n": 299}
    report = verify_trail(record_result=False, witness_required=False)
    assert report.ok, report.findings
