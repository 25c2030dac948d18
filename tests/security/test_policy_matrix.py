"""Role x endpoint, generated from the access policy (issue 15 item 4).

Every operation of the OpenAPI schema and every console page (GET, and POST where it takes one) is called as
every principal: system admin, security admin, auditor, tenant admin of the tenant / of its parent / of a
sibling, member, viewer, and API tokens of each scope. The answer must be the one the policy predicts
(``expected_api`` and ``expected_console`` read ``kernel.access_rules`` through ``tenants.access``, they state no
rule of their own):

- API: a token whose scope does not cover the action → 403; a tenant-scoped object the caller may not read →
  404; no rule for the action (or none reaching the object) → 403; otherwise allowed (2xx, or a 400/409/422
  the body or the object's state earns once the permission passed).
- Console: a section or page whose action the caller has no rule for → 404; an object the caller may not
  read → 404; otherwise the page answers (200, or a redirect after a POST).

An endpoint without a policy action fails the test. Calls that change things run in a transaction that is
rolled back, so every case starts from the same world.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from audit.models import AuditRecord
from audit.services import audit_record
from frontend.access import policy_action_of
from kernel.access_rules import NO_ACCOUNT_ACTIONS, RULES, TOKEN_SCOPE, Action, Principal
from scheduler.fleet.models import Node
from scheduler.models import Job, JobArray, JobOutput
from scheduler.services.jobs import job_submit
from tenants.access import allows, may, restrict, token_allows
from tenants.models import (
    ApiToken,
    ApprovalRequest,
    Membership,
    MembershipRole,
    NotificationDelivery,
    PlatformRole,
    Quota,
    Tenant,
    TokenScope,
    User,
)
from tenants.permissions import can_decide_approval, policy_action_for
from tenants.services.approvals import quota_change_request_create
from tenants.services.quotas import quota_set
from tests.factories import (
    ApiTokenFactory,
    AuditorFactory,
    MembershipFactory,
    SecurityAdminFactory,
    SystemAdminFactory,
    TenantFactory,
    UserFactory,
    bearer,
)
from tests.scheduler.factories import FlavorFactory, JobFactory, node_with_devices

pytestmark = pytest.mark.django_db

SESSION_PRINCIPALS = [
    "system_admin",
    "security_admin",
    "auditor",
    "tenant_admin",
    "parent_admin",
    "sibling_admin",
    "member",
    "viewer",
]
TOKEN_PRINCIPALS = [
    "system_admin:read",
    "system_admin:write",
    "system_admin:admin",
    "member:read",
    "member:write",
]
PRINCIPALS = SESSION_PRINCIPALS + [f"token:{name}" for name in TOKEN_PRINCIPALS]

#: Answers that mean "the permission passed" (a body or state the service then refuses is not a denial).
ALLOWED = {200, 201, 202, 204, 301, 302, 303, 400, 409, 422}

#: The action that reads each model: an object the caller cannot read this way is missing to them.
READ_ACTION = {
    Tenant: Action.TENANT_VIEW,
    Membership: Action.MEMBERSHIP_VIEW,
    User: Action.USER_VIEW,
    ApiToken: Action.TOKEN_VIEW,
    Quota: Action.QUOTA_VIEW,
    ApprovalRequest: Action.APPROVAL_VIEW,
    Job: Action.JOB_VIEW,
}

#: Actions whose view hides an object from whoever may not take the action on it (not from whoever may not read
#: it): the serving proxy's check answers 404 for a job the caller may read but not call.
HIDDEN_BY_OWN_ACTION = {Action.JOB_SERVE}

#: Object rules finer than the table's scopes, asked through the predicate that services use (which asks
#: the table first): an approval's step waits for one role.
OBJECT_RULE = {Action.APPROVAL_DECIDE: can_decide_approval}


@dataclass
class World:
    parent: Tenant
    tenant: Tenant
    sibling: Tenant
    users: dict[str, User]
    tokens: dict[str, ApiToken]
    flavor: Any
    node: Node
    device: Any
    job: Job
    array_job: Job
    approval: ApprovalRequest
    notification: NotificationDelivery
    quota: Quota
    membership: Membership
    record: AuditRecord
    newbie: User


def build_world() -> World:
    parent = TenantFactory(name="ACME", slug="acme")
    tenant = TenantFactory(name="Vision", slug="acme-vision", parent=parent)
    sibling = TenantFactory(name="NLP", slug="acme-nlp", parent=parent)
    users = {
        "system_admin": SystemAdminFactory(username="sys"),
        "security_admin": SecurityAdminFactory(username="sec"),
        "auditor": AuditorFactory(username="aud"),
        "tenant_admin": UserFactory(username="vadmin"),
        "parent_admin": UserFactory(username="padmin"),
        "sibling_admin": UserFactory(username="nadmin"),
        "member": UserFactory(username="vmember"),
        "viewer": UserFactory(username="vviewer"),
    }
    MembershipFactory(user=users["tenant_admin"], tenant=tenant, role=MembershipRole.TENANT_ADMIN)
    MembershipFactory(user=users["parent_admin"], tenant=parent, role=MembershipRole.TENANT_ADMIN)
    MembershipFactory(user=users["sibling_admin"], tenant=sibling, role=MembershipRole.TENANT_ADMIN)
    MembershipFactory(user=users["member"], tenant=tenant, role=MembershipRole.MEMBER)
    membership = MembershipFactory(user=users["viewer"], tenant=tenant, role=MembershipRole.VIEWER)
    tokens = {}
    for name in TOKEN_PRINCIPALS:
        owner, scope = name.split(":")
        tokens[name] = ApiTokenFactory(user=users[owner], scope=scope)
    flavor = FlavorFactory()
    node = node_with_devices(1)
    device = node.devices.get()
    quota_set(actor=None, tenant=parent, flavor=flavor, values={"guaranteed_millis": 4000})
    quota = quota_set(actor=None, tenant=tenant, flavor=flavor, values={"guaranteed_millis": 2000})
    job = job_submit(
        actor=users["member"],
        spec={
            "name": "j",
            "tenant": tenant.slug,
            "resources": {"flavors": [flavor.name], "gpus": 1},
            "command": ["x"],
            "ports": [{"name": "http"}],  # an endpoint for the serving proxy's check
        },
    )
    # An output of the job's replica 0 (the download endpoint's object).
    JobOutput(job=job, replica=0, size_bytes=3, sha256="0" * 64, created_at=timezone.now()).file.save(
        "matrix.tar.gz", ContentFile(b"abc"), save=True
    )
    array_job = JobFactory(
        tenant=tenant, submitter=users["member"], flavors=[flavor.name], array_id=uuid.uuid4(), array_index=0
    )
    JobArray.objects.create(
        array_id=array_job.array_id, tenant=tenant, head=array_job, count=3, unmaterialized=[[1, 3]], waiting=2
    )
    approval = quota_change_request_create(
        actor=users["tenant_admin"], tenant=tenant, flavor=flavor, values={"guaranteed_millis": 3000}, reason="more"
    )
    notification = NotificationDelivery.objects.order_by("pk").first()
    record = audit_record(action="policy.matrix", actor=None)
    return World(
        parent=parent,
        tenant=tenant,
        sibling=sibling,
        users=users,
        tokens=tokens,
        flavor=flavor,
        node=node,
        device=device,
        job=job,
        array_job=array_job,
        approval=approval,
        notification=notification,
        quota=quota,
        membership=membership,
        record=record,
        newbie=UserFactory(username="newbie"),
    )


@pytest.fixture
def world(db) -> World:
    return build_world()


# --- the API ------------------------------------------------------------------------------------------------


@dataclass
class Operation:
    method: str
    template: str


@functools.cache
def api_operations() -> list[Operation]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return [
        Operation(method.upper(), path)
        for path, methods in schema["paths"].items()
        for method in methods
        if method in {"get", "post", "put", "patch", "delete"}
    ]


def _path_object(world: World, template: str) -> Any:
    """The world's object a path names (None for a path that names none)."""
    if "{" not in template:
        return None
    tail = template.removeprefix("/api/v1/")
    table = [
        ("agents/devices/", world.device),
        ("agents/outputs/", world.job),
        ("serving/auth/", world.job),
        ("agents/nodes/", world.node),
        ("approvals/", world.approval),
        ("audit/records/", world.record),
        ("devices/", world.device),
        ("flavors/", world.flavor),
        ("jobs/arrays/", world.array_job),
        ("jobs/", world.job),
        ("memberships/", world.membership),
        ("nodes/", world.node),
        ("notifications/", world.notification),
        ("quotas/", world.quota),
        ("tenants/", world.tenant),
        ("tokens/", world.tokens["member:read"]),
        ("users/", world.users["member"]),
    ]
    for prefix, obj in table:
        if tail.startswith(prefix):
            return obj
    raise AssertionError(f"{template}: the matrix does not know which object this path names; add it.")


