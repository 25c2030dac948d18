"""Prompt cycles: a submit or a finish starts a cycle at once (no debounce timer), a burst of requests shares a
cycle or two, and no request is lost between a cycle and the next; a real Celery worker shows the latency."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from contextlib import nullcontext

import pytest
from django.core.cache import cache
from django.db import connection, transaction

from scheduler import locks
from scheduler.models import Job, JobState
from scheduler.services import cycle as cycle_services
from scheduler.services.jobs import job_submit
from tenants.models import Quota
from tests.conftest import database_url
from tests.scheduler.factories import FlavorFactory, node_with_devices
from tests.scheduler.test_cycle_race import ROOT

SPEC = {"name": "now", "tenant": "team-a", "resources": {"flavors": ["sim-80g"], "gpus": 1}, "command": ["true"]}
KEYS = (cycle_services.CYCLE_DIRTY_KEY, cycle_services.CYCLE_CLAIM_KEY, cycle_services.CYCLE_STARTED_KEY)


@pytest.fixture
def clean_cycle_keys():
    cache.delete_many(KEYS)
    yield
    cache.delete_many(KEYS)


@pytest.fixture
def sent(monkeypatch, clean_cycle_keys):
    """The cycle tasks ``request_cycle`` queues, with their options, instead of queueing them."""
    from scheduler import tasks

    calls: list[dict] = []
    monkeypatch.setattr(tasks.cycle_requested, "apply_async", lambda **options: calls.append(options))
    return calls


def test_a_request_queues_a_cycle_at_once_and_a_burst_queues_only_one(sent):
    assert cycle_services.request_cycle() is True
    assert sent == [{"queue": None}]  # no countdown: the cycle starts as soon as a worker takes it
    assert not any(cycle_services.request_cycle() for _ in range(50))
    assert len(sent) == 1 and cache.get(cycle_services.CYCLE_DIRTY_KEY)


def test_requests_made_during_a_cycle_get_exactly_one_more(sent, monkeypatch):
    cycle_services.request_cycle()
    cycles = []

    def cycle(**kwargs):
        cycles.append(kwargs)
        if len(cycles) == 1:  # three changes land while the first cycle runs
            assert not any(cycle_services.request_cycle() for _ in range(3))
        return cycle_services.CycleResult(ran=True)

    monkeypatch.setattr(cycle_services, "run_cycle", cycle)
    outcome = cycle_services.run_requested_cycles()
    assert (outcome.cycles, outcome.hand_over) == (2, False)
    assert cycles[0] == {"lock_wait_s": cycle_services.CYCLE_LOCK_WAIT_S}
    assert len(sent) == 1  # all served by the task already queued
    assert cache.get(cycle_services.CYCLE_CLAIM_KEY) is None and cache.get(cycle_services.CYCLE_DIRTY_KEY) is None
    assert cycle_services.request_cycle() is True  # the claim is free again: the next change queues a task


def test_a_request_that_lands_as_the_task_lets_go_is_not_lost(sent, monkeypatch):
    """The request finds the claim still held (so queues nothing) just before the task releases it: the task
    looks at the dirty flag once more after releasing and runs the cycle itself."""
    cycle_services.request_cycle()
    monkeypatch.setattr(cycle_services, "run_cycle", lambda **kwargs: cycle_services.CycleResult(ran=True))
    real_delete = cache.delete
    raced = []

    def delete(key, *args, **kwargs):
        if key == cycle_services.CYCLE_CLAIM_KEY and not raced:
            raced.append(cycle_services.request_cycle())
        return real_delete(key, *args, **kwargs)

    monkeypatch.setattr(cycle_services.cache, "delete", delete)
    assert cycle_services.run_requested_cycles().cycles == 2
    assert raced == [False] and len(sent) == 1


def test_a_cycle_that_finds_the_lock_busy_is_run_again_not_dropped(sent, monkeypatch):
    cycle_services.request_cycle()
    answers = iter([False, True])
    monkeypatch.setattr(cycle_services, "run_cycle", lambda **kwargs: cycle_services.CycleResult(ran=next(answers)))
    assert cycle_services.run_requested_cycles().cycles == 1
    assert cache.get(cycle_services.CYCLE_DIRTY_KEY) is None


def test_a_task_that_keeps_being_asked_hands_over_to_a_fresh_one(sent, monkeypatch):
    cycle_services.request_cycle()

    def busy(**kwargs):
        cycle_services.request_cycle()  # a change during every cycle
        return cycle_services.CycleResult(ran=True)

    monkeypatch.setattr(cycle_services, "run_cycle", busy)
    outcome = cycle_services.run_requested_cycles(max_s=0.0)
    assert (outcome.cycles, outcome.hand_over) == (1, True)
    assert cache.get(cycle_services.CYCLE_CLAIM_KEY)  # kept for the task it hands over to


def test_a_failed_cycle_leaves_its_request_for_the_retry(sent, monkeypatch):
    from django.db import OperationalError

    cycle_services.request_cycle()

    def deadlocked(**kwargs):
        raise OperationalError("deadlock detected")

    monkeypatch.setattr(cycle_services, "run_cycle", deadlocked)
    with pytest.raises(OperationalError):
        cycle_services.run_requested_cycles()
    assert cache.get(cycle_services.CYCLE_DIRTY_KEY) and cache.get(cycle_services.CYCLE_CLAIM_KEY)


def test_a_restarted_worker_releases_a_dead_workers_claim_and_serves_its_request(sent):
    cache.set(cycle_services.CYCLE_DIRTY_KEY, 1)
    cache.set(cycle_services.CYCLE_CLAIM_KEY, 1)  # left by a worker killed mid-cycle
    cycle_services.cycle_claim_release()
    assert len(sent) == 1


@pytest.mark.django_db(transaction=True)
def test_a_requested_cycle_waits_for_the_lock_instead_of_giving_up(member, node, no_cycle_requests):
    job = job_submit(actor=member, spec=SPEC)
    holding, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        scope = transaction.atomic() if connection.vendor == "postgresql" else nullcontext()
        try:
            with scope, locks.cycle_lock() as held:
                assert held
                holding.set()
                release.wait(timeout=30)
        finally:
            holding.set()
            connection.close()

    thread = threading.Thread(target=hold_the_lock)
    thread.start()
    try:
        assert holding.wait(timeout=30)
        assert cycle_services.run_cycle(lock_wait_s=0.2).ran is False  # waited 0.2 s, then gave up
        threading.Timer(0.3, release.set).start()
        result = cycle_services.run_cycle(lock_wait_s=30)
    finally:
        release.set()
        thread.join(timeout=30)
    assert result.ran and result.placed == [job.pk]
    assert {"snapshot_s", "plan_s", "persist_s"} <= set(result.stats)


@pytest.fixture
def cycle_worker(transactional_db, redis_url, monkeypatch, clean_cycle_keys):
    """A real ``celery worker`` process on the test database, taking requested cycles from a private queue."""
    queue = f"test-cycle-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "GPUPOOL_REDIS_URL": redis_url, "GPUPOOL_DATABASE_URL": database_url()}
    command = [sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool", "solo", "-Q", queue]
    command += ["--hostname", f"{queue}@%h", "--without-mingle", "--without-gossip", "--loglevel", "WARNING"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    monkeypatch.setattr(cycle_services, "CYCLE_QUEUE", queue)
    try:
        from scheduler.tasks import run_cycle

        run_cycle.apply_async(queue=queue).get(timeout=120)  # started, connected, everything imported
        cache.delete_many(KEYS)
        yield queue
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _wait_for(predicate, timeout_s: float = 10.0) -> float:
    """Seconds until ``predicate()`` holds (polled every 5 ms); fails after ``timeout_s``."""
    start = time.perf_counter()
    while not predicate():
        assert time.perf_counter() - start < timeout_s, "timed out"
        time.sleep(0.005)
    return time.perf_counter() - start


@pytest.mark.services
@pytest.mark.slow
def test_a_submit_starts_a_cycle_on_a_real_worker_without_waiting_for_a_timer(postgres, cycle_worker, member):
    flavor = FlavorFactory()
    # The worker runs with the real settings: quotas are required.
    Quota.objects.create(tenant=member.memberships.get().tenant, flavor=flavor, guaranteed_millis=8000)
    node_with_devices(8, name="prompt-node")
    latencies = []
    for _ in range(3):
        before = time.time()
        job = job_submit(actor=member, spec=SPEC)  # request_cycle runs on commit, as in production
        started = _wait_for(lambda before=before: (cache.get(cycle_services.CYCLE_STARTED_KEY) or 0) > before)
        admitted = _wait_for(lambda job=job: Job.objects.get(pk=job.pk).state == JobState.ADMITTED)
        latencies.append((started, started + admitted))
    print("submit → cycle start, → admitted (s):", [(round(s, 3), round(a, 3)) for s, a in latencies])
    # The old trigger queued every cycle with a 1 s countdown (and no beat runs here): a cycle that starts
    # before 1 s can only be the prompt one.
    assert sorted(started for started, _admitted in latencies)[1] < 1.0, latencies

    # A burst of submits: every one of them is placed without a timer either.
    burst = [job_submit(actor=member, spec=SPEC) for _ in range(5)]
    _wait_for(lambda: Job.objects.filter(pk__in=[j.pk for j in burst], state=JobState.ADMITTED).count() == 5)
