"""The incremental snapshot (``scheduler.live_snapshot``): after any sequence of changes it gives the snapshot a
full read gives; a transaction that commits after a read is not missed; a rollback, a pruned log or a TRUNCATE
make it read in full; the cycle's own explanation writes do not flood its change log; the triggers watch every
column the snapshot reads."""

from __future__ import annotations

import contextlib
import importlib
import random
import threading

import pytest
from django.db import connection, connections, transaction
from django.db.models import ProtectedError
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from scheduler import live_snapshot, snapshot
from scheduler.fleet.models import Device, DeviceHealth, Node, NodeStatus
from scheduler.models import Allocation, Job, JobKind, JobState, SnapshotChange, SnapshotChangeHorizon
from scheduler.services import cycle as cycle_services
from scheduler.services.cycle import run_cycle
from tenants.models import Quota, Tenant
from tests.scheduler.factories import FlavorFactory, JobFactory, TenantFactory, node_with_devices

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("postgres")]


def _agree(live: live_snapshot.LiveSnapshot) -> live_snapshot.Refresh:
    """Build the live snapshot in a committed transaction and assert it is what a full read gives."""
    now = timezone.now()
    kept: dict[int, tuple] = {}
    with transaction.atomic():
        built = live.build(now=now, stored_explanations=kept)
    read: dict[int, tuple] = {}
    expected = snapshot.build_snapshot(now=now, stored_explanations=read)
    assert built == expected
    assert kept == read
    return live.last


# --- random sequences of changes --------------------------------------------------------------------------


def _some(queryset, rng):
    pks = list(queryset.order_by("pk").values_list("pk", flat=True))
    return rng.choice(pks) if pks else None


def _add_node(rng):
    node_with_devices(rng.randint(1, 4), labels=rng.choice([{}, {"zone": "a"}, {"zone": "b"}]))


def _node_status(rng):
    if (pk := _some(Node.objects, rng)) is not None:
        Node.objects.filter(pk=pk).update(status=rng.choice([NodeStatus.READY, NodeStatus.NOT_READY]))


def _node_heartbeat(rng):  # a column the snapshot does not read: nothing to log
    Node.objects.update(last_heartbeat_at=timezone.now())


def _node_rename(rng):  # often one whose cards are in use: their allocations carry its name
    busy = Node.objects.filter(allocations__ended_at__isnull=True)
    if (pk := _some(busy if rng.random() < 0.7 else Node.objects, rng)) is not None:
        Node.objects.filter(pk=pk).update(name=f"renamed-{pk}-{rng.randint(0, 9)}")


def _device_health(rng):
    if (pk := _some(Device.objects, rng)) is not None:
        Device.objects.filter(pk=pk).update(health=rng.choice([DeviceHealth.HEALTHY, DeviceHealth.UNHEALTHY]))


def _node_delete(rng):
    unused = Node.objects.filter(allocations__isnull=True, reservations__isnull=True)
    if (pk := _some(unused, rng)) is not None:
        with contextlib.suppress(ProtectedError):
            Node.objects.filter(pk=pk).delete()  # its devices go with it (a cascade: their triggers fire too)


def _submit(rng):
    tenant = _some(Tenant.objects, rng) or TenantFactory().pk
    JobFactory(
        tenant_id=tenant,
        millis_per_replica=rng.choice([250, 500, 1000]),
        replicas=rng.randint(1, 2),
        priority_class=rng.choice([0, 200, 500]),
        preemptible=True,
    )


def _cycle(rng):
    run_cycle()  # places, explains and holds, through the cycle's own live snapshot


def _finish(rng):
    if (pk := _some(Job.objects.filter(state__in=[JobState.ADMITTED, JobState.RUNNING]), rng)) is not None:
        with transaction.atomic():
            Allocation.objects.filter(job_id=pk, ended_at__isnull=True).update(ended_at=timezone.now())
            Job.objects.filter(pk=pk).update(state=JobState.SUCCEEDED)


