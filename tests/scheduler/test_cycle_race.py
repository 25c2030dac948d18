"""No device is ever double-booked, even when cycles race: two threads persisting conflicting plans, and two
real Celery worker processes running cycles on the same snapshot against PostgreSQL and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from scheduler.core import types as core
from scheduler.fleet.models import Device
from scheduler.models import Allocation, Job, JobState
from scheduler.persist import persist_plan
from scheduler.services.jobs import job_submit
from tenants.models import Quota
from tests.conftest import database_url
from tests.scheduler.factories import FlavorFactory, node_with_devices

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

WHOLE = {"name": "w", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["true"]}
HALF = {
    "name": "f",
    "tenant": "team-a",
    "resources": {"flavors": ["sim-80g"], "millis": 500, "memory_mib": 20000},
    "command": ["true"],
}


def assert_no_device_double_booked() -> None:
    for device in Device.objects.all():
        totals = Allocation.objects.active().filter(device=device).aggregate(m=Sum("millis"), mem=Sum("memory_mib"))
        assert (totals["m"] or 0) <= 1000, f"{device.uuid} holds {totals['m']} millis"
        assert (totals["mem"] or 0) <= device.memory_mib, f"{device.uuid} holds {totals['mem']} MiB"


def test_the_database_refuses_a_double_booking_whoever_writes_it(postgres, member, node):
    job = job_submit(actor=member, spec=WHOLE)
    device = node.devices.get(index=0)
    fields = dict(job=job, tenant=job.tenant, flavor=device.flavor, device=device, node=node, started_at=timezone.now())
    Allocation.objects.create(replica=0, millis=500, memory_mib=1000, **fields)
    with pytest.raises(IntegrityError, match="double-booked"), transaction.atomic():
        Allocation.objects.create(replica=1, millis=600, memory_mib=1000, **fields)
    with pytest.raises(IntegrityError, match="memory"), transaction.atomic():
        Allocation.objects.create(replica=2, millis=100, memory_mib=device.memory_mib, **fields)
    Allocation.objects.create(replica=3, millis=500, memory_mib=1000, **fields)  # exactly full is fine
    assert_no_device_double_booked()


def test_two_threads_persisting_conflicting_plans_book_each_card_once(postgres, member, no_cycle_requests):
    node = node_with_devices(4, name="race-node")
    devices = list(node.devices.order_by("index"))
    rounds = []
    for _ in range(4):
        first, second = (job_submit(actor=member, spec=WHOLE) for _ in range(2))
        rounds.append((first, second))
    outcomes: list = []
    errors: list = []

    def persist(job, device, barrier):
        plan = core.Plan(
            places=(
                core.Place(
                    job_id=str(job.pk),
                    tenant="team-a",
                    flavor="sim-80g",
                    assignments=(core.Assignment(0, node.name, device.uuid, 1000, 0),),
                ),
            )
        )
        try:
            barrier.wait(timeout=10)
            outcomes.append(persist_plan(plan))
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    for (first, second), device in zip(rounds, devices, strict=True):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=persist, args=(job, device, barrier)) for job in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert errors == []
    placed = [pk for outcome in outcomes for pk in outcome.placed]
    assert len(placed) == 4  # exactly one job per contested card
    for first, second in rounds:
        assert {Job.objects.get(pk=first.pk).state, Job.objects.get(pk=second.pk).state} == {
            JobState.ADMITTED,
            JobState.QUEUED,
        }
    assert_no_device_double_booked()


@pytest.fixture
def two_workers(transactional_db, redis_url):
    """Two real ``celery worker`` processes on the test database, each on a queue private to this test."""
    queues = [f"test-sched-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    env = {**os.environ, "GPUPOOL_REDIS_URL": redis_url, "GPUPOOL_DATABASE_URL": database_url()}
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "--pool",
                "solo",
                "-Q",
                queue,
                "--hostname",
                f"{queue}@%h",
                "--without-mingle",
                "--without-gossip",
                "--loglevel",
                "WARNING",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for queue in queues
    ]
    try:
        yield queues
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.mark.slow
def test_two_celery_workers_racing_cycles_never_double_book(postgres, two_workers, member, no_cycle_requests):
    from scheduler.tasks import run_cycle

    # Warm both workers up first (their first task connects and loads everything) so that the racing cycles
    # really start together: without the cycle lock both plan from the same snapshot and write concurrently;
    # with it they take turns.
    for queue in two_workers:
        run_cycle.apply_async(kwargs={"hold_lock": True}, queue=queue).get(timeout=120)
    flavor = FlavorFactory()
    # The workers run with the real settings: quotas are required.
    Quota.objects.create(tenant=member.memberships.get().tenant, flavor=flavor, guaranteed_millis=8000)
    node_with_devices(4, name="race-a")
    node_with_devices(4, name="race-b")
    for _ in range(10):
        job_submit(actor=member, spec=WHOLE)
    for _ in range(6):
        job_submit(actor=member, spec=HALF)

    results = []
    for hold_lock in (False, True, False):
        pending = [run_cycle.apply_async(kwargs={"hold_lock": hold_lock}, queue=q) for q in two_workers]
        results.extend(result.get(timeout=120) for result in pending)
    skipped = sum(len(r["skipped"]) for r in results)
    print(f"cycles: {len(results)}, places skipped because the other worker took the devices: {skipped}")

    assert_no_device_double_booked()
    placed_jobs = Job.objects.filter(state=JobState.ADMITTED)
    # 8 cards: 8 whole-card jobs fit, or fewer whole jobs plus fractions sharing cards. Every admitted job holds
    # exactly what it asked for, and nothing else holds devices.
    for job in placed_jobs:
        held = Allocation.objects.active().filter(job=job).aggregate(m=Sum("millis"))["m"]
        assert held == job.millis_per_replica * job.replicas
    assert Allocation.objects.active().exclude(job__state=JobState.ADMITTED).count() == 0
    used = Allocation.objects.active().aggregate(m=Sum("millis"))["m"]
    assert used == 8000  # the pool is full: racing lost no capacity either
