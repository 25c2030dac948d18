"""The access policy: who may do what, stated once as a table.

Each row of ``RULES`` says that a *principal* (a platform role, a tenant role, or any signed-in account) may
take an *action* on objects within an *object scope*; ``TOKEN_SCOPE`` says which API token scope each action
needs. Nothing else in the project states a role rule: ``tenants.access`` evaluates this table for users,
objects and querysets (``allows``, ``restrict``), and the API's permission classes, the console's sections,
the WebSocket consumers, the services, tasks and commands ask it. ``docs/permissions.md`` is generated from
it (``manage.py permissions_doc``; CI fails when the page is stale).

This module is pure data (no Django, no app import) so that every layer may read it — the audit app, which
sits below the tenants app, asks it who reads the trail.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "PLATFORM_ROLES",
    "RULES",
    "SCOPE_TEXT",
    "TENANT_ROLES",
    "TOKEN_SCOPE",
    "TOKEN_SCOPE_RANK",
    "Action",
    "Principal",
    "Rule",
    "Scope",
    "TokenScopeName",
    "principals_for",
    "role_may",
    "rules_for",
]


class Principal(StrEnum):
    """Who a rule is for. The first three are ``User.platform_role`` values, the next three
    ``Membership.role`` values (held on a tenant, they apply to its whole subtree)."""

    SYSTEM_ADMIN = "system_admin"
    SECURITY_ADMIN = "security_admin"
    AUDITOR = "auditor"
    TENANT_ADMIN = "tenant_admin"
    MEMBER = "member"
    VIEWER = "viewer"
    #: Every signed-in, active account, whatever its roles (its own tokens, its own account).
    ANY_USER = "any_user"


PLATFORM_ROLES = (Principal.SYSTEM_ADMIN, Principal.SECURITY_ADMIN, Principal.AUDITOR)
TENANT_ROLES = (Principal.TENANT_ADMIN, Principal.MEMBER, Principal.VIEWER)


class Scope(StrEnum):
    """Which objects a rule covers."""

    #: Every object (platform roles; pool-wide things such as nodes and flavors).
    ALL = "all"
    #: Objects of the tenants at or below a tenant where the principal holds the role.
    SUBTREE = "subtree"
    #: Objects of the tenants strictly below a tenant where the principal holds the role (moving or deleting a
    #: tenant is decided one level up).
    BELOW = "below"
    #: Objects the caller owns (their account, their tokens, the jobs they submitted, the requests they made);
    #: for a tenant role also within that role's subtree.
    OWN = "own"


SCOPE_TEXT = {
    Scope.ALL: "any object",
    Scope.SUBTREE: "objects of the tenants at or below a tenant where the role is held",
    Scope.BELOW: "objects of the tenants strictly below a tenant where the role is held",
    Scope.OWN: "only the caller's own objects (for a tenant role: within its subtree)",
}


class TokenScopeName(StrEnum):
    """``ApiToken.scope`` values, weakest first."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


TOKEN_SCOPE_RANK = {TokenScopeName.READ: 1, TokenScopeName.WRITE: 2, TokenScopeName.ADMIN: 3}


class Action(StrEnum):
    """Everything the portal lets someone do, named ``<object>.<verb>``."""

    API_INDEX = "api.index"
    OVERVIEW_VIEW = "overview.view"
    ME_VIEW = "me.view"
    # tenants and their tree
    TENANT_VIEW = "tenant.view"
    TENANT_CREATE = "tenant.create"
    TENANT_CHANGE = "tenant.change"
    TENANT_MOVE = "tenant.move"
    TENANT_DELETE = "tenant.delete"
    TENANT_THRESHOLD = "tenant.set_threshold"
    MEMBERSHIP_VIEW = "membership.view"
    MEMBERSHIP_MANAGE = "membership.manage"
    # accounts, tokens, sign-in
    USER_VIEW = "user.view"
    USER_MANAGE = "user.manage"
    USER_PLATFORM_ROLE = "user.platform_role"
    USER_SET_PASSWORD = "user.set_password"
    TOKEN_VIEW = "token.view"
    TOKEN_CREATE = "token.create"
    TOKEN_REVOKE = "token.revoke"
    LOCKOUT_VIEW = "lockout.view"
    LOCKOUT_RESET = "lockout.reset"
    # quotas, approvals, showback
    QUOTA_VIEW = "quota.view"
    QUOTA_SET = "quota.set"
    QUOTA_REQUEST = "quota.request"
    APPROVAL_VIEW = "approval.view"
    APPROVAL_DECIDE = "approval.decide"
    APPROVAL_WITHDRAW = "approval.withdraw"
    NOTIFICATION_VIEW = "notification.view"
    NOTIFICATION_RETRY = "notification.retry"
    PRICE_VIEW = "price.view"
    PRICE_SET = "price.set"
    USAGE_VIEW = "usage.view"
    # jobs
    JOB_VIEW = "job.view"
    JOB_SUBMIT = "job.submit"
    JOB_MANAGE = "job.manage"
    JOB_SERVE = "job.serve"
    # nodes, cards, agents, telemetry
    NODE_VIEW = "node.view"
    NODE_OPERATE = "node.operate"
    DEVICE_IDENTIFY = "device.identify"
    FLAVOR_VIEW = "flavor.view"
    FLAVOR_CREATE = "flavor.create"
    FLEET_VIEW = "fleet.view"
    FLEET_MANAGE = "fleet.manage"
    TELEMETRY_VIEW = "telemetry.view"
    AGENT_REGISTER = "agent.register"
    AGENT_UPLOAD = "agent.upload_output"
    # planning
    WHATIF_RUN = "whatif.run"
    TRACE_EXPORT = "trace.export"
    # audit trail
    AUDIT_VIEW = "audit.view"
    AUDIT_VERIFY = "audit.verify"
    AUDIT_EXPORT = "audit.export"
    # alerts the platform raised (a failed audit write, an unreachable witness, a failed integrity check)
    ALERT_VIEW = "alert.view"
    ALERT_ACKNOWLEDGE = "alert.acknowledge"