def _start(rng):
    Job.objects.filter(state=JobState.ADMITTED).update(state=JobState.RUNNING)


def _cancel(rng):
    if (pk := _some(Job.objects.filter(state=JobState.QUEUED), rng)) is not None:
        Job.objects.filter(pk=pk).update(state=JobState.CANCELLED)


def _stop_running(rng):  # cancelled or preempted, its process not ended yet: its allocations stay, not preemptible
    if (pk := _some(Job.objects.filter(state__in=[JobState.ADMITTED, JobState.RUNNING]), rng)) is not None:
        Job.objects.filter(pk=pk).update(state=rng.choice([JobState.CANCELLED, JobState.PREEMPTING]))


def _job_edit(rng):  # what a running job's allocations carry of it: its priority, its last checkpoint
    if (pk := _some(Job.objects.all(), rng)) is not None:
        Job.objects.filter(pk=pk).update(priority_class=rng.choice([0, 200, 500]), last_checkpoint_at=timezone.now())


def _explain_elsewhere(rng):  # an explanation another writer sets (not the cycle): it must be seen
    if (pk := _some(Job.objects.filter(state=JobState.QUEUED), rng)) is not None:
        Job.objects.filter(pk=pk).update(pending_message=f"told {rng.randint(0, 99)}")


def _quota(rng):
    if (tenant := _some(Tenant.objects, rng)) is None:
        return
    flavor = FlavorFactory()
    if rng.random() < 0.3:
        Quota.objects.filter(tenant_id=tenant, flavor=flavor).delete()
    else:
        Quota.objects.update_or_create(
            tenant_id=tenant, flavor=flavor, defaults={"guaranteed_millis": rng.randint(0, 8) * 500}
        )


def _tenant(rng):
    if rng.random() < 0.5 or not Tenant.objects.exists():
        TenantFactory()
    else:
        tenant = Tenant.objects.get(pk=_some(Tenant.objects, rng))
        Tenant.objects.filter(pk=tenant.pk).update(slug=f"{tenant.slug[:80]}-r")


CHANGES = [
    _add_node,
    _add_node,
    _node_status,
    _node_heartbeat,
    _node_rename,
    _device_health,
    _node_delete,
    _submit,
    _submit,
    _cycle,
    _cycle,
    _finish,
    _start,
    _cancel,
    _stop_running,
    _job_edit,
    _explain_elsewhere,
    _quota,
    _tenant,
]


@hypothesis_settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_random_changes_leave_the_live_snapshot_equal_to_a_full_read(data):
    FlavorFactory()
    live = cycle_services._live_snapshot()  # the cycle's own: it also sees its own writes as the cycle makes them
    assert live is not None
    _agree(live)
    for _step in range(data.draw(st.integers(4, 20), label="steps")):
        change = data.draw(st.sampled_from(CHANGES), label="change")
        change(random.Random(data.draw(st.integers(0, 2**16), label="seed")))
        assert _agree(live).mode == "incremental"
    # And the periodic check finds nothing to report.
    live.full_every_s = 0.0
    assert _agree(live).mode == "checked"
    assert live.last.differences == []
    live.full_every_s = live_snapshot.FULL_EVERY_S


# --- the hazards, one by one ------------------------------------------------------------------------------


def test_a_transaction_that_commits_after_a_read_is_read_the_next_time():
    """The writer took its transaction id before the read and commits after it: a watermark of "the highest
    change seen" would skip it for ever; the oldest running transaction's id does not."""
    node_with_devices(2, name="node-a")
    live = live_snapshot.LiveSnapshot()
    _agree(live)
    written, commit = threading.Event(), threading.Event()

    def writer():
        try:
            with transaction.atomic():
                Node.objects.filter(name="node-a").update(status=NodeStatus.NOT_READY)
                written.set()
                assert commit.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=writer)
    thread.start()
    assert written.wait(10)
    assert _agree(live).mode == "incremental"  # not committed yet: both reads see the node ready
    commit.set()
    thread.join(10)
    refresh = _agree(live)  # the node is not ready in both
    assert refresh.mode == "incremental"
    (node,) = live.build(now=timezone.now()).nodes
    assert node.schedulable is False