def _url(world: World, template: str) -> str:
    obj = _path_object(world, template)
    if obj is None:
        url = template
    elif "{array_id}" in template:
        url = template.replace("{array_id}", str(obj.array_id)).replace("{index}", "1")
    else:
        url = re.sub(r"\{[a-z_]+\}", str(obj.pk), template.replace("{name}", "http").replace("{replica}", "0"))
    now = timezone.now()
    window = {"start": (now - dt.timedelta(days=1)).isoformat(), "end": (now + dt.timedelta(hours=1)).isoformat()}
    if url in {"/api/v1/usage/", "/api/v1/audit/export/"}:
        from urllib.parse import urlencode

        url += "?" + urlencode(window)
    return url


def _body(world: World, method: str, template: str) -> tuple[dict | None, Tenant | None]:
    """A valid body for the operation, and the tenant the body names (an object the caller must see)."""
    t = world.tenant
    bodies: dict[tuple[str, str], tuple[dict, Tenant | None]] = {
        ("POST", "/api/v1/agents/bootstrap-tokens/"): ({}, None),
        ("POST", "/api/v1/agents/devices/{id}/rehome/"): ({"node": world.node.name}, None),
        ("POST", "/api/v1/agents/register/"): ({"token": "gpb_not_a_token", "node_name": "n-matrix"}, None),
        ("POST", "/api/v1/approvals/{id}/approve/"): ({"comment": "ok"}, None),
        ("POST", "/api/v1/approvals/{id}/reject/"): ({"comment": "no"}, None),
        ("POST", "/api/v1/approvals/{id}/request-changes/"): ({"comment": "less"}, None),
        ("POST", "/api/v1/approvals/{id}/cancel/"): ({"comment": "withdrawn"}, None),
        ("POST", "/api/v1/approvals/{id}/resubmit/"): (
            {"comment": "again", "values": {"guaranteed_millis": 2500}},
            None,
        ),
        ("POST", "/api/v1/approvals/quota-change/"): (
            {"tenant": t.pk, "flavor": world.flavor.name, "guaranteed_millis": 2500, "reason": "more"},
            t,
        ),
        ("POST", "/api/v1/flavor-prices/"): (
            {"flavor": world.flavor.name, "price_per_device_hour": "1.00", "currency": "USD"},
            None,
        ),
        ("POST", "/api/v1/flavors/"): ({"name": "matrix", "vendor": "nvidia", "model": "M", "memory_mib": 1024}, None),
        ("POST", "/api/v1/jobs/"): (
            {"name": "m", "tenant": t.slug, "resources": {"flavors": [world.flavor.name], "gpus": 1}, "command": ["x"]},
            t,
        ),
        ("POST", "/api/v1/jobs/{id}/cancel/"): ({"reason": "matrix"}, None),
        ("POST", "/api/v1/jobs/{id}/load/"): ({"load": 0.5}, None),
        ("POST", "/api/v1/jobs/{id}/scale/"): ({"replicas": 1}, None),
        ("POST", "/api/v1/jobs/arrays/{array_id}/cancel/"): ({"reason": "matrix"}, None),
        ("POST", "/api/v1/memberships/"): ({"tenant": t.pk, "username": world.newbie.username, "role": "viewer"}, t),
        ("PATCH", "/api/v1/memberships/{id}/"): ({"role": "member"}, None),
        ("POST", "/api/v1/nodes/{id}/drain/"): ({"grace_s": 60}, None),
        ("POST", "/api/v1/quotas/"): ({"tenant": t.pk, "flavor": world.flavor.name, "guaranteed_millis": 2000}, t),
        ("POST", "/api/v1/tenants/"): ({"name": "Matrix", "slug": "matrix", "parent": t.pk}, t),
        ("PATCH", "/api/v1/tenants/{id}/"): ({"description": "matrix"}, None),
        ("POST", "/api/v1/tenants/{id}/approval-threshold/"): ({"threshold_millis": 4000}, None),
        ("POST", "/api/v1/tokens/"): ({"name": "matrix", "scope": "read"}, None),
        ("POST", "/api/v1/users/"): ({"username": "matrix-user", "password": "A-long-matrix-pass-123"}, None),
        ("PATCH", "/api/v1/users/{id}/"): ({"first_name": "Matrix"}, None),
        ("POST", "/api/v1/users/{id}/set-password/"): ({"password": "Another-long-pass-456"}, None),
        ("POST", "/api/v1/whatif/"): ({"days": 1, "set": {}}, None),
    }
    return bodies.get((method, template), (None, None))


