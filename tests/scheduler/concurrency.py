"""What the concurrency tests on PostgreSQL share: API clients with tokens, agents that finish what the cycles
place, a thread that runs cycles, and the race itself — client threads against those background threads until
every job has ended, every failure in any thread kept for the test to assert on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.db import connection

from scheduler.fleet.models import Node
from scheduler.fleet.services.workload_reports import workload_status_report
from scheduler.models import Allocation, JobState
from scheduler.services.cycle import run_cycle
from tests.factories import ApiTokenFactory
from tests.scheduler.factories import MembershipFactory, UserFactory

FINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}


def deadlocks() -> int:
    """Deadlocks PostgreSQL has counted in this database (its statistics lag up to a second)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def member_tokens(count: int, tenants: list) -> list[tuple[object, str]]:
    """``count`` members spread over ``tenants`` in turn, each with an API token: ``(token, tenant slug)``."""
    tokens = []
    for index in range(count):
        user = UserFactory(username=f"client-{index}")
        tenant = tenants[index % len(tenants)]
        MembershipFactory(user=user, tenant=tenant, role="member")
        tokens.append((ApiTokenFactory(user=user), tenant.slug))
    return tokens


class Race:
    """Client threads raced against background loops (agents, cycles) that run until the race is over."""

    def __init__(self) -> None:
        self.failures: list[BaseException] = []
        self.stop = threading.Event()

    def _guarded(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # every thread's failure reaches the test's assertion
                self.failures.append(exc)
            finally:
                connection.close()

        return run

    def loop(self, step: Callable[[], None], pause_s: float) -> Callable[[], None]:
        """``step`` again and again, ``pause_s`` apart, until the race stops."""

        def body() -> None:
            while not self.stop.is_set():
                step()
                time.sleep(pause_s)

        return body

    def cycles(self, pause_s: float) -> Callable[[], None]:
        """Scheduling cycles, one after the other (the request to run one is patched out by the tests)."""
        return self.loop(run_cycle, pause_s)

    def agent(self, node_pk: int, *, report_running: bool, reports: list | None = None) -> Callable[[], None]:
        """Reports as an agent would: each placed replica succeeded (first ``running``, with ``report_running``),
        each at least once; what was reported goes into ``reports`` as ``(job id, state)``."""
        node = Node.objects.get(pk=node_pk)
        running: set[tuple[int, int]] = set()

        def report(job_id: int, replica: int, state: str) -> None:
            exit_code = 0 if state == "succeeded" else None
            workload_status_report(
                node=node, job_id=job_id, replica=replica, state=state, exit_code=exit_code, last_checkpoint_at=None
            )
            if reports is not None:
                reports.append((job_id, state))

        def step() -> None:
            nonlocal running
            held = set(Allocation.objects.active().filter(node_id=node_pk).values_list("job_id", "replica").distinct())
            if report_running:
                for job_id, replica in sorted(held - running):
                    report(job_id, replica, "running")
                    running.add((job_id, replica))
                done = running & held
            else:
                done = held
            for job_id, replica in sorted(done):
                report(job_id, replica, "succeeded")
            running &= held

        return self.loop(step, 0.01)

    def run(
        self,
        clients: list[Callable[[], None]],
        background: list[Callable[[], None]],
        *,
        settled: Callable[[], bool],
        timeout_s: float,
    ) -> None:
        """Start everything; once the clients are done, wait (at most ``timeout_s``) until ``settled``, then
        stop the background loops and wait for them."""
        client_threads = [threading.Thread(target=self._guarded(body)) for body in clients]
        loops = [threading.Thread(target=self._guarded(body)) for body in background]
        for thread in client_threads + loops:
            thread.start()
        for thread in client_threads:
            thread.join()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.failures and not settled():
            time.sleep(0.2)
        self.stop.set()
        for thread in loops:
            thread.join()