def test_a_rolled_back_cycle_makes_the_next_read_full():
    node_with_devices(1, name="node-a")
    live = live_snapshot.LiveSnapshot()
    _agree(live)
    with pytest.raises(RuntimeError), transaction.atomic():
        JobFactory(tenant=TenantFactory())  # a row this transaction's read sees, then rolled back
        live.build(now=timezone.now())
        raise RuntimeError
    assert _agree(live).mode == "full"


def test_a_log_pruned_past_the_last_read_makes_the_next_read_full():
    node_with_devices(1, name="node-a")
    live = live_snapshot.LiveSnapshot()
    _agree(live)
    Node.objects.filter(name="node-a").update(status=NodeStatus.NOT_READY)
    SnapshotChangeHorizon.objects.create(pruned_below=10**15)  # another reader pruned everything
    SnapshotChange.objects.all().delete()
    assert _agree(live).mode == "full"


def test_a_truncate_makes_the_next_read_full():
    node_with_devices(1, name="node-a")
    live = live_snapshot.LiveSnapshot()
    _agree(live)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        (role,) = cursor.fetchone()
        cursor.execute("RESET ROLE")  # as the owner, a DBA: the portal's role (CI runs the suite as it) may not
        cursor.execute("TRUNCATE scheduler_device, scheduler_node CASCADE")
        cursor.execute(f"SET ROLE {connection.ops.quote_name(role)}")
    assert _agree(live).mode == "full"
    assert live.build(now=timezone.now()).nodes == ()


def test_the_log_is_pruned_once_every_reader_has_read_it(monkeypatch):
    node_with_devices(1, name="node-a")
    live = live_snapshot.LiveSnapshot(prune_lag_s=0.0)
    monkeypatch.setattr(live_snapshot, "PRUNE_EVERY_S", 0.0)
    _agree(live)
    Node.objects.filter(name="node-a").update(status=NodeStatus.NOT_READY)
    assert SnapshotChange.objects.filter(source="node").exists()
    _agree(live)  # its commit prunes below the watermark of this read's predecessor...
    _agree(live)  # ...and this one's prunes the node's change
    assert not SnapshotChange.objects.filter(source="node").exists()
    assert SnapshotChangeHorizon.objects.get().pruned_below > 0
    fresh = live_snapshot.LiveSnapshot()
    _agree(fresh)
    assert _agree(fresh).mode == "incremental"


def test_the_cycles_own_explanations_do_not_flood_the_log_but_anyone_elses_do(tenant):
    """Each time the queue moves, every waiting job's position changes: the cycle keeps what it wrote, so
    those writes are not logged; a message another writer sets is."""
    node_with_devices(1, name="node-a")
    jobs = [JobFactory(tenant=tenant, millis_per_replica=1000) for _ in range(6)]
    run_cycle()
    run_cycle()
    SnapshotChange.objects.all().delete()
    (finished,) = Job.objects.filter(state=JobState.ADMITTED).values_list("pk", flat=True)
    Allocation.objects.filter(ended_at__isnull=True).update(ended_at=timezone.now())
    Job.objects.filter(pk=finished).update(state=JobState.SUCCEEDED)
    result = run_cycle()  # the next job is placed; the four behind it move up a place
    assert result.stats["snapshot_read"] == "incremental"
    assert len(result.placed) == 1 and result.explained == 4
    logged = set(SnapshotChange.objects.filter(source="job").values_list("row_id", flat=True))
    assert logged == {finished, result.placed[0]}  # the finished job and the placed one, not the four
    assert len(jobs) == 6
    waiting = Job.objects.filter(state=JobState.QUEUED).order_by("pk").first()
    Job.objects.filter(pk=waiting.pk).update(pending_message="told by an admin")
    assert waiting.pk in set(SnapshotChange.objects.filter(source="job").values_list("row_id", flat=True))
    live = cycle_services._live_snapshot()
    assert _agree(live).mode == "incremental"


