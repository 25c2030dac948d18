"""When CI runs the suite as the portal's database role (GPUPOOL_TEST_DATABASE_ROLE, tests/conftest.py), the
tests really run as it: PostgreSQL refuses it what it refuses the portal in production."""

from __future__ import annotations

import os

import pytest
from django.db import DatabaseError, connection, transaction

from audit.services import audit_record

pytestmark = [pytest.mark.django_db, pytest.mark.services]


@pytest.fixture
def suite_role(postgres) -> str:
    role = os.environ.get("GPUPOOL_TEST_DATABASE_ROLE", "")
    if not role:
        pytest.skip("GPUPOOL_TEST_DATABASE_ROLE is not set (.ci/run sets it)")
    return role


def test_tests_run_as_the_portal_role(suite_role):
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        assert cursor.fetchone()[0] == suite_role
    audit_record(action="user.create", actor=None, target="user:1")
    for sql in (
        "DELETE FROM audit_auditrecord",
        "UPDATE audit_auditrecord SET target = ''",
        "TRUNCATE audit_chainhead",
    ):
        with pytest.raises(DatabaseError, match="permission denied"), transaction.atomic(), connection.cursor() as c:
            c.execute(sql)


@pytest.mark.database_owner
def test_a_database_owner_test_runs_as_the_owner(suite_role):
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        assert cursor.fetchone()[0] != suite_role
