"""Property-based API fuzzing with schemathesis against a live server of our own OpenAPI schema.

Bounded (few examples per operation) so it runs in well under a few minutes; marked ``slow``. It checks that
no generated request — valid or not — makes the server answer 5xx, and that every error keeps the
``{"code", "detail"}`` shape. It covers the tenants endpoints (``/api/v1/{tenants,memberships,users,tokens,
me}``); run it with ``pytest -m slow tests/tenants/test_api_fuzz.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from tenants.models import MembershipRole  # noqa: E402
from tests.factories import (  # noqa: E402
    ApiTokenFactory,
    MembershipFactory,
    SecurityAdminFactory,
    SystemAdminFactory,
    TenantFactory,
    UserFactory,
    bearer,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TENANTS_PATHS = r"^/api/v1/(tenants|memberships|users|tokens|me|quotas|approvals|notifications|flavor-prices|usage)/"


@pytest.fixture
def api_schema(live_server):
    root = TenantFactory(slug="fuzz-root")
    team = TenantFactory(slug="fuzz-team", parent=root)
    MembershipFactory(user=UserFactory(username="fuzz-member"), tenant=team, role=MembershipRole.MEMBER)
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/?format=json")
    return schema.include(path_regex=TENANTS_PATHS)


def _fresh_token_headers(path: str) -> dict[str, str]:
    """A new admin-scoped token for every call, so a generated DELETE /tokens/{id}/ that revokes the token in
    use does not turn the rest of the run into 401s. Users and memberships are the security admin's."""
    if path.startswith(("/api/v1/users", "/api/v1/memberships")):
        user = SecurityAdminFactory(username="fuzz-security")
    else:
        user = SystemAdminFactory(username="fuzz-system")
    return bearer(ApiTokenFactory(user=user, scope="admin"))


def _error_shape(response) -> None:
    if response.status_code >= 400 and response.headers.get("Content-Type", [""])[0].startswith("application/json"):
        body = response.json()
        assert isinstance(body, dict) and {"code", "detail"} <= set(body), f"error without code/detail: {body}"


def test_no_generated_request_makes_the_server_fail(api_schema):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 30, [op.label for op in operations]
    failures = []
    statuses: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        def check(case) -> None:
            response = case.call(headers=_fresh_token_headers(case.path))
            statuses.append(response.status_code)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path} query={case.query!r} body={case.body!r}: "
                f"{response.status_code} {response.text[:200]}"
            )
            _error_shape(response)

        try:
            check()
        except AssertionError as exc:
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n".join(failures)
    print(f"schemathesis: {len(statuses)} requests over {len(operations)} operations, statuses {Counter(statuses)}")
    # The run must reach the endpoints' logic, not just bounce off authentication.
    assert sum(1 for code in statuses if code < 400) >= len(operations)
