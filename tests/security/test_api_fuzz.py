"""Schemathesis over the *whole* OpenAPI schema, against a live server, as a platform admin and as a signed-in
tenant user (member and tenant admin, write-scoped tokens).

tests/tenants/test_api_fuzz.py fuzzes the tenants endpoints (tenants, memberships, users, tokens, quotas,
approvals, notifications, flavor prices, usage, me) with platform-admin tokens. It does not cover jobs, nodes,
devices, flavors, agents, audit and the API root, nor any operation with a tenant user's token: this file does
both, so together every operation is fuzzed with a platform token and every operation with a tenant user's.

Half of the generated ``{id}`` values are replaced by ids of real objects (the caller's own, or another
tenant's), so the requests get past "not found" into the views' logic. Each answer must be below 500 and keep
the ``{"code", "detail"}`` error shape. Bounded: a few examples per operation, derandomized.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter

import pytest

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402

from scheduler.services.jobs import job_submit  # noqa: E402
from tenants.models import MembershipRole, TokenScope  # noqa: E402
from tenants.services.approvals import quota_change_request_create  # noqa: E402
from tenants.services.quotas import quota_set  # noqa: E402
from tenants.services.tokens import api_token_create  # noqa: E402
from tests.factories import (  # noqa: E402
    ApiTokenFactory,
    AuditorFactory,
    SecurityAdminFactory,
    SystemAdminFactory,
    bearer,
)
from tests.frontend.factories import make_flavor, make_node, make_tenant  # noqa: E402
from tests.security.conftest import fast_member  # noqa: E402
from tests.security.fuzzing import fuzz as run_fuzz  # noqa: E402
from tests.security.fuzzing import summary  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: The operations tests/tenants/test_api_fuzz.py already fuzzes with platform tokens.
TENANTS_PATHS = re.compile(
    r"^/api/v1/(tenants|memberships|users|tokens|me|quotas|approvals|notifications|flavor-prices|usage)/"
)
EXAMPLES = 4


@pytest.fixture
def world() -> dict:
    """Two tenants with objects of every kind; ids per resource, the first tenant's first."""
    flavor = make_flavor()
    node = make_node("fuzz-node", devices=2, flavor=flavor)
    ids: dict[str, list[int]] = {"nodes": [node.pk], "devices": list(node.devices.values_list("pk", flat=True))}
    ids["flavors"] = [flavor.pk]
    ids["agents"] = [node.pk]
    users: dict[str, object] = {}
    for slug in ("fuzz-a", "fuzz-b"):
        tenant = make_tenant(slug)
        admin = fast_member(tenant, role=MembershipRole.TENANT_ADMIN, username=f"{slug}-admin")
        member = fast_member(tenant, username=f"{slug}-member")
        quota = quota_set(actor=None, tenant=tenant, flavor=flavor, values={"guaranteed_millis": 1000})
        approval = quota_change_request_create(
            actor=admin, tenant=tenant, flavor=flavor, values={"guaranteed_millis": 2000, "limit_millis": 2000}
        )
        spec = {"name": "fuzz", "tenant": slug, "resources": {"flavors": [flavor.name], "gpus": 1}, "command": ["x"]}
        job = job_submit(actor=member, spec=spec)
        token, _secret = api_token_create(actor=member, name="fuzz", scope=TokenScope.WRITE)
        users[f"{slug}-member"], users[f"{slug}-admin"] = member, admin
        for resource, object_id in (
            ("tenants", tenant.pk),
            ("memberships", member.memberships.get().pk),
            ("users", member.pk),
            ("tokens", token.pk),
            ("quotas", quota.pk),
            ("approvals", approval.pk),
            ("jobs", job.pk),
            ("serving", job.pk),  # /serving/auth/{id}/{name}/: the serving proxy's check of a job's endpoint
        ):
            ids.setdefault(resource, []).append(object_id)
    from audit.models import AuditRecord
    from tenants.models import NotificationDelivery

    ids["audit"] = list(AuditRecord.objects.order_by("pk").values_list("pk", flat=True)[:2])
    ids["notifications"] = list(NotificationDelivery.objects.values_list("pk", flat=True)[:2]) or [1]
    return {"ids": ids, "users": users}


