"""audit_record: streams, sealing, origin, same-transaction writes and failure alerts."""

from __future__ import annotations

import logging

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import RequestFactory
from rest_framework.request import Request

from audit import conf, crypto
from audit.context import request_origin
from audit.events import UnknownAuditEvent
from audit.models import PLATFORM_STREAM, AuditRecord, ChainHead
from audit.services import audit_record, record_details, records
from audit.trail_verifier import verify_trail
from tenants.models import Tenant
from tests.factories import SystemAdminFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db

alerts: list[tuple[str, str, dict]] = []


def collect_alert(event: str, message: str, details: dict) -> None:
    alerts.append((event, message, details))


def test_operator_action_on_tenant_object_lands_in_tenant_and_platform_streams():
    tenant = TenantFactory()
    admin = SystemAdminFactory()
    record = audit_record(action="quota.update", actor=admin, tenant=tenant, target="quota:1", details={"after": 8})
    copies = AuditRecord.objects.filter(event_id=record.event_id).order_by("stream")
    assert [c.stream for c in copies] == [PLATFORM_STREAM, f"tenant:{tenant.pk}"]
    assert {c.actor_role for c in copies} == {"system_admin"}
    assert all(record_details(c) == {"after": 8} for c in copies)


def test_member_action_lands_only_in_its_tenant_stream():
    tenant = TenantFactory()
    record = audit_record(action="job.submit", actor=UserFactory(), tenant=tenant, target="job:1")
    assert AuditRecord.objects.filter(event_id=record.event_id).count() == 1
    assert record.stream == f"tenant:{tenant.pk}" and record.seq == 1


def test_action_without_tenant_lands_in_platform_stream_and_chains():
    first = audit_record(action="user.create", actor=None, target="user:1")
    second = audit_record(action="user.create", actor=None, target="user:2")
    assert (first.stream, first.seq, second.seq) == (PLATFORM_STREAM, 1, 2)
    assert second.prev_hash == first.hash
    assert ChainHead.objects.get(stream=PLATFORM_STREAM).hash == second.hash


def test_unknown_action_is_refused_and_nothing_is_recorded():
    with pytest.raises(UnknownAuditEvent, match=r"brand\.new_thing"), transaction.atomic():
        audit_record(action="brand.new_thing", actor=None)
    assert not AuditRecord.objects.filter(action="brand.new_thing").exists()


def test_details_are_sealed_not_stored_in_plain_text():
    record = audit_record(action="token.create", actor=None, details={"secret_name": "zebra-crossing-42"})
    stored = AuditRecord.objects.get(pk=record.pk)
    assert b"zebra-crossing-42" not in bytes(stored.ciphertext)
    assert stored.cipher == "aes-256-gcm" and stored.key_id
    assert record_details(stored) == {"secret_name": "zebra-crossing-42"}


def test_origin_is_read_from_django_drf_and_asgi_requests():
    django_request = RequestFactory().get(
        "/", REMOTE_ADDR="10.1.2.3", HTTP_USER_AGENT="curl/8", HTTP_X_REQUEST_ID="req-123"
    )
    assert request_origin(django_request).ip == "10.1.2.3"
    drf = request_origin(Request(django_request))
    assert (drf.ip, drf.user_agent, drf.request_id) == ("10.1.2.3", "curl/8", "req-123")
    scope = {"type": "http", "client": ("192.0.2.7", 5000), "headers": [(b"user-agent", b"agent/1")]}
    asgi = request_origin(scope)
    assert asgi.ip == "192.0.2.7" and asgi.user_agent == "agent/1" and len(asgi.request_id) == 32


def test_record_keeps_request_origin():
    request = RequestFactory().get("/", REMOTE_ADDR="10.9.8.7", HTTP_X_REQUEST_ID="abc-1")
    record = audit_record(action="auth.login", actor=UserFactory(), request=request)
    assert (record.actor_ip, record.request_id) == ("10.9.8.7", "abc-1")


def test_a_bad_request_id_header_is_replaced():
    request = RequestFactory().get("/", HTTP_X_REQUEST_ID="drop table; --" + "x" * 100)
    assert request_origin(request).request_id.isalnum()


def test_failed_audit_write_rolls_back_the_change_and_alerts(monkeypatch, caplog, settings):
    settings.GPUPOOL_AUDIT_ALERT_HOOK = "tests.audit.test_records.collect_alert"
    alerts.clear()

    def broken_seal(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(crypto, "seal", broken_seal)
    caplog.set_level(logging.CRITICAL, logger="audit.alert")
    with pytest.raises(OSError), transaction.atomic():
        Tenant.objects.create(name="unaudited", slug="unaudited")
        audit_record(action="tenant.create", actor=None, target="tenant:?")
    assert not Tenant.objects.filter(slug="unaudited").exists()
    assert any(r.levelno == logging.CRITICAL and "tenant.create" in r.getMessage() for r in caplog.records)
    assert alerts and alerts[0][0] == "audit.write_failed"


def test_sm4_gcm_seals_details_when_the_backend_offers_it(settings):
    if not crypto.sm4_gcm_available():
        pytest.skip("this cryptography/OpenSSL build has no SM4-GCM")
    settings.GPUPOOL_AUDIT_CIPHER = "sm4-gcm"
    record = audit_record(action="tenant.update", actor=None, tenant=TenantFactory(), details={"国密": "SM4"})
    stored = AuditRecord.objects.get(pk=record.pk)
    assert stored.cipher == "sm4-gcm"
    assert record_details(stored) == {"国密": "SM4"}
    assert verify_trail(record_result=False).ok


def test_unknown_cipher_setting_is_refused(settings):
    settings.GPUPOOL_AUDIT_CIPHER = "rot13"
    with pytest.raises(ImproperlyConfigured, match="GPUPOOL_AUDIT_CIPHER"):
        audit_record(action="user.create", actor=None)


def test_retention_below_180_days_is_refused(settings):
    settings.GPUPOOL_AUDIT_RETENTION_DAYS = 90
    with pytest.raises(ImproperlyConfigured, match="180"):
        conf.retention_days()


def test_master_key_ring_rejects_malformed_entries(settings):
    settings.GPUPOOL_AUDIT_MASTER_KEYS = "k1:not-base64"
    with pytest.raises(ImproperlyConfigured, match="k1"):
        conf.master_keys()


def test_key_cache_is_checked_against_the_stored_key():
    record = audit_record(action="user.create", actor=None, details={"a": 1})
    records.data_key_cache.clear()
    assert record_details(AuditRecord.objects.get(pk=record.pk)) == {"a": 1}
