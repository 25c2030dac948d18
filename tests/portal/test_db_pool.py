"""The PostgreSQL connection pool: on by default, a dead pooled connection is not handed out (the server
restarted, or an admin ended the backend), and a forked child does not inherit the parent's pool."""

from __future__ import annotations

import copy
import os

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper

pytestmark = pytest.mark.django_db(transaction=True)


def _backend_pid(db=connection) -> int:
    with db.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_a_pooled_connection_the_server_ended_is_replaced_not_handed_out(postgres):
    assert connection.pool is not None and settings.DB_POOL_MAX_SIZE > 0
    # A pool of one connection of its own (the shipped options otherwise), so that the one the server ends is
    # the one the pool would hand out next, whatever other tests left checked out of the shared pool.
    own = copy.deepcopy(connection.settings_dict)
    own["OPTIONS"]["pool"] = {**own["OPTIONS"]["pool"], "min_size": 1, "max_size": 1}
    db = PostgresWrapper(own, alias="pool_check")
    try:
        first = _backend_pid(db)
        db.close()  # back to the pool, as at the end of a request
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [first])
        # The next request borrows from the pool: the ended connection is checked and dropped, a new one serves.
        second = _backend_pid(db)
        assert second != first
    finally:
        db.close()
        db.close_pool()


def test_a_forked_child_starts_its_own_pool(postgres):
    _backend_pid()
    assert PostgresWrapper._connection_pools
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's outcome comes back through the pipe
        os.write(write, b"empty" if not PostgresWrapper._connection_pools else b"inherited")
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 20) == b"empty"
    assert PostgresWrapper._connection_pools  # the parent keeps its own