def _view_of(url: str, method: str) -> tuple[Any, Any]:
    """The DRF view instance (with ``action`` and ``kwargs`` set as DRF would) that answers ``method url``."""
    match = resolve(url.split("?")[0])
    callback = match.func
    cls = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    assert cls is not None, f"{url}: not a DRF view"
    # A route may hand its view other class attributes (the older Node API paths ask ``fleet.view``).
    view = cls(**(getattr(callback, "initkwargs", None) or getattr(callback, "view_initkwargs", None) or {}))
    actions = getattr(callback, "actions", None)
    view.action = actions.get(method.lower()) if actions else None
    view.kwargs = match.kwargs
    return view, match


class _Request:
    def __init__(self, method: str) -> None:
        self.method = method


def _principal(world: World, principal: str) -> tuple[User, ApiToken | None]:
    if principal.startswith("token:"):
        token = world.tokens[principal.removeprefix("token:")]
        return token.user, token
    return world.users[principal], None


def _readable(user: User, obj: Any, using: Action | None = None) -> bool:
    action = using if using in HIDDEN_BY_OWN_ACTION else READ_ACTION.get(type(obj))
    if action is None:
        return True  # pool-wide objects are not hidden per tenant: a rule decides (403)
    return restrict(type(obj).objects.all(), user, action).filter(pk=obj.pk).exists()


