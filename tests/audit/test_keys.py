"""Master key rotation re-wraps data keys; crypto-shredding destroys them; legal holds block shredding."""

from __future__ import annotations

import base64
import datetime as dt
import os

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from audit.models import AuditRecord, DataKey
from audit.services import (
    SHREDDED,
    audit_record,
    data_keys_rotate,
    legal_hold_place,
    legal_hold_release,
    record_details,
    records,
    tenant_keys_shred,
)
from audit.trail_verifier import verify_trail
from kernel.api import ConflictError
from tests.factories import TenantFactory

pytestmark = [pytest.mark.django_db, pytest.mark.database_owner]  # a DBA, the audit admin


def ring(*kids: str, keys: dict[str, bytes]) -> str:
    return ",".join(f"{kid}:{base64.b64encode(keys[kid]).decode()}" for kid in kids)


def test_rotation_rewraps_data_keys_and_leaves_records_readable(settings):
    keys = {"k1": os.urandom(32), "k2": os.urandom(32)}
    settings.GPUPOOL_AUDIT_MASTER_KEYS = ring("k1", keys=keys)
    tenant = TenantFactory()
    record = audit_record(action="quota.update", actor=None, tenant=tenant, details={"before": 1, "after": 2})
    ciphertext_before = bytes(AuditRecord.objects.get(pk=record.pk).ciphertext)
    assert set(DataKey.objects.values_list("master_key_id", flat=True)) == {"k1"}

    settings.GPUPOOL_AUDIT_MASTER_KEYS = ring("k1", "k2", keys=keys)
    call_command("audit_rotate_keys")
    assert set(DataKey.objects.values_list("master_key_id", flat=True)) == {"k2"}
    stored = AuditRecord.objects.get(pk=record.pk)
    assert bytes(stored.ciphertext) == ciphertext_before  # re-wrapped, never re-encrypted

    settings.GPUPOOL_AUDIT_MASTER_KEYS = ring("k2", keys=keys)  # the old master key is retired
    records.data_key_cache.clear()
    assert record_details(stored) == {"before": 1, "after": 2}
    assert AuditRecord.objects.filter(action="audit.key.rotate").exists()
    assert verify_trail(record_result=False).ok


def test_rotation_twice_is_a_no_op_the_second_time(settings):
    audit_record(action="user.create", actor=None)
    assert data_keys_rotate(actor=None) == 0


def test_shredding_inside_retention_is_refused():
    tenant = TenantFactory()
    audit_record(action="job.submit", actor=None, tenant=tenant)
    with pytest.raises(ConflictError, match="retention"):
        tenant_keys_shred(actor=None, tenant_id=tenant.pk)
    with pytest.raises(CommandError, match="retention"):
        call_command("audit_shred_tenant", "--tenant", str(tenant.pk))


def test_shredding_under_legal_hold_is_refused():
    tenant = TenantFactory()
    audit_record(action="job.submit", actor=None, tenant=tenant)
    legal_hold_place(actor=None, tenant_id=tenant.pk, reason="case 2026-17")
    later = timezone.now() + dt.timedelta(days=400)
    with pytest.raises(ConflictError, match="legal hold"):
        tenant_keys_shred(actor=None, tenant_id=tenant.pk, now=later)
    legal_hold_release(actor=None, tenant_id=tenant.pk)
    assert tenant_keys_shred(actor=None, tenant_id=tenant.pk, now=later) == 1


def test_shredded_details_read_as_shredded_and_the_chain_still_verifies():
    tenant = TenantFactory()
    record = audit_record(action="job.submit", actor=None, tenant=tenant, details={"command": "train.py"})
    other = audit_record(action="job.submit", actor=None, tenant=TenantFactory(), details={"command": "keep"})
    tenant_keys_shred(actor=None, tenant_id=tenant.pk, now=timezone.now() + dt.timedelta(days=366))
    assert record_details(AuditRecord.objects.get(pk=record.pk)) == SHREDDED
    assert record_details(AuditRecord.objects.get(pk=other.pk)) == {"command": "keep"}
    key = DataKey.objects.get(tenant_id=tenant.pk)
    assert key.destroyed_at is not None and bytes(key.wrapped_key) == b""
    report = verify_trail(record_result=False)
    assert report.ok, report.findings
    assert AuditRecord.objects.filter(action="audit.key.shred", target=f"tenant:{tenant.pk}").exists()


def test_legal_hold_needs_a_reason():
    from kernel.api import DomainError

    with pytest.raises(DomainError):
        legal_hold_place(actor=None, tenant_id=1, reason=" ")