#: What each action is, in words (the generated page's glossary).
ACTION_TEXT: dict[Action, str] = {
    Action.API_INDEX: "the API's map (/api/v1/)",
    Action.OVERVIEW_VIEW: "the console's overview (pool health)",
    Action.ME_VIEW: "read your own account, role and memberships",
    Action.TENANT_VIEW: "read tenants",
    Action.TENANT_CREATE: "create a tenant (a top-level one: system admin only)",
    Action.TENANT_CHANGE: "rename or describe a tenant",
    Action.TENANT_MOVE: "move a tenant to another parent",
    Action.TENANT_DELETE: "delete an empty tenant",
    Action.TENANT_THRESHOLD: "set the size above which a tenant's jobs wait for approval",
    Action.MEMBERSHIP_VIEW: "read memberships",
    Action.MEMBERSHIP_MANAGE: "add, change or remove a membership (never of a platform account)",
    Action.USER_VIEW: "read accounts",
    Action.USER_MANAGE: "create, change, deactivate accounts; reset their two-factor devices",
    Action.USER_PLATFORM_ROLE: "grant or remove a platform role (never to an account with memberships)",
    Action.USER_SET_PASSWORD: "set an account's password",
    Action.TOKEN_VIEW: "read API tokens (never their secrets)",
    Action.TOKEN_CREATE: "create an API token for yourself (no wider, no longer-lived than the token used)",
    Action.TOKEN_REVOKE: "revoke an API token",
    Action.LOCKOUT_VIEW: "read sign-in lockouts",
    Action.LOCKOUT_RESET: "lift a sign-in lockout",
    Action.QUOTA_VIEW: "read quotas and their use",
    Action.QUOTA_SET: "set a quota directly",
    Action.QUOTA_REQUEST: "request a quota change (it goes through the approval chain)",
    Action.APPROVAL_VIEW: "read approval requests",
    Action.APPROVAL_DECIDE: "approve, reject or send back the step a request waits for (the step's role; a "
    "system admin may override any step with a comment; nobody decides their own request)",
    Action.APPROVAL_WITHDRAW: "withdraw or resubmit a request",
    Action.NOTIFICATION_VIEW: "read notification deliveries",
    Action.NOTIFICATION_RETRY: "send a failed notification again",
    Action.PRICE_VIEW: "read the price of a card-hour",
    Action.PRICE_SET: "set the price of a card-hour",
    Action.USAGE_VIEW: "usage reports (device-hours, cost)",
    Action.JOB_VIEW: "read jobs, their events and logs",
    Action.JOB_SUBMIT: "submit a job",
    Action.JOB_MANAGE: "cancel, scale, or report the load of a job",
    Action.JOB_SERVE: "call a job's serving endpoints (its named ports, through the serving proxy)",
    Action.NODE_VIEW: "read nodes and cards (capacity is shared)",
    Action.NODE_OPERATE: "cordon, drain, uncordon a node",
    Action.DEVICE_IDENTIFY: "see a card's UUID",
    Action.FLAVOR_VIEW: "read resource flavors",
    Action.FLAVOR_CREATE: "create a resource flavor",
    Action.FLEET_VIEW: "read node agents (hosts, connections) and the console's node pages",
    Action.FLEET_MANAGE: "create bootstrap tokens, revoke a node's credential, move a card to another node",
    Action.TELEMETRY_VIEW: "watch card telemetry (live and stored)",
    Action.AGENT_REGISTER: "a node agent trades a bootstrap token for its credential (no account; the token "
    "is the proof)",
    Action.AGENT_UPLOAD: "a node agent uploads the outputs of a job it ran (no account; its node credential is the "
    "proof)",
    Action.WHATIF_RUN: "run a what-if simulation",
    Action.TRACE_EXPORT: "export the job trace",
    Action.AUDIT_VIEW: "search and read the audit trail",
    Action.AUDIT_VERIFY: "verify the audit trail",
    Action.AUDIT_EXPORT: "export signed audit bundles",
    Action.ALERT_VIEW: "read the alerts the platform raised (the console's alerts page)",
    Action.ALERT_ACKNOWLEDGE: "acknowledge an alert",
}