def expected_api(world: World, principal: str, op: Operation) -> str:
    """ "allowed", 403 or 404, as the policy says."""
    user, token = _principal(world, principal)
    view, _match = _view_of(_url(world, op.template), op.method)
    action = policy_action_for(view, _Request(op.method))
    assert action is not None, f"{op.method} {op.template} has no policy action (policy_actions on its view)"
    if action in NO_ACCOUNT_ACTIONS:
        return 401  # the body's bootstrap token is the only proof, and it is a bad one; the account plays no part
    if not token_allows(token, action):
        return 403
    obj = _path_object(world, op.template)
    named_tenant = _body(world, op.method, op.template)[1]
    hides = getattr(view, "policy_hides_objects", False)
    if hides:
        for named in (obj, named_tenant):
            if named is not None and not _readable(user, named, action):
                return 404
        if op.method == "GET":
            return "allowed"
    if not may(user, action):
        return 403
    target = obj if obj is not None else named_tenant
    if target is not None:
        rule = OBJECT_RULE.get(action)
        permitted = rule(user, target) if rule else allows(user, action, target)
        if not permitted:
            return 403
    return "allowed"


def _call_api(world: World, principal: str, op: Operation):
    client = APIClient()
    user, token = _principal(world, principal)
    headers = {}
    if token is not None:
        headers = bearer(token)
    else:
        client.force_authenticate(user)
    body, _tenant = _body(world, op.method, op.template)
    call = getattr(client, op.method.lower())
    url = _url(world, op.template)
    with transaction.atomic():
        response = call(url, body, format="json", headers=headers) if body is not None else call(url, headers=headers)
        transaction.set_rollback(True)
    return response


def test_every_api_operation_has_a_policy_action(world):
    missing = []
    for op in api_operations():
        view, _ = _view_of(_url(world, op.template), op.method)
        if policy_action_for(view, _Request(op.method)) is None:
            missing.append(f"{op.method} {op.template}")
    assert not missing, f"endpoints without a policy entry: {missing}"


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_api_answers_as_the_policy_says(world, principal):
    wrong = []
    for op in api_operations():
        want = expected_api(world, principal, op)
        got = _call_api(world, principal, op).status_code
        ok = got in ALLOWED if want == "allowed" else got == want
        if not ok:
            wrong.append(f"{op.method} {op.template}: policy says {want}, got {got}")
    assert not wrong, "\n".join(wrong)


# --- the console --------------------------------------------------------------------------------------------


@functools.cache
def console_routes() -> list[tuple[str, Any]]:
    """(route with <int:…> placeholders, view) of every console page."""
    found = []

    def walk(patterns, prefix):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                route = prefix + str(pattern.pattern)
                if route.startswith("console/"):
                    found.append(("/" + route, pattern.callback))

    walk(get_resolver().url_patterns, "")
    return found


