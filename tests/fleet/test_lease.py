"""The node lease: not_ready after missed heartbeats, jobs requeued after the grace period, ready again on
return. Time is passed in (``now=``), never slept."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditRecord
from scheduler.fleet import tasks
from scheduler.fleet.models import Node, NodeAgent, NodeStatus
from scheduler.fleet.services.inventory import node_hello
from scheduler.fleet.services.lease import lease_check, node_heartbeat, node_heartbeats_record
from tests.fleet.conftest import hello, register_node

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=UTC)


@pytest.fixture
def lease_settings(settings):
    settings.GPUPOOL_HEARTBEAT_INTERVAL_S = 5
    settings.GPUPOOL_LEASE_MISSES = 3
    settings.GPUPOOL_NODE_LOST_GRACE_S = 60


@pytest.fixture
def requeues(monkeypatch) -> list:
    calls = []

    def fake_requeue(*, node, reason):
        calls.append((node.pk, reason))
        return 2

    monkeypatch.setattr("scheduler.fleet.services.lease.node_jobs_requeue", fake_requeue)
    return calls


def ready_node() -> Node:
    node, _credential = register_node("gpu-lease")
    node_hello(node_id=node.pk, hello=_hello_dict(), now=T0)
    return Node.objects.get(pk=node.pk)


def _hello_dict() -> dict:
    return dataclasses.asdict(hello("gpu-lease"))


def test_a_node_stays_ready_while_fewer_than_three_heartbeats_are_missed(lease_settings, requeues):
    node = ready_node()
    assert lease_check(now=T0 + timedelta(seconds=14)) == {"lost": [], "requeued": []}
    assert Node.objects.get(pk=node.pk).status == NodeStatus.READY


def test_three_missed_heartbeats_make_the_node_not_ready_and_ask_for_a_cycle(lease_settings, requeues, fleet_isolation):
    node = ready_node()
    fleet_isolation.clear()
    result = lease_check(now=T0 + timedelta(seconds=16))
    assert result["lost"] == [node.pk]
    assert Node.objects.get(pk=node.pk).status == NodeStatus.NOT_READY
    assert fleet_isolation, "the scheduler is told so it stops placing on the node"
    assert AuditRecord.objects.filter(action="node.not_ready", target=f"node:{node.pk}").exists()
    assert requeues == []  # not yet: the grace period runs


def test_jobs_are_requeued_once_after_the_grace_period(lease_settings, requeues):
    node = ready_node()
    lease_check(now=T0 + timedelta(seconds=16))
    assert lease_check(now=T0 + timedelta(seconds=70))["requeued"] == []
    assert lease_check(now=T0 + timedelta(seconds=77))["requeued"] == [node.pk]
    assert requeues == [(node.pk, "node_lost")]
    assert lease_check(now=T0 + timedelta(seconds=200)) == {"lost": [], "requeued": []}
    assert requeues == [(node.pk, "node_lost")]
    assert AuditRecord.objects.filter(action="node.jobs_requeued").count() == 1


def test_a_heartbeat_after_the_lease_expired_makes_the_node_ready_again(lease_settings, requeues):
    node = ready_node()
    lease_check(now=T0 + timedelta(seconds=16))
    assert node_heartbeat(node_id=node.pk, now=T0 + timedelta(seconds=20)) is True
    node.refresh_from_db()
    assert node.status == NodeStatus.READY and node.last_heartbeat_at == T0 + timedelta(seconds=20)
    assert NodeAgent.objects.get(node=node).lost_at is None
    # Its lease runs from the new heartbeat: not lost again 14 s later.
    assert lease_check(now=T0 + timedelta(seconds=34)) == {"lost": [], "requeued": []}


def test_a_reconnecting_agents_hello_makes_a_lost_node_ready(lease_settings, requeues):
    node = ready_node()
    lease_check(now=T0 + timedelta(seconds=16))
    node_hello(node_id=node.pk, hello=_hello_dict(), now=T0 + timedelta(seconds=30))
    assert Node.objects.get(pk=node.pk).status == NodeStatus.READY


def test_a_cordoned_node_keeps_its_status_but_its_jobs_are_still_requeued(lease_settings, requeues):
    node = ready_node()
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.CORDONED)
    lease_check(now=T0 + timedelta(seconds=16))
    lease_check(now=T0 + timedelta(seconds=80))
    assert Node.objects.get(pk=node.pk).status == NodeStatus.CORDONED
    assert requeues == [(node.pk, "node_lost")]


def test_a_node_that_never_said_hello_is_left_alone(lease_settings, requeues):
    register_node("gpu-new")
    assert lease_check(now=T0 + timedelta(days=1)) == {"lost": [], "requeued": []}


def test_the_beat_task_runs_the_lease_check(lease_settings, requeues):
    node = ready_node()
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=T0 - timedelta(days=1))
    assert tasks.lease_check.apply().get()["lost"] == [node.pk]


def test_batched_heartbeats_renew_every_lease_and_revive_lost_nodes(lease_settings, requeues):
    lost = ready_node()
    other, _credential = register_node("gpu-other")
    node_hello(node_id=other.pk, hello=dataclasses.asdict(hello("gpu-other")), now=T0 + timedelta(seconds=10))
    lease_check(now=T0 + timedelta(seconds=16))
    assert Node.objects.get(pk=lost.pk).status == NodeStatus.NOT_READY
    later = T0 + timedelta(seconds=20)
    revived = node_heartbeats_record(beats={lost.pk: later, other.pk: later})
    assert sorted(revived) == [lost.pk]
    assert {node.last_heartbeat_at for node in Node.objects.filter(pk__in=[lost.pk, other.pk])} == {later}
    assert set(Node.objects.filter(pk__in=[lost.pk, other.pk]).values_list("status", flat=True)) == {"ready"}


def test_a_seconds_heartbeats_from_many_nodes_are_one_update_never_fresher_than_sent(lease_settings, requeues):
    nodes = [register_node(f"gpu-beat-{index}")[0] for index in range(20)]
    beats = {node.pk: T0 + timedelta(microseconds=1 + 37_000 * index) for index, node in enumerate(nodes)}
    with CaptureQueriesContext(connection) as queries:
        node_heartbeats_record(beats=beats)
    updates = [query for query in queries.captured_queries if query["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 1
    assert set(Node.objects.filter(pk__in=beats).values_list("last_heartbeat_at", flat=True)) == {T0}
