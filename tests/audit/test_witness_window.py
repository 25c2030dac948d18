"""The tail window: chain heads sealed to the witness every few seconds and on worker shutdown, cheaply, never
queued behind a held head, and a lost witness append retried."""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import TestCase

from audit import conf
from audit.models import ChainHead, Cosignature
from audit.services import audit_record, checkpoint_all
from audit.tasks import checkpoint_on_shutdown
from tests.factories import TenantFactory


def witnessed(stream: str) -> list[int]:
    """The sizes the witness has cosigned for ``stream``, read from the witness itself (its journal)."""
    path = conf.witness_state_dir() / "journal.jsonl"
    journal = path.read_text().splitlines() if path.exists() else []
    entries = [json.loads(line)["entry"] for line in journal]
    return [e["size"] for e in entries if e["type"] == "checkpoint" and e["stream"] == stream]


def test_default_interval_is_a_few_seconds_and_beat_uses_it():
    assert django_settings.CELERY_BEAT_SCHEDULE["audit-checkpoint"]["schedule"] == float(
        django_settings.GPUPOOL_AUDIT_CHECKPOINT_SECONDS
    )
    assert conf.checkpoint_every_seconds() <= 1  # the tail window: a seal within a second


@pytest.mark.django_db
def test_checkpoint_all_is_one_query_when_nothing_changed(django_assert_num_queries):
    audit_record(action="job.submit", actor=None, tenant=TenantFactory(), target="job:1")
    with TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint_all()
    with django_assert_num_queries(1):
        assert checkpoint_all() == []


@pytest.mark.django_db
def test_worker_shutdown_seals_the_tail():
    tenant = TenantFactory()
    audit_record(action="job.submit", actor=None, tenant=tenant, target="job:1")
    with TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint_on_shutdown(sender=None)
    assert witnessed(f"tenant:{tenant.pk}") == [1]


@pytest.mark.django_db
def test_a_lost_witness_append_is_appended_by_the_next_run():
    tenant = TenantFactory()
    stream = f"tenant:{tenant.pk}"
    audit_record(action="job.submit", actor=None, tenant=tenant, target="job:1")
    with TestCase.captureOnCommitCallbacks(execute=False):
        checkpoint_all()  # committed, but the process dies before its witness append
    assert witnessed(stream) == [] and ChainHead.objects.get(stream=stream).witnessed_seq == 0
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert checkpoint_all() == []  # nothing new to sign ...
    assert witnessed(stream) == [1]  # ... but the missed checkpoint is appended
    assert ChainHead.objects.get(stream=stream).witnessed_seq == 1


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_run_does_not_wait_behind_a_held_head(postgres):
    tenant = TenantFactory()
    stream = f"tenant:{tenant.pk}"
    from django.db import transaction

    with transaction.atomic():
        audit_record(action="job.submit", actor=None, tenant=tenant, target="job:1")
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, dbname=db["NAME"], user=db["USER"] or "postgres"
    ) as holder:
        holder.execute("SELECT 1 FROM audit_chainhead WHERE stream = %s FOR UPDATE", [stream])
        started = time.monotonic()
        assert checkpoint_all() == []
        assert time.monotonic() - started < 5
    made = checkpoint_all()
    assert [c.stream for c in made] == [stream]
    assert witnessed(stream) == [1]
    assert Cosignature.objects.filter(stream=stream, seq=1).exists()


@pytest.mark.django_db(transaction=True)
def test_the_record_threshold_checkpoint_runs_after_the_commit_and_the_connection_stays_usable(settings):
    """Regression: the pre-commit hook ran its after-commit follow-ups before autocommit was restored, so the
    threshold checkpoint's queries left a transaction open and the caller got "can't change 'autocommit' now"."""
    from django.db import transaction

    settings.GPUPOOL_AUDIT_CHECKPOINT_RECORDS = 2
    tenant = TenantFactory()
    with transaction.atomic():
        for index in range(3):
            audit_record(action="job.submit", actor=None, tenant=tenant, target=f"job:{index}")
    assert witnessed(f"tenant:{tenant.pk}") == [3]
    audit_record(action="job.submit", actor=None, tenant=tenant, target="job:after")  # the connection still works
    assert ChainHead.objects.get(stream=f"tenant:{tenant.pk}").seq == 4