def _console_object(world: World, route: str) -> Any:
    table = [
        ("/console/nodes/<int:pk>/", world.node),
        ("/console/tenants/<int:pk>/", world.tenant),
        ("/console/approvals/<int:pk>/", world.approval),
        ("/console/jobs/<int:pk>/", world.job),
        ("/console/audit/<int:pk>/", world.record),
        ("/console/account/tokens/<int:pk>/", world.tokens["member:read"]),
        ("/console/users/<int:pk>/", world.users["member"]),
        ("/console/lockouts/<int:pk>/", None),
    ]
    for prefix, obj in table:
        if route.startswith(prefix):
            return obj
    return None


def _console_url(world: World, route: str) -> str:
    obj = _console_object(world, route)
    url = route.replace("<int:pk>", str(obj.pk if obj is not None else 999999))
    member_membership = Membership.objects.get(user=world.users["member"])
    url = url.replace("<int:membership_pk>", str(member_membership.pk))
    return url.replace("<int:token_pk>", str(world.tokens["member:read"].pk))


#: A page that explains a refusal instead of hiding: the submit page tells a platform account why it cannot
#: submit (the API's 403).
EXPLAINED = {"/console/jobs/submit/": 403}


def expected_console(world: World, principal: str, route: str, view: Any) -> str | int:
    user = world.users[principal]
    action = policy_action_of(view)
    assert action is not None, f"{route}: the console view names no policy action (section_required/action_required)"
    section = getattr(view, "policy_section_action", None)
    if section is not None and not may(user, section):
        return 404
    if not may(user, action):
        return EXPLAINED.get(route, 404)
    obj = _console_object(world, route)
    if obj is not None and not (_readable(user, obj) and allows(user, action, obj)):
        return 404  # the console answers "not yours" like "no such"
    return "allowed"


def test_every_console_page_has_a_policy_action():
    missing = [route for route, view in console_routes() if policy_action_of(view) is None]
    assert not missing, f"console pages without a policy action: {missing}"


@pytest.mark.parametrize("principal", SESSION_PRINCIPALS)
def test_console_answers_as_the_policy_says(world, principal):
    client = Client()
    client.force_login(world.users[principal])
    wrong = []
    for route, view in console_routes():
        want = expected_console(world, principal, route, view)
        url = _console_url(world, route)
        for method in ("get", "post"):
            with transaction.atomic():
                got = getattr(client, method)(url).status_code
                transaction.set_rollback(True)
            if got == 405:
                continue  # the page does not take this method
            if got == 404 and want == "allowed" and route.startswith("/console/lockouts/<int:pk>/"):
                continue  # no lockout in the world: a missing object
            ok = (got in ALLOWED or got == EXPLAINED.get(route)) if want == "allowed" else got == want
            if not ok:
                wrong.append(f"{method.upper()} {route}: policy says {want}, got {got}")
    assert not wrong, "\n".join(wrong)


# --- the table itself ---------------------------------------------------------------------------------------


def test_every_action_has_a_token_scope_and_the_platform_roles_match_the_model():
    assert set(TOKEN_SCOPE) == set(Action)
    assert {p.value for p in Principal} >= {r for r in PlatformRole.values if r} | set(MembershipRole.values)
    assert {TokenScope(s) for s in TokenScope.values} == {TokenScope(v.value) for v in {TOKEN_SCOPE[a] for a in Action}}


def test_no_tenant_role_reads_the_audit_trail():
    """The audit app asks the table with the account's platform role only (it sits below tenants)."""
    audit_actions = {Action.AUDIT_VIEW, Action.AUDIT_VERIFY, Action.AUDIT_EXPORT}
    holders = {rule.principal for rule in RULES if rule.action in audit_actions}
    assert holders == {Principal.AUDITOR}


@pytest.mark.parametrize("principal", SESSION_PRINCIPALS)
def test_allows_and_restrict_agree_on_every_object_and_action(world, principal):
    """The two ways of asking the table — one object (``allows``) and a queryset (``restrict``) — give the same
    answer for every tenant-scoped or owned object of the world and every action."""
    user = world.users[principal]
    objects = [
        world.parent,
        world.tenant,
        world.sibling,
        world.job,
        world.membership,
        world.quota,
        world.approval,
        world.users["member"],
        world.tokens["member:read"],
    ]
    disagree = []
    for obj in objects:
        model = type(obj)
        for action in Action:
            one = allows(user, action, obj)
            many = restrict(model.objects.all(), user, action).filter(pk=obj.pk).exists()
            if one != many:
                disagree.append(f"{action.value} on {model.__name__} {obj.pk}: allows={one}, restrict={many}")
    assert not disagree, "\n".join(disagree)