#: The least token scope each action needs when the caller uses an API token (sessions need none).
TOKEN_SCOPE: dict[Action, TokenScopeName] = {
    **{
        action: TokenScopeName.READ
        for action in (
            Action.API_INDEX,
            Action.OVERVIEW_VIEW,
            Action.ME_VIEW,
            Action.TENANT_VIEW,
            Action.MEMBERSHIP_VIEW,
            Action.USER_VIEW,
            Action.TOKEN_VIEW,
            Action.LOCKOUT_VIEW,
            Action.QUOTA_VIEW,
            Action.APPROVAL_VIEW,
            Action.NOTIFICATION_VIEW,
            Action.PRICE_VIEW,
            Action.USAGE_VIEW,
            Action.JOB_VIEW,
            Action.JOB_SERVE,
            Action.NODE_VIEW,
            Action.DEVICE_IDENTIFY,
            Action.FLAVOR_VIEW,
            Action.FLEET_VIEW,
            Action.TELEMETRY_VIEW,
            Action.AGENT_REGISTER,
            Action.AGENT_UPLOAD,
            Action.TRACE_EXPORT,
            Action.AUDIT_VIEW,
            Action.AUDIT_VERIFY,
            Action.AUDIT_EXPORT,
            Action.ALERT_VIEW,
        )
    },
    **{
        action: TokenScopeName.WRITE
        for action in (
            Action.TENANT_CREATE,
            Action.TENANT_CHANGE,
            Action.TENANT_MOVE,
            Action.TENANT_DELETE,
            Action.TENANT_THRESHOLD,
            Action.MEMBERSHIP_MANAGE,
            Action.TOKEN_CREATE,
            Action.TOKEN_REVOKE,
            Action.QUOTA_REQUEST,
            Action.APPROVAL_DECIDE,
            Action.APPROVAL_WITHDRAW,
            Action.NOTIFICATION_RETRY,
            Action.JOB_SUBMIT,
            Action.JOB_MANAGE,
            Action.WHATIF_RUN,
        )
    },
    **{
        action: TokenScopeName.ADMIN
        for action in (
            Action.USER_MANAGE,
            Action.USER_PLATFORM_ROLE,
            Action.USER_SET_PASSWORD,
            Action.LOCKOUT_RESET,
            Action.QUOTA_SET,
            Action.PRICE_SET,
            Action.NODE_OPERATE,
            Action.FLAVOR_CREATE,
            Action.FLEET_MANAGE,
            Action.ALERT_ACKNOWLEDGE,
        )
    },
}


@dataclass(frozen=True)
class Rule:
    principal: Principal
    action: Action
    scope: Scope


def _rules(principal: Principal, scope: Scope, *actions: Action) -> list[Rule]:
    return [Rule(principal, action, scope) for action in actions]


_P = Principal
_S = Scope
_A = Action
#: Everything the three tenant roles read in their subtrees.
_TENANT_READS = (
    _A.TENANT_VIEW,
    _A.MEMBERSHIP_VIEW,
    _A.USER_VIEW,
    _A.QUOTA_VIEW,
    _A.APPROVAL_VIEW,
    _A.USAGE_VIEW,
    _A.JOB_VIEW,
    _A.JOB_SERVE,
    _A.DEVICE_IDENTIFY,
    _A.TELEMETRY_VIEW,
)

