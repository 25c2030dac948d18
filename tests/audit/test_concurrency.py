"""Concurrent writers never fork a chain: appends to a stream are serialised by its chain-head row lock."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from audit.models import PLATFORM_STREAM, AuditRecord
from audit.services import audit_record
from audit.trail_verifier import verify_trail
from tests.factories import SystemAdminFactory, TenantFactory

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

THREADS = 8
PER_THREAD = 15


def test_parallel_writers_keep_every_stream_a_single_chain(postgres):
    tenants = [TenantFactory(), TenantFactory()]
    admin = SystemAdminFactory()
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        try:
            barrier.wait()
            for n in range(PER_THREAD):
                with transaction.atomic():
                    # Operator actions land in a tenant stream and the platform stream in one transaction.
                    audit_record(
                        action="quota.update", actor=admin, tenant=tenants[(index + n) % 2], target=f"q:{index}:{n}"
                    )
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors

    total = THREADS * PER_THREAD
    platform = list(
        AuditRecord.objects.filter(stream=PLATFORM_STREAM).order_by("seq").values_list("seq", "prev_hash", "hash")
    )
    assert [seq for seq, _, _ in platform] == list(range(1, total + 1))
    assert all(platform[i][1] == platform[i - 1][2] for i in range(1, total))
    for tenant in tenants:
        seqs = list(
            AuditRecord.objects.filter(stream=f"tenant:{tenant.pk}").order_by("seq").values_list("seq", flat=True)
        )
        assert seqs == list(range(1, len(seqs) + 1))
    report = verify_trail(record_result=False)
    assert report.ok, report.findings
