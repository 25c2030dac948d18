"""The audit codes the tenants app records (sign-in, users and tokens, memberships, tenants, quotas, approvals,
notifications): ``(code, category, description)``, registered from ``TenantsConfig.ready()``. Never rename a code
(exports and SIEM rules match on them)."""

from __future__ import annotations

EVENTS: list[tuple[str, str, str]] = [
    # Authentication
    ("auth.login", "auth", "A user signed in"),
    ("auth.login.failure", "auth", "A sign-in attempt failed"),
    ("auth.logout", "auth", "A user signed out"),
    ("auth.lockout", "auth", "An account was locked after repeated failures"),
    ("auth.lockout.reset", "auth", "A security admin lifted a sign-in lockout"),
    ("auth.mfa.enrol.begin", "auth", "A user began enrolling a second factor"),
    ("auth.mfa.enrol.confirm", "auth", "A user confirmed a second factor"),
    ("auth.mfa.verify", "auth", "A second factor was checked at sign-in"),
    ("auth.mfa.reset", "auth", "A user's second factor was reset"),
    # Users, roles, tokens, memberships
    ("user.create", "identity", "A user was created"),
    ("user.update", "identity", "A user was changed"),
    ("user.deactivate", "identity", "A user was deactivated"),
    ("user.password.set", "identity", "A password was set"),
    ("user.role.change", "identity", "A platform role was granted or removed"),
    ("token.create", "identity", "An API token was created"),
    ("token.revoke", "identity", "An API token was revoked"),
    ("membership.create", "identity", "A user joined a tenant"),
    ("membership.role.change", "identity", "A tenant role changed"),
    ("membership.delete", "identity", "A user left a tenant"),
    # Tenants, quotas, approvals
    ("tenant.create", "tenancy", "A tenant was created"),
    ("tenant.update", "tenancy", "A tenant was changed"),
    ("tenant.move", "tenancy", "A tenant moved in the tree"),
    ("tenant.delete", "tenancy", "A tenant was deleted"),
    ("quota.create", "tenancy", "A quota was set"),
    ("quota.update", "tenancy", "A quota was changed"),
    ("quota.delete", "tenancy", "A quota was removed"),
    ("quota_request.create", "approval", "A quota change was requested"),
    ("quota_request.approve", "approval", "A quota change request was approved"),
    ("quota_request.reject", "approval", "A quota change request was rejected"),
    ("quota_request.request_changes", "approval", "Changes to a quota change request were asked for"),
    ("quota_request.resubmit", "approval", "A quota change request was resubmitted"),
    ("quota_request.cancel", "approval", "A quota change request was withdrawn"),
    ("quota_request.expire", "approval", "A quota change request expired"),
    ("quota_request.fail", "approval", "An approved quota change no longer fitted and was not applied"),
    ("approval.request", "approval", "An approval was requested"),
    ("approval.approve", "approval", "An approval was granted"),
    ("approval.reject", "approval", "An approval was refused"),
    ("approval.cancel", "approval", "An approval request was withdrawn"),
    ("approval.expire", "approval", "An approval request expired"),
    ("approval.create", "approval", "An approval was requested"),
    # Notifications and showback prices
    ("notification.failed", "approval", "A notification could not be delivered"),
    ("notification.retry", "approval", "An admin retried a notification"),
    ("flavor.price.set", "approval", "The showback price of a flavor was set"),
]
