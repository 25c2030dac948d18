"""SIEM forwarding formats (RFC 5424, CEF) over local sockets; retention purges with signed tombstones."""

from __future__ import annotations

import datetime as dt
import re
import socket
import threading

import pytest
from django.core.management import call_command
from django.test import TestCase
from django.utils import timezone

from audit import chain
from audit.models import PLATFORM_STREAM, AuditRecord, Tombstone
from audit.services import audit_record, checkpoint_all, legal_hold_place, records_purge
from audit.siem import SyslogForwarder, format_cef, format_rfc5424
from audit.trail_verifier import verify_trail
from tests.factories import SystemAdminFactory, TenantFactory, UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.database_owner]  # a DBA, the audit admin

RFC5424 = re.compile(
    r"^<(?P<pri>\d{1,3})>1 (?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z) (?P<host>\S+) gpupool - (?P<msgid>\S+) "
    r"\[audit@32473 (?P<sd>.*)\] (?P<msg>.*)$"
)


def test_rfc5424_message_has_priority_timestamp_and_escaped_structured_data():
    record = audit_record(action="auth.login.failure", actor=None, target='user:"bob"]', outcome="failure")
    message = format_rfc5424(record, hostname="portal-1")
    match = RFC5424.match(message)
    assert match, message
    assert int(match["pri"]) == 10 * 8 + 4  # authpriv.warning
    assert match["host"] == "portal-1" and match["msgid"] == "auth.login.failure"
    assert 'target="user:\\"bob\\"\\]"' in match["sd"]
    assert f'hash="{record.hash}"' in match["sd"]


def test_cef_event_escapes_pipes_and_equals():
    record = audit_record(action="token.create", actor=UserFactory(username="a=b"), target="tok|1")
    event = format_cef(record)
    *header, extension = event.split("|", 7)
    assert header == ["CEF:0", "gpupool", "gpupool", "1", "token.create", "token.create", "3"]
    assert "suser=a\\=b" in extension and "duser=tok|1" in extension
    assert f"cs4={record.hash}" in extension


def test_udp_forwarder_delivers_rfc5424_to_a_local_socket():
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    port = receiver.getsockname()[1]
    record = audit_record(action="node.cordon", actor=None, target="node:9")
    SyslogForwarder(f"udp://127.0.0.1:{port}?format=rfc5424").send([record])
    data, _ = receiver.recvfrom(65535)
    receiver.close()
    assert RFC5424.match(data.decode()) and "node:9" in data.decode()


def test_tcp_forwarder_uses_octet_counting_for_cef_after_commit(settings):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(5)
    received: list[bytes] = []

    def accept() -> None:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(65535):
                received.append(chunk)

    thread = threading.Thread(target=accept)
    thread.start()
    settings.GPUPOOL_AUDIT_SIEM_URL = f"tcp://127.0.0.1:{server.getsockname()[1]}?format=cef"
    with TestCase.captureOnCommitCallbacks(execute=True):
        audit_record(action="job.cancel", actor=None, target="job:5")
    thread.join(5)
    server.close()
    frame = b"".join(received).decode()
    length, _, body = frame.partition(" ")
    assert int(length) == len(body.encode()) and body.startswith("CEF:0|") and "duser=job:5" in body


def test_a_siem_outage_does_not_fail_the_request(settings, caplog):
    settings.GPUPOOL_AUDIT_SIEM_URL = "tcp://127.0.0.1:1?format=cef"
    with TestCase.captureOnCommitCallbacks(execute=True):
        audit_record(action="job.cancel", actor=None, target="job:6")
    assert AuditRecord.objects.filter(target="job:6").exists()
    assert "could not forward" in caplog.text


def _old_trail():
    tenant = TenantFactory()
    admin = SystemAdminFactory()
    for index in range(4):
        audit_record(action="quota.update", actor=admin, tenant=tenant, target=f"quota:{index}")
    with TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint_all()
    audit_record(action="job.submit", actor=UserFactory(), tenant=tenant, target="job:after-checkpoint")
    return tenant


def test_purge_removes_old_records_up_to_a_checkpoint_and_the_chain_still_verifies(capsys):
    tenant = _old_trail()
    later = timezone.now() + dt.timedelta(days=400)
    with TestCase.captureOnCommitCallbacks(execute=True):
        tombstones = records_purge(actor=None, now=later)
    stream = f"tenant:{tenant.pk}"
    assert {t.stream for t in tombstones} == {stream, PLATFORM_STREAM}
    # Records after the last checkpoint are kept until a later purge.
    assert list(AuditRecord.objects.filter(stream=stream).values_list("seq", flat=True)) == [5]
    tombstone = Tombstone.objects.get(stream=stream)
    assert tombstone.through_seq == 4 and tombstone.purged_count == 4
    assert AuditRecord.objects.filter(action="audit.purge").exists()
    report = verify_trail(record_result=False)
    assert report.ok, report.findings
    audit_record(action="job.submit", actor=None, tenant=tenant, target="job:new")
    assert verify_trail(record_result=False).ok


def test_nothing_inside_retention_is_purged():
    _old_trail()
    before = AuditRecord.objects.count()
    call_command("audit_purge")
    assert Tombstone.objects.count() == 0
    assert AuditRecord.objects.count() == before + 1  # only the purge's own record


def test_a_legal_hold_keeps_the_tenant_and_its_platform_copies():
    tenant = _old_trail()
    legal_hold_place(actor=None, tenant_id=tenant.pk, reason="litigation 42")
    records_purge(actor=None, now=timezone.now() + dt.timedelta(days=400))
    assert AuditRecord.objects.filter(stream=f"tenant:{tenant.pk}", action="quota.update").count() == 4
    assert AuditRecord.objects.filter(stream=PLATFORM_STREAM, action="quota.update").count() == 4
    assert verify_trail(record_result=False).ok


def test_a_forged_tombstone_is_detected():
    tenant = _old_trail()
    records_purge(actor=None, now=timezone.now() + dt.timedelta(days=400))
    from tests.audit.helpers import raw

    raw("UPDATE audit_tombstone SET purged_count = 0 WHERE stream = %s", [f"tenant:{tenant.pk}"])
    kinds = {f.kind for f in verify_trail(record_result=False).findings}
    assert chain.FINDING_TOMBSTONE in kinds


def test_deleting_old_records_without_a_tombstone_is_detected():
    tenant = _old_trail()
    from tests.audit.helpers import raw

    raw("DELETE FROM audit_auditrecord WHERE stream = %s AND seq <= 2", [f"tenant:{tenant.pk}"])
    kinds = {f.kind for f in verify_trail(record_result=False).findings}
    assert chain.FINDING_DELETED in kinds
