"""Shared test plumbing.

Tests marked ``services`` need the real PostgreSQL and Redis. They are skipped when those are not
configured (a quick local run) and fail instead under ``GPUPOOL_REQUIRE_SERVICES=1``, which CI sets.
"""

from __future__ import annotations

import os
from urllib.parse import quote

import pytest
from django.conf import settings

from audit.events import register_app_events

# Codes that only tests record (audit_record refuses unregistered codes): the console's search and filter tests
# match on the "console." prefix, so they cannot borrow an app's code.
TEST_AUDIT_EVENTS = [
    ("console.test", "test", "A record a console test wrote"),
    ("console.ok", "test", "A successful record a console test wrote"),
    ("console.bad", "test", "A refused record a console test wrote"),
    ("console.matrix", "test", "A record the console's access matrix reads"),
    ("policy.matrix", "test", "A record the policy matrix reads"),
]
register_app_events("tests", TEST_AUDIT_EVENTS)


def services_required() -> bool:
    return os.environ.get("GPUPOOL_REQUIRE_SERVICES", "") == "1"


def skip_or_fail(reason: str) -> None:
    if services_required():
        pytest.fail(f"{reason} (GPUPOOL_REQUIRE_SERVICES=1, so this is a failure, not a skip)")
    pytest.skip(reason)


def database_url() -> str:
    """The test database as a ``postgres://`` URL, for the real processes a test starts (web, worker)."""
    db = settings.DATABASES["default"]
    auth = quote(db.get("USER") or "postgres")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    return f"postgres://{auth}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


@pytest.fixture
def redis_url() -> str:
    """The configured Redis URL; the test is skipped (or fails in CI) when Redis is not configured."""
    if not settings.REDIS_URL:
        skip_or_fail("GPUPOOL_REDIS_URL is not set")
    return settings.REDIS_URL


@pytest.fixture
def postgres() -> None:
    """Require the PostgreSQL backend for this test."""
    if not settings.IS_POSTGRES:
        skip_or_fail("GPUPOOL_DATABASE_URL does not point at PostgreSQL")


@pytest.fixture(autouse=True)
def live_snapshot_per_test(monkeypatch):
    """Every test's cycles start from a fresh kept state (``scheduler.live_snapshot``), as a new worker would: a
    test's transaction is rolled back at its end, which no change log can tell a state kept past it."""
    monkeypatch.setattr("scheduler.services.cycle._live", None)


@pytest.fixture(autouse=True)
def agent_db_threads_closed():
    """After each test, the agent sockets' database threads (``scheduler.fleet.batching.socket_executor``) give
    their connections back, as a request does when it ends: else they hold the test database open past the
    session, and it cannot be dropped."""
    yield
    from scheduler.fleet.batching import socket_threads_close

    socket_threads_close()


@pytest.fixture(autouse=True)
def audit_witness_per_test(settings, tmp_path_factory, monkeypatch):
    """Every test gets its own audit witness file, also for the processes it starts (workers inherit the
    environment): a real worker seals the chain heads to the witness when it shuts down, and a witness shared
    across tests would hold checkpoints of a test database that a later test's flush has emptied."""
    path = str(tmp_path_factory.mktemp("audit-witness") / "witness.jsonl")
    settings.GPUPOOL_AUDIT_WITNESS_PATH = path
    monkeypatch.setenv("GPUPOOL_AUDIT_WITNESS_PATH", path)
    return path


# --- the suite as the portal's database role (GPUPOOL_TEST_DATABASE_ROLE, set by .ci/run) ----------------------
#
# Production connects as the role ``gpupool db_roles`` creates, which may INSERT and SELECT the audit tables but
# not UPDATE, DELETE or TRUNCATE them. With GPUPOOL_TEST_DATABASE_ROLE=<role>, the test database is created and
# migrated as the owner, the roles are granted on it, and from then on every connection of this process runs
# ``SET ROLE <role>``: PostgreSQL checks the portal's code against exactly those privileges. Django's flush
# (between transactional tests) is a TRUNCATE only the owner may run: it runs as the owner (RESET ROLE). Tests
# that act as the database administrator or the audit admin (tampering, purge, shred) are marked
# ``database_owner`` and run as the owner. Processes a test starts (workers, web) connect as the owner.


def _test_database_role() -> str:
    return os.environ.get("GPUPOOL_TEST_DATABASE_ROLE", "")


def _set_role(connection, role: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SET ROLE {connection.ops.quote_name(role)}" if role else "RESET ROLE")


def _role_on_connect(sender, connection, **kwargs) -> None:
    role = _test_database_role()
    if role and connection.vendor == "postgresql" and getattr(connection, "gpupool_test_role", True):
        _set_role(connection, role)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    role = _test_database_role()
    if not role:
        yield
        return
    from django.core.management import call_command
    from django.db import connection
    from django.db.backends.signals import connection_created

    if connection.vendor != "postgresql":
        yield
        return
    with django_db_blocker.unblock():
        call_command("db_roles", "--portal-role", role, "--admin-role", f"{role}_audit_admin", verbosity=0)
        flush = type(connection.ops).execute_sql_flush

        def execute_sql_flush_as_owner(self, sql_list):
            _set_role(self.connection, "")
            try:
                return flush(self, sql_list)
            finally:
                _set_role(self.connection, role)

        type(connection.ops).execute_sql_flush = execute_sql_flush_as_owner
        connection_created.connect(_role_on_connect, dispatch_uid="gpupool-test-database-role")
        if connection.connection is not None:
            _set_role(connection, role)
    yield
    connection_created.disconnect(dispatch_uid="gpupool-test-database-role")
    type(connection.ops).execute_sql_flush = flush
    with django_db_blocker.unblock():
        if connection.connection is not None:
            _set_role(connection, "")


@pytest.fixture(autouse=True)
def _database_owner_when_marked(request):
    """``@pytest.mark.database_owner``: this test acts as the database owner (a DBA, the audit admin)."""
    if not (_test_database_role() and request.node.get_closest_marker("database_owner")):
        yield
        return
    from django.db import connection

    blocker = request.getfixturevalue("django_db_blocker")
    connection.gpupool_test_role = False  # a connection opened during the test stays the owner
    if connection.connection is not None:
        with blocker.unblock():
            _set_role(connection, "")
    yield
    connection.gpupool_test_role = True
    if connection.connection is not None:
        with blocker.unblock():
            _set_role(connection, _test_database_role())
