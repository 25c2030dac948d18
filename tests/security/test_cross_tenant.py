"""A tenant's users try every object id of another tenant on every detail and action endpoint.

The endpoints are not listed by hand: every operation of the OpenAPI schema with an ``{id}`` in its path, and
every console URL with a ``<pk>``, is tried with the other tenant's ids by a member and by a tenant admin of
the intruding tenant (API tokens with write scope; console sessions). Each answer must be a refusal that tells
nothing: the same status as for an id that does not exist (no existence oracle), 404 for the tenant's own
objects, no name of the victim tenant in the body — and no row of any product table (audit trail included)
may change.

Hand-picked cases of the same rule are in tests/tenants/test_api_roles.py, test_api_quotas.py,
tests/scheduler/test_api.py and tests/frontend/test_jobs_pages.py / test_quotas_approvals.py.
"""

from __future__ import annotations

import re

import pytest
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from audit.models import AuditRecord
from scheduler.fleet.models import Device
from scheduler.models import Job
from scheduler.services.cycle import run_cycle
from scheduler.services.jobs import job_submit
from tenants.models import ApiToken, Membership, MembershipRole, NotificationDelivery, Quota, TokenScope
from tenants.services.approvals import quota_change_request_create
from tenants.services.quotas import quota_set
from tenants.services.tokens import api_token_create
from tests.frontend.factories import make_flavor, make_node, make_tenant
from tests.security.conftest import fast_member as make_member
from tests.security.conftest import state_fingerprint

pytestmark = pytest.mark.django_db

MISSING_ID = 987654321
#: Request bodies for the operations that take one: valid in shape, so a refusal is about the object.
BODIES = {
    "/api/v1/approvals/{id}/resubmit/": {"comment": "x", "values": {"guaranteed_millis": 0}},
    "/api/v1/jobs/{id}/cancel/": {"reason": "x"},
    "/api/v1/memberships/{id}/": {"role": "tenant_admin"},
    "/api/v1/tenants/{id}/": {"name": "taken over"},
    "/api/v1/tenants/{id}/approval-threshold/": {"threshold_millis": 1},
    "/api/v1/users/{id}/": {"email": "attacker@example.com"},
    "/api/v1/users/{id}/set-password/": {"password": "a-new-password-of-the-attacker"},
    "/api/v1/nodes/{id}/drain/": {"grace_s": 1},
}
#: The pool's inventory, which every signed-in user may read (never another tenant's jobs on it).
SHARED_READABLE = ("nodes", "devices", "flavors")
#: Resources a tenant's users may use at all: another tenant's object must be "not found" there. Notification
#: deliveries are the platform admins' (the access policy gives tenant roles no notification.view rule): a tenant
#: user gets the same 403 for a real id as for a missing one.
TENANT_OWNED = ("approvals", "jobs", "memberships", "quotas", "tenants", "tokens", "serving")


@pytest.fixture
def victim():
    """Tenant ``victim-co`` (company) with a team, a member's job, token, quota, approval and audit records."""
    flavor = make_flavor()
    node = make_node("victim-node", devices=1, flavor=flavor)
    company = make_tenant("victim-co")
    team = make_tenant("victim-team", parent=company)
    admin = make_member(company, role=MembershipRole.TENANT_ADMIN, username="victim-admin")
    member = make_member(team, username="victim-member")
    quota_set(actor=None, tenant=company, flavor=flavor, values={"guaranteed_millis": 4000, "limit_millis": 4000})
    quota = quota_set(actor=None, tenant=team, flavor=flavor, values={"guaranteed_millis": 1000, "limit_millis": 1000})
    approval = quota_change_request_create(
        actor=admin, tenant=team, flavor=flavor, values={"guaranteed_millis": 2000, "limit_millis": 2000}
    )
    delivery = NotificationDelivery.objects.create(
        approval=approval, event="approval.created", notifier="tenants.notifiers.EmailNotifier", subject="s", body="b"
    )
    token, _secret = api_token_create(actor=member, name="victim-token", scope=TokenScope.WRITE)
    spec = {"name": "victim-job", "tenant": "victim-team", "resources": {"flavors": [flavor.name], "gpus": 1}}
    job = job_submit(actor=member, spec={**spec, "command": ["python", "secret.py"]})
    assert run_cycle().placed == [job.pk]  # on victim-node: its node and device pages know of the job
    record = AuditRecord.objects.filter(stream=f"tenant:{team.pk}").order_by("seq").first()
    ids = {
        "approvals": approval.pk,
        "jobs": job.pk,
        "memberships": Membership.objects.get(user=member).pk,
        "quotas": quota.pk,
        "tenants": team.pk,
        "tokens": token.pk,
        "notifications": delivery.pk,
        "users": member.pk,
        "audit": record.pk,
        "nodes": node.pk,
        "devices": Device.objects.filter(node=node).first().pk,
        "flavors": flavor.pk,
        "agents": node.pk,
        "serving": job.pk,  # /serving/auth/{id}/{name}/: the proxy's check of a job's endpoint
    }
    return {"ids": ids, "company": company, "team": team}


