"""Every sentence the tenants' services (accounts, the tree, memberships, tokens, quotas,
approvals) may show a user: a stable code and its English template
(``kernel.messages``).

Raise one as ``DomainError(messages.NAME(param=value))``; the console, the API and e-mail render it in the
reader's language from the template, which is the gettext msgid (translations: frontend/locale).
"""

from __future__ import annotations

from django.utils.translation import gettext_noop

from kernel.messages import Message

QUOTA_GUARANTEES_UNDER_ADD_UP = Message(
    "tenants.quota_guarantees_under_add_up",
    gettext_noop(
        "Quota for %(flavor)s: the guarantees under %(parent)s add up to %(total)s millis (%(parts)s) but "
        "%(parent)s is guaranteed only %(guaranteed)s; raise %(parent)s's guarantee or lower the others."
    ),
)
QUOTA_LIMIT_MILLIS_BELOW_GUARANTEED = Message(
    "tenants.quota_limit_millis_below_guaranteed",
    gettext_noop(
        "Quota %(where)s: limit_millis %(limit)s is below guaranteed_millis %(guaranteed)s; the limit must be at "
        "least the guarantee."
    ),
)
STEP_WAITS_SYSTEM_ADMIN_DECIDING = Message(
    "tenants.step_waits_system_admin_deciding",
    gettext_noop("This step waits for a %(role)s; a system admin deciding it instead must say why (comment)."),
)
ACCOUNT_DEACTIVATED = Message("tenants.account_deactivated", gettext_noop("This account is deactivated."))
AUDITORS_READ_ONLY_ACCESS_ASK = Message(
    "tenants.auditors_read_only_access_ask",
    gettext_noop("Auditors have read-only access; ask a system or security admin."),
)
ONLY_SECURITY_ADMIN_MAY_CREATE = Message(
    "tenants.only_security_admin_may_create",
    gettext_noop("Only a security admin may create accounts."),
)
ONLY_SECURITY_ADMIN_MAY_CHANGE = Message(
    "tenants.only_security_admin_may_change",
    gettext_noop("Only a security admin may change accounts."),
)
ONLY_SECURITY_ADMIN_MAY_GRANT = Message(
    "tenants.only_security_admin_may_grant",
    gettext_noop("Only a security admin may grant or remove platform roles."),
)
ONLY_SECURITY_ADMIN_MAY_SET = Message(
    "tenants.only_security_admin_may_set",
    gettext_noop("Only a security admin may set another's password."),
)
ONLY_SECURITY_ADMIN_MAY_RESET = Message(
    "tenants.only_security_admin_may_reset",
    gettext_noop("Only a security admin may reset another account's two-factor devices."),
)
ONLY_SECURITY_ADMIN_MAY_LIFT = Message(
    "tenants.only_security_admin_may_lift",
    gettext_noop("Only a security admin may lift a sign-in lockout."),
)
YOU_CAN_ONLY_ENROL_TWO = Message(
    "tenants.you_can_only_enrol_two",
    gettext_noop("You can only enrol a two-factor device for your own account."),
)
DEVICE_BELONGS_ANOTHER_ACCOUNT = Message(
    "tenants.device_belongs_another_account",
    gettext_noop("This device belongs to another account."),
)
CODE_NOT_VALID_CHECK_CLOCK = Message(
    "tenants.code_not_valid_check_clock",
    gettext_noop("That code is not valid; check the clock of your device and try again."),
)
YOU_CANNOT_DEACTIVATE_YOUR_OWN = Message(
    "tenants.you_cannot_deactivate_your_own",
    gettext_noop("You cannot deactivate your own account; ask another security admin."),
)
YOU_CANNOT_CHANGE_YOUR_OWN = Message(
    "tenants.you_cannot_change_your_own",
    gettext_noop("You cannot change your own platform role; ask another security admin."),
)
UNKNOWN_PLATFORM_ROLE_USE_ONE = Message(
    "tenants.unknown_platform_role_use_one",
    gettext_noop("Unknown platform role '%(value)s'; use one of: %(choices)s"),
)
UNKNOWN_PLATFORM_ROLE = Message("tenants.unknown_platform_role", gettext_noop("Unknown platform role '%(value)s'."))
USER_NAMED_ALREADY_EXISTS_CHOOSE = Message(
    "tenants.user_named_already_exists_choose",
    gettext_noop("A user named '%(name)s' already exists; choose another username."),
)
MEMBER_TENANTS_PLATFORM_ACCOUNT_HOLDS = Message(
    "tenants.member_tenants_platform_account_holds",
    gettext_noop(
        "%(user)s is a member of tenants; a platform account holds no tenant membership. Remove the memberships "
        "first (or use a separate account for the platform role)."
    ),
)
ALREADY_HOLDS_PLATFORM_ROLE_ONE = Message(
    "tenants.already_holds_platform_role_one",
    gettext_noop(
        "%(user)s already holds the platform role '%(before)s'; one account cannot hold two platform roles. "
        "Remove '%(before)s' first, then grant '%(after)s'."
    ),
)
USER_CANNOT_ADDED_ACCOUNT_NOT = Message(
    "tenants.user_cannot_added_account_not",
    gettext_noop(
        "That user cannot be added: the account does not exist, is deactivated, or is a platform account "
        "(platform accounts hold no tenant membership)."
    ),
)
UNKNOWN_ROLE_USE_ONE = Message(
    "tenants.unknown_role_use_one",
    gettext_noop("Unknown role '%(value)s'; use one of: %(choices)s"),
)
ONLY_TENANT_ADMIN_MAY_ADD = Message(
    "tenants.only_tenant_admin_may_add",
    gettext_noop("Only a tenant admin of '%(tenant)s' may add members to it."),
)
ONLY_TENANT_ADMIN_MAY_CHANGE = Message(
    "tenants.only_tenant_admin_may_change",
    gettext_noop("Only a tenant admin of '%(tenant)s' may change its members' roles."),
)
ONLY_TENANT_ADMIN_MAY_REMOVE = Message(
    "tenants.only_tenant_admin_may_remove",
    gettext_noop("Only a tenant admin of '%(tenant)s' may remove its members."),
)
ALREADY_MEMBER = Message("tenants.already_member", gettext_noop("%(user)s is already a member of %(tenant)s."))
ONLY_PLATFORM_ADMINS_RETRY_NOTIFICATIONS = Message(
    "tenants.only_platform_admins_retry_notifications",
    gettext_noop("Only platform admins retry notifications."),
)
NOTIFICATION_ALREADY_SENT = Message(
    "tenants.notification_already_sent",
    gettext_noop("Notification %(pk)s was already sent."),
)
UNKNOWN_QUOTA_FIELD = Message("tenants.unknown_quota_field", gettext_noop("Unknown quota field(s): %(fields)s."))
ONLY_SYSTEM_ADMIN_SETS_QUOTAS = Message(
    "tenants.only_system_admin_sets_quotas",
    gettext_noop("Only a system admin sets quotas directly; tenant admins request a change."),
)
ONLY_SYSTEM_ADMIN_SETS_PRICES = Message(
    "tenants.only_system_admin_sets_prices",
    gettext_noop("Only a system admin sets prices."),
)
PRICE_PER_DEVICE_HOUR_MUST = Message(
    "tenants.price_per_device_hour_must",
    gettext_noop("price_per_device_hour must be ≥ 0."),
)
PRICE_PER_DEVICE_HOUR_MUST_NUMBER = Message(
    "tenants.price_per_device_hour_must_number",
    gettext_noop("price_per_device_hour must be a number."),
)
MUST_WHOLE_NUMBER_GOT = Message(
    "tenants.must_whole_number_got",
    gettext_noop("%(quota_field)s must be a whole number ≥ 0 (got %(value)s)."),
)
MUST_MULTIPLE_MILLIS_ONE_CARD = Message(
    "tenants.must_multiple_millis_one_card",
    gettext_noop("%(quota_field)s must be a multiple of %(step)s (1000 millis = one card); got %(value)s."),
)
ONLY_SYSTEM_ADMIN_SETS_JOB = Message(
    "tenants.only_system_admin_sets_job",
    gettext_noop("Only a system admin sets the job approval threshold."),
)
THRESHOLD_MUST_MILLIS = Message("tenants.threshold_must_millis", gettext_noop("The threshold must be ≥ 0 millis."))
ONLY_TENANT_ADMIN_MAY_REQUEST = Message(
    "tenants.only_tenant_admin_may_request",
    gettext_noop("Only a tenant admin of '%(tenant)s' may request a quota change for it."),
)
YOU_CANNOT_APPROVE_STEP_WAITS = Message(
    "tenants.you_cannot_approve_step_waits",
    gettext_noop("You cannot approve this step: it waits for a %(role)s, and nobody approves their own request."),
)
ONLY_REQUESTER_MAY_RESUBMIT_REQUEST = Message(
    "tenants.only_requester_may_resubmit_request",
    gettext_noop("Only the requester may resubmit a request."),
)
ONLY_REQUESTER_MAY_CANCEL_REQUEST = Message(
    "tenants.only_requester_may_cancel_request",
    gettext_noop("Only the requester may cancel this request."),
)
GPUPOOL_APPROVAL_CHAINS_UNKNOWN_ROLE = Message(
    "tenants.gpupool_approval_chains_unknown_role",
    gettext_noop("GPUPOOL_APPROVAL_CHAINS[%(kind)s] has unknown role(s) %(roles)s."),
)
NOBODY_BUT_YOU_COULD_APPROVE = Message(
    "tenants.nobody_but_you_could_approve",
    gettext_noop(
        "Nobody but you could approve this request: as a system admin, set the quota directly (POST /api/v1/quotas/)."
    ),
)
REQUEST_NOTHING_MORE_CAN_DECIDED = Message(
    "tenants.request_nothing_more_can_decided",
    gettext_noop("Request #%(pk)s is %(status)s; nothing more can be decided on it."),
)
YOU_NOT_APPROVER_REQUEST_WAITING = Message(
    "tenants.you_not_approver_request_waiting",
    gettext_noop("You are not the approver this request is waiting for."),
)
SAY_WHY_YOU_REJECT_REQUEST = Message(
    "tenants.say_why_you_reject_request",
    gettext_noop("Say why you reject the request (comment)."),
)
JOB_ADMISSION_CAN_APPROVED_REJECTED = Message(
    "tenants.job_admission_can_approved_rejected",
    gettext_noop("A job admission can be approved or rejected, not sent back for changes."),
)
SAY_WHICH_CHANGES_YOU_NEED = Message(
    "tenants.say_which_changes_you_need",
    gettext_noop("Say which changes you need (comment)."),
)
TENANT_NAMED_ALREADY_EXISTS_TOP = Message(
    "tenants.tenant_named_already_exists_top",
    gettext_noop("A tenant named '%(name)s' already exists at the top level; choose another name."),
)
UNKNOWN_TENANT_KIND = Message("tenants.unknown_tenant_kind", gettext_noop("Unknown tenant kind '%(value)s'."))
TENANT_WOULD_DEPTH_TREE_ALLOWS = Message(
    "tenants.tenant_would_depth_tree_allows",
    gettext_noop("Tenant '%(tenant)s' would be at depth %(depth)s; the tree allows at most %(max)s levels."),
)
TENANT_SLUG_ALREADY_EXISTS = Message(
    "tenants.tenant_slug_already_exists",
    gettext_noop("A tenant with slug '%(tenant)s' already exists."),
)
ONLY_TENANT_ADMIN_MAY_CHANGE_2 = Message(
    "tenants.only_tenant_admin_may_change_2",
    gettext_noop("Only a tenant admin of '%(tenant)s' may change it."),
)
DELETING_NEEDS_TENANT_ADMIN_RIGHTS = Message(
    "tenants.deleting_needs_tenant_admin_rights",
    gettext_noop("Deleting '%(tenant)s' needs tenant admin rights on its parent (or a system admin)."),
)
TENANT_CHILD_TENANTS_MOVE_DELETE = Message(
    "tenants.tenant_child_tenants_move_delete",
    gettext_noop("Tenant '%(tenant)s' has child tenants; move or delete them first."),
)
TENANT_STILL_MEMBERS_REMOVE_THEIR = Message(
    "tenants.tenant_still_members_remove_their",
    gettext_noop("Tenant '%(tenant)s' still has members; remove their memberships first."),
)
TENANT_STILL_JOBS_QUOTAS_OTHER = Message(
    "tenants.tenant_still_jobs_quotas_other",
    gettext_noop("Tenant '%(tenant)s' still has jobs, quotas or other records; remove those first."),
)
ONLY_SYSTEM_ADMIN_MAY_CREATE = Message(
    "tenants.only_system_admin_may_create",
    gettext_noop("Only a system admin may create a top-level tenant."),
)
ONLY_TENANT_ADMIN_MAY_ADD_TENANTS = Message(
    "tenants.only_tenant_admin_may_add_tenants",
    gettext_noop("Only a tenant admin of '%(tenant)s' may add tenants to it."),
)
MOVING_NEEDS_TENANT_ADMIN_RIGHTS = Message(
    "tenants.moving_needs_tenant_admin_rights",
    gettext_noop("Moving '%(tenant)s' needs tenant admin rights on its parent tenant."),
)
ONLY_SYSTEM_ADMIN_MAY_MOVE = Message(
    "tenants.only_system_admin_may_move",
    gettext_noop("Only a system admin may move a tenant to the top level."),
)
YOU_NOT_TENANT_ADMIN = Message(
    "tenants.you_not_tenant_admin", gettext_noop("You are not a tenant admin of '%(tenant)s'.")
)
CANNOT_MOVE_UNDER_INSIDE_SUBTREE = Message(
    "tenants.cannot_move_under_inside_subtree",
    gettext_noop(
        "Cannot move '%(tenant)s' under '%(parent)s': '%(parent)s' is inside the subtree of '%(tenant)s', which "
        "would make a cycle."
    ),
)
CANNOT_MOVE_UNDER_SUBTREE_LEVEL = Message(
    "tenants.cannot_move_under_subtree_level",
    gettext_noop(
        "Cannot move '%(tenant)s' under '%(parent)s': its subtree has %(height)s level(s) and would reach depth "
        "%(depth)s; the tree allows at most %(max)s."
    ),
)
UNKNOWN_SCOPE_USE_READ_WRITE = Message(
    "tenants.unknown_scope_use_read_write",
    gettext_noop("Unknown scope '%(value)s'; use read, write or admin."),
)
ONLY_SYSTEM_SECURITY_ADMINS_MAY = Message(
    "tenants.only_system_security_admins_may",
    gettext_noop("Only system and security admins may create admin-scoped tokens."),
)
AUDITORS_MAY_ONLY_CREATE_READ = Message(
    "tenants.auditors_may_only_create_read",
    gettext_noop("Auditors may only create read-scoped tokens."),
)
EXPIRES_MUST_FUTURE = Message("tenants.expires_must_future", gettext_noop("expires_at must be in the future."))
TOKENS_LIVE_MOST_DAYS_PICK = Message(
    "tenants.tokens_live_most_days_pick",
    gettext_noop("Tokens live at most %(days)s days; pick an earlier expires_at."),
)
YOU_ALREADY_TOKEN_NAMED = Message(
    "tenants.you_already_token_named",
    gettext_noop("You already have a token named '%(name)s'."),
)
ONLY_OWNER_SECURITY_ADMIN_MAY = Message(
    "tenants.only_owner_security_admin_may",
    gettext_noop("Only the owner or a security admin may revoke it."),
)
NO_TENANT_ID_VISIBLE_YOU = Message(
    "tenants.no_tenant_id_visible_you",
    gettext_noop("No tenant with id %(pk)s is visible to you."),
)
NO_USER_ID_VISIBLE_YOU = Message(
    "tenants.no_user_id_visible_you", gettext_noop("No user with id %(pk)s is visible to you.")
)
NO_API_TOKEN_ID_VISIBLE = Message(
    "tenants.no_api_token_id_visible",
    gettext_noop("No API token with id %(pk)s is visible to you."),
)
NO_APPROVAL_REQUEST_ID_VISIBLE = Message(
    "tenants.no_approval_request_id_visible",
    gettext_noop("No approval request with id %(pk)s is visible to you."),
)
NO_SIGN_LOCKOUT_ID_VISIBLE = Message(
    "tenants.no_sign_lockout_id_visible",
    gettext_noop("No sign-in lockout with id %(pk)s is visible to you; it may have expired."),
)
APPLIED = Message("tenants.applied", gettext_noop("Applied."))
JOB_QUEUED = Message("tenants.job_queued", gettext_noop("The job is queued."))
REJECTED = Message("tenants.rejected", gettext_noop("Rejected by %(user)s."))
NOBODY_DECIDED_TIME = Message("tenants.nobody_decided_time", gettext_noop("Nobody decided in time."))
APPROVED_BUT_NO_LONGER_FITS = Message(
    "tenants.approved_but_no_longer_fits",
    gettext_noop("Approved, but it no longer fits: %(reason)s"),
)
TENANT_NAMED_ALREADY_EXISTS_UNDER = Message(
    "tenants.tenant_named_already_exists_under",
    gettext_noop("A tenant named '%(name)s' already exists under '%(parent)s'; choose another name."),
)
CANNOT_MOVE_UNDER_TOP_LEVEL = Message(
    "tenants.cannot_move_under_top_level",
    gettext_noop(
        "Cannot move '%(tenant)s' under 'the top level': its subtree has %(height)s level(s) and would reach "
        "depth %(depth)s; the tree allows at most %(max)s."
    ),
)

# --- notifications (e-mail, chat robots, webhooks), rendered in each recipient's language
GPUPOOL_APPROVAL_NEEDED = Message(
    "tenants.gpupool_approval_needed", gettext_noop("[gpupool] Approval needed: %(kind)s #%(pk)s")
)
REQUESTED_WAITING_REASON = Message(
    "tenants.requested_waiting_reason",
    gettext_noop("%(what)s\nRequested by %(requester)s; waiting for a %(role)s.\nReason: %(reason)s"),
)
GPUPOOL = Message("tenants.gpupool", gettext_noop("[gpupool] %(kind)s #%(pk)s: %(status)s"))
STATUS_COMMENT = Message(
    "tenants.status_comment", gettext_noop("%(what)s\nStatus: %(status)s. %(result)s\nComment: %(comment)s")
)
QUOTA_CHANGE = Message("tenants.quota_change", gettext_noop("quota change for %(where)s: %(values)s"))
ADMISSION_JOB = Message("tenants.admission_job", gettext_noop("admission of job %(pk)s in %(tenant)s (%(summary)s)"))
UNKNOWN_LANGUAGE_USE_ONE = Message(
    "tenants.unknown_language_use_one", gettext_noop("Unknown language '%(value)s'; use one of: %(choices)s")
)