def test_a_service_scaling_up_is_seen_through_its_allocations(tenant):
    node_with_devices(2, name="node-a")
    Quota.objects.create(tenant=tenant, flavor=FlavorFactory(), guaranteed_millis=4000)  # non-preemptible work
    service = JobFactory(tenant=tenant, kind=JobKind.INFERENCE, replicas=1, preemptible=False)
    live = cycle_services._live_snapshot()
    run_cycle()
    assert Allocation.objects.filter(job=service, ended_at__isnull=True).count() == 1
    _agree(live)
    Job.objects.filter(pk=service.pk).update(replicas=2, state=JobState.RUNNING)
    assert _agree(live).mode == "incremental"
    snap = live.build(now=timezone.now())
    assert [(job.job_id, job.replicas, job.first_replica) for job in snap.pending] == [(str(service.pk), 1, 1)]


def test_the_triggers_watch_every_column_the_snapshot_reads():
    migration = importlib.import_module("scheduler.migrations.0014_snapshot_changes")
    watched = {table: columns for table, columns in migration.WATCHED.values()}
    queries = [
        snapshot._ALLOCATION_ROWS,
        snapshot._RESERVATION_ROWS,
        snapshot._HOLD_ROWS,
        snapshot._QUOTA_ROWS,
        snapshot._PENDING_ROWS,
        snapshot._SERVICE_ROWS,
        snapshot._TENANT_ROWS,
        snapshot._FLAVOR_NAMES,
        snapshot._NODE_ROWS,
        snapshot._DEVICE_ROWS,
    ]
    read: dict[str, set[str]] = {}
    for query in queries:
        queryset = query._build()
        compiler = queryset.query.get_compiler(using="default")
        compiler.setup_query()
        for column, _sql, _alias in compiler.select:
            target = getattr(column, "target", None)
            if target is not None:
                read.setdefault(target.model._meta.db_table, set()).add(target.column)
        for condition in queryset.query.where.children:  # the filters' columns (a job's state, an end time)
            read.setdefault(condition.lhs.target.model._meta.db_table, set()).add(condition.lhs.target.column)
    for table, columns in read.items():
        assert table in watched, f"{table} is read by the snapshot but has no change trigger"
        if watched[table] is None:
            continue
        missing = columns - set(watched[table]) - set(migration.EXPLANATION_COLUMNS) - {"id"}
        assert not missing, f"{table}: columns the snapshot reads that its trigger does not watch: {missing}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE 'gpupool_snapshot_%'")
        installed = {name for (name,) in cursor.fetchall()}
    for source in migration.WATCHED:
        for event in ("insert", "update", "delete", "truncate"):
            assert f"gpupool_snapshot_{source}_{event}" in installed


def test_a_cycle_reads_increments_and_says_so(tenant):
    node_with_devices(2, name="node-a")
    JobFactory(tenant=tenant)
    first = run_cycle()
    assert first.stats["snapshot_read"] == "full" and len(first.placed) == 1
    JobFactory(tenant=tenant)
    second = run_cycle()
    assert second.stats["snapshot_read"] == "incremental" and len(second.placed) == 1
    assert second.stats["snapshot_changed_rows"] >= 1


def test_with_the_live_snapshot_off_a_cycle_reads_in_full_and_the_log_does_not_grow(tenant, settings, monkeypatch):
    settings.GPUPOOL_SNAPSHOT_INCREMENTAL = False
    monkeypatch.setattr(live_snapshot, "_unread_pruned_at", 0.0)
    node_with_devices(1, name="node-a")
    JobFactory(tenant=tenant)
    assert SnapshotChange.objects.exists()
    result = run_cycle()
    assert result.stats["snapshot_read"] == "full" and len(result.placed) == 1
    # What that cycle itself wrote is at or above the oldest transaction running when it pruned (its own).
    assert not SnapshotChange.objects.filter(source="node").exists()
    assert SnapshotChangeHorizon.objects.get().pruned_below > 0