RULES: list[Rule] = [
    # Every signed-in account: the pool's shared capacity, its own account and tokens.
    *_rules(_P.ANY_USER, _S.ALL, _A.API_INDEX, _A.OVERVIEW_VIEW, _A.NODE_VIEW, _A.FLAVOR_VIEW, _A.PRICE_VIEW),
    *_rules(
        _P.ANY_USER,
        _S.OWN,
        _A.ME_VIEW,
        _A.USER_VIEW,
        _A.USER_SET_PASSWORD,
        _A.TOKEN_VIEW,
        _A.TOKEN_CREATE,
        _A.TOKEN_REVOKE,
        _A.APPROVAL_WITHDRAW,
    ),
    # System admin: runs the pool (tenants, quotas, nodes, approvals); no accounts, no audit trail.
    *_rules(
        _P.SYSTEM_ADMIN,
        _S.ALL,
        _A.TENANT_VIEW,
        _A.TENANT_CREATE,
        _A.TENANT_CHANGE,
        _A.TENANT_MOVE,
        _A.TENANT_DELETE,
        _A.TENANT_THRESHOLD,
        _A.MEMBERSHIP_VIEW,
        _A.USER_VIEW,
        _A.QUOTA_VIEW,
        _A.QUOTA_SET,
        _A.QUOTA_REQUEST,
        _A.APPROVAL_VIEW,
        _A.APPROVAL_DECIDE,
        _A.APPROVAL_WITHDRAW,
        _A.NOTIFICATION_VIEW,
        _A.NOTIFICATION_RETRY,
        _A.PRICE_SET,
        _A.USAGE_VIEW,
        _A.JOB_VIEW,
        _A.JOB_MANAGE,
        _A.NODE_OPERATE,
        _A.DEVICE_IDENTIFY,
        _A.FLAVOR_CREATE,
        _A.FLEET_VIEW,
        _A.FLEET_MANAGE,
        _A.TELEMETRY_VIEW,
        _A.WHATIF_RUN,
        _A.TRACE_EXPORT,
        _A.ALERT_VIEW,
        _A.ALERT_ACKNOWLEDGE,
    ),
    # Security admin: accounts, platform roles, memberships, tokens, sign-in; no tenant's work.
    *_rules(
        _P.SECURITY_ADMIN,
        _S.ALL,
        _A.TENANT_VIEW,
        _A.MEMBERSHIP_VIEW,
        _A.MEMBERSHIP_MANAGE,
        _A.USER_VIEW,
        _A.USER_MANAGE,
        _A.USER_PLATFORM_ROLE,
        _A.USER_SET_PASSWORD,
        _A.TOKEN_VIEW,
        _A.TOKEN_REVOKE,
        _A.LOCKOUT_VIEW,
        _A.LOCKOUT_RESET,
        _A.APPROVAL_VIEW,
        _A.NOTIFICATION_VIEW,
        _A.NOTIFICATION_RETRY,
        _A.DEVICE_IDENTIFY,
        _A.ALERT_VIEW,
        _A.ALERT_ACKNOWLEDGE,
    ),
    # Auditor: reads everything a tenant's work leaves behind and the audit trail; changes nothing.
    *_rules(
        _P.AUDITOR,
        _S.ALL,
        _A.TENANT_VIEW,
        _A.MEMBERSHIP_VIEW,
        _A.USER_VIEW,
        _A.QUOTA_VIEW,
        _A.APPROVAL_VIEW,
        _A.USAGE_VIEW,
        _A.JOB_VIEW,
        _A.DEVICE_IDENTIFY,
        _A.AUDIT_VIEW,
        _A.AUDIT_VERIFY,
        _A.AUDIT_EXPORT,
        _A.ALERT_VIEW,
    ),
    # Tenant roles, each in the subtree of the tenant where it is held.
    *_rules(_P.TENANT_ADMIN, _S.SUBTREE, *_TENANT_READS),
    *_rules(
        _P.TENANT_ADMIN,
        _S.SUBTREE,
        _A.TENANT_CREATE,
        _A.TENANT_CHANGE,
        _A.MEMBERSHIP_MANAGE,
        _A.QUOTA_REQUEST,
        _A.APPROVAL_DECIDE,
        _A.JOB_SUBMIT,
        _A.JOB_MANAGE,
    ),
    *_rules(_P.TENANT_ADMIN, _S.BELOW, _A.TENANT_MOVE, _A.TENANT_DELETE),
    *_rules(_P.MEMBER, _S.SUBTREE, *_TENANT_READS, _A.JOB_SUBMIT),
    *_rules(_P.MEMBER, _S.OWN, _A.JOB_MANAGE),
    *_rules(_P.VIEWER, _S.SUBTREE, *_TENANT_READS),
]

#: Actions no account takes: a node agent proves itself with a bootstrap token or its node credential.
NO_ACCOUNT_ACTIONS = frozenset({Action.AGENT_REGISTER, Action.AGENT_UPLOAD})


def rules_for(action: Action) -> list[Rule]:
    return [rule for rule in RULES if rule.action == action]


def principals_for(action: Action) -> dict[Principal, Scope]:
    """Who may take ``action``, with the widest scope each has."""
    order = [Scope.OWN, Scope.BELOW, Scope.SUBTREE, Scope.ALL]
    result: dict[Principal, Scope] = {}
    for rule in rules_for(action):
        held = result.get(rule.principal)
        if held is None or order.index(rule.scope) > order.index(held):
            result[rule.principal] = rule.scope
    return result


def role_may(principals: set[str] | frozenset[str], action: Action) -> bool:
    """Whether any of ``principals`` has a rule for ``action`` at all (in some scope)."""
    return any(rule.principal in principals for rule in rules_for(action))