@pytest.fixture
def intruders():
    tenant = make_tenant("intruder-co")
    users = {
        "member": make_member(tenant, username="intruder-member"),
        "tenant_admin": make_member(tenant, role=MembershipRole.TENANT_ADMIN, username="intruder-admin"),
    }
    return {
        role: (user, api_token_create(actor=user, name="t", scope=TokenScope.WRITE)[1]) for role, user in users.items()
    }


def detail_operations() -> list[tuple[str, str]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    operations = []
    for path, item in schema["paths"].items():
        if "{id}" not in path:
            continue
        for method in ("get", "post", "put", "patch", "delete"):
            if method in item:
                operations.append((method, path))
    return operations


def _resource(path: str) -> str:
    return path.removeprefix("/api/v1/").split("/")[0]


def _call(client: APIClient, method: str, path: str, object_id: int):
    url = path.replace("{id}", str(object_id))
    body = BODIES.get(path)
    if method == "get":
        return client.get(url)
    return getattr(client, method)(url, body or {}, format="json")


def test_every_detail_and_action_endpoint_refuses_another_tenants_ids(victim, intruders):
    operations = detail_operations()
    assert len(operations) >= 30, operations  # the schema is read, not an empty list
    unknown = {_resource(path) for _method, path in operations} - set(victim["ids"])
    assert not unknown, f"new detail endpoints: give the victim an object for {unknown}"
    before = state_fingerprint()
    victim_names = re.compile(r"victim-(co|team|member|admin|job|node|token)")
    problems = []
    for role, (_user, secret) in intruders.items():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        for method, path in operations:
            resource = _resource(path)
            real = _call(client, method, path, victim["ids"][resource])
            missing = _call(client, method, path, MISSING_ID)
            label = f"{role} {method.upper()} {path}"
            if resource in TENANT_OWNED and real.status_code != 404:
                problems.append(f"{label}: {real.status_code}, expected 404")
            elif method == "get" and resource in SHARED_READABLE and real.status_code == 200:
                pass  # the pool's inventory is readable by every user; its body is checked for names below
            elif real.status_code != missing.status_code:
                problems.append(f"{label}: {real.status_code} for a real id, {missing.status_code} for a missing one")
            elif method != "get" and real.status_code < 400:
                problems.append(f"{label}: {real.status_code} (changed a platform object)")
            if victim_names.search(real.content.decode(errors="replace").replace("victim-node", "")):
                problems.append(f"{label}: the answer names the victim tenant's objects")
    assert not problems, "\n".join(problems)
    after = state_fingerprint()
    changed = [label for label in before if before[label] != after[label]]
    assert set(changed) <= {"audit.AuditRecord", "audit.ChainHead"}, f"refused requests changed {changed}"
    # A non-auditor reaching for the audit trail is itself audited (DESIGN 12), for real and missing ids alike;
    # nothing else was recorded.
    seen_before = {row[0] for row in before["audit.AuditRecord"]}
    new = AuditRecord.objects.exclude(pk__in=seen_before).values_list("action", "outcome", "target")
    assert {(action, outcome) for action, outcome, _target in new} <= {("audit.access_denied", "denied")}
    targets = sorted(target for _action, _outcome, target in new)
    assert targets == sorted(
        f"/api/v1/audit/records/{object_id}/"
        for object_id in (victim["ids"]["audit"], MISSING_ID)
        for _role in intruders
    )


def test_every_console_detail_page_refuses_another_tenants_ids(victim, intruders):
    ids = victim["ids"]
    pages = [
        ("get", f"/console/jobs/{ids['jobs']}/", {}),
        ("post", f"/console/jobs/{ids['jobs']}/cancel/", {"reason": "x"}),
        ("get", f"/console/tenants/{victim['team'].pk}/", {}),
        ("get", f"/console/tenants/{victim['company'].pk}/", {}),
        ("post", f"/console/tenants/{victim['team'].pk}/quota-request/", {"q-flavor": "nvidia-h100-80g"}),
        ("get", f"/console/approvals/{ids['approvals']}/", {}),
        ("post", f"/console/approvals/{ids['approvals']}/", {"decision": "approve", "comment": "ok"}),
        ("get", f"/console/audit/{ids['audit']}/", {}),
        ("get", f"/console/nodes/{ids['nodes']}/", {}),
        ("post", f"/console/nodes/{ids['nodes']}/action/", {"action": "cordon"}),
    ]
    clients = {}
    for role, (user, _secret) in intruders.items():
        clients[role] = Client()
        clients[role].force_login(user)  # signing in is audited: before the fingerprint
    before = state_fingerprint()
    for role, client in clients.items():
        for method, url, data in pages:
            response = getattr(client, method)(url, data)
            missing = getattr(client, method)(re.sub(r"/\d+/", f"/{MISSING_ID}/", url, count=1), data)
            assert response.status_code in (403, 404), (role, method, url, response.status_code)
            assert response.status_code == missing.status_code, (role, method, url)
    assert state_fingerprint() == before
    # The victim's own objects are as they were: the job still admitted, the quota and token untouched.
    assert Job.objects.get(pk=ids["jobs"]).state == "admitted"
    assert Quota.objects.get(pk=ids["quotas"]).guaranteed_millis == 1000
    assert ApiToken.objects.get(pk=ids["tokens"]).revoked_at is None
