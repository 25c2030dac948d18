"""Property-based API fuzzing with schemathesis against a live server of our own OpenAPI schema.

Bounded (few examples per operation) so it runs in well under a few minutes; marked ``slow``. Every answer
must conform to the schema (below 500, a documented status code, content type and body: see
tests/security/fuzzing.py) and every error keep the ``{"code", "detail"}`` shape. It covers the tenants
endpoints (``/api/v1/{tenants,memberships,users,tokens,me,...}``); run it with
``pytest -m slow tests/tenants/test_api_fuzz.py``.
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

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
from tests.security.fuzzing import fuzz, summary  # noqa: E402

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


def test_no_generated_request_makes_the_server_fail(api_schema):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 30, [op.label for op in operations]
    failures, statuses = fuzz(operations, _fresh_token_headers, examples=10)
    print(summary("tenants endpoints, platform admins", operations, statuses, failures))
    assert not failures, f"{len(failures)} failed checks:\n" + "\n".join(failures)
    # The run must reach the endpoints' logic, not just bounce off authentication.
    assert sum(count for code, count in statuses.items() if isinstance(code, int) and code < 400) >= len(operations)