def platform_headers(path: str) -> dict[str, str]:
    """A fresh token of the platform role that owns the path (a fuzzed revoke must not end the run)."""
    if path.startswith("/api/v1/audit/"):
        user, scope = AuditorFactory(username="fuzz-auditor"), TokenScope.READ
    elif path.startswith(("/api/v1/users", "/api/v1/memberships")):
        user, scope = SecurityAdminFactory(username="fuzz-security"), TokenScope.ADMIN
    else:
        user, scope = SystemAdminFactory(username="fuzz-system"), TokenScope.ADMIN
    return bearer(ApiTokenFactory(user=user, scope=scope))


def _resource(path: str) -> str:
    return path.removeprefix("/api/v1/").split("/")[0]


def fuzz(
    operations, headers_for, ids: dict[str, list[int]], *, mode: GenerationMode = GenerationMode.POSITIVE
) -> tuple[list[str], Counter]:
    def real_ids(case) -> None:
        # Half of the generated ids become ids of real objects, so requests get past "not found". Not in negative
        # mode: the id may be the part of the request that breaks the schema, and a real one would mend it (a
        # valid request, rightly accepted, then reported as "schema-violating request accepted").
        if mode == GenerationMode.NEGATIVE:
            return
        # A stable digest: a missing body's repr names its address in memory, which differs from run to run.
        body = "" if type(case.body).__name__ == "NotSet" else repr(case.body)
        digest = zlib.crc32(f"{case.query!r}{body}{case.path_parameters!r}".encode())
        if "id" in (case.path_parameters or {}) and digest % 2 == 0:
            choices = ids[_resource(case.path)]
            case.path_parameters["id"] = choices[(digest // 2) % len(choices)]

    return run_fuzz(operations, headers_for, examples=EXAMPLES, prepare=real_ids, mode=mode)


@pytest.fixture
def schema(live_server):
    return schemathesis.openapi.from_url(f"{live_server.url}/api/schema/?format=json")


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def test_every_operation_outside_the_tenants_fuzz_survives_a_platform_admin(schema, world):
    everything = _operations(schema)
    operations = [op for op in everything if not TENANTS_PATHS.match(op.path)]
    covered = {op.label for op in operations} | {op.label for op in everything if TENANTS_PATHS.match(op.path)}
    assert covered == {op.label for op in everything} and len(everything) >= 60
    assert {op.path.split("/")[3] for op in operations} >= {"jobs", "nodes", "devices", "flavors", "agents", "audit"}
    failures, statuses = fuzz(operations, platform_headers, world["ids"])
    print(summary("platform admin", operations, statuses, failures))
    assert not failures, f"{len(failures)} failed checks:\n" + "\n".join(failures)
    assert statuses["401 outside registration"] == 0, dict(statuses)
    assert sum(count for code, count in statuses.items() if isinstance(code, int) and code < 400) >= len(operations)


@pytest.mark.parametrize("who", ["fuzz-a-member", "fuzz-a-admin"])
def test_every_operation_survives_a_tenant_users_token(schema, world, who):
    operations = _operations(schema)
    assert len(operations) >= 60
    user = world["users"][who]

    def headers(_path: str) -> dict[str, str]:
        # A fresh token per call: a fuzzed DELETE /tokens/{id}/ may revoke the one in use.
        return bearer(ApiTokenFactory(user=user, scope=TokenScope.WRITE))

    failures, statuses = fuzz(operations, headers, world["ids"])
    print(summary(who, operations, statuses, failures))
    assert not failures, f"{len(failures)} failed checks:\n" + "\n".join(failures)
    # Past authentication into the views: some answers succeed, refusals are 403/404, never 401.
    # (Only agent registration answers 401: its fuzzed bootstrap tokens are invalid.)
    assert statuses["401 outside registration"] == 0, dict(statuses)
    assert sum(count for code, count in statuses.items() if isinstance(code, int) and code < 400) >= 20


def test_requests_that_break_the_schema_are_refused(schema, world):
    """Negative mode over every operation, as a platform admin: a body, query or path value the schema forbids
    (a wrong type, a missing required field, a value out of range) is refused with a documented 4xx."""
    operations = _operations(schema)
    failures, statuses = fuzz(operations, platform_headers, world["ids"], mode=GenerationMode.NEGATIVE)
    print(summary("negative, platform admin", operations, statuses, failures))
    assert not failures, f"{len(failures)} failed checks:\n" + "\n".join(failures)
