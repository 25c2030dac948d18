from django.contrib.auth import views as auth_views
from django.urls import include, path

from frontend.views import account, admin_users, audit, jobs, nodes, overview, reports, tenant_admin, tenants, whatif

console_patterns = [
    path("overview/", overview.overview, name="overview"),
    path("overview/numbers/", overview.overview_numbers, name="overview-numbers"),
    path("nodes/", nodes.node_list, name="node-list"),
    path("nodes/<int:pk>/", nodes.node_detail, name="node-detail"),
    path("nodes/<int:pk>/action/", nodes.node_action, name="node-action"),
    path("tenants/", tenants.tenant_list, name="tenant-list"),
    path("tenants/<int:pk>/", tenants.tenant_detail, name="tenant-detail"),
    path("tenants/<int:pk>/quota-request/", tenants.quota_request, name="quota-request"),
    path("tenants/new/", tenant_admin.tenant_create, name="tenant-create"),
    path("tenants/<int:pk>/edit/", tenant_admin.tenant_edit, name="tenant-edit"),
    path("tenants/<int:pk>/delete/", tenant_admin.tenant_delete, name="tenant-delete"),
    path("tenants/<int:pk>/quotas/", tenant_admin.quota_edit, name="tenant-quotas"),
    path("approvals/", tenants.approval_inbox, name="approval-inbox"),
    path("approvals/<int:pk>/", tenants.approval_detail, name="approval-detail"),
    path("jobs/", jobs.job_list, name="job-list"),
    path("jobs/submit/", jobs.job_submit, name="job-submit"),
    path("jobs/cancel/", jobs.job_bulk_cancel, name="job-bulk-cancel"),
    path("jobs/<int:pk>/", jobs.job_detail, name="job-detail"),
    path("jobs/<int:pk>/cancel/", jobs.job_cancel, name="job-cancel"),
    path("reports/", reports.usage_reports, name="reports"),
    path("whatif/", whatif.whatif_page, name="whatif"),
    path("whatif/trace/", whatif.trace_download, name="whatif-trace"),
    path("audit/", audit.audit_list, name="audit"),
    path("audit/verify/", audit.audit_verify, name="audit-verify"),
    path("audit/export/", audit.audit_export, name="audit-export"),
    path("audit/<int:pk>/", audit.audit_detail, name="audit-detail"),
    path("account/tokens/", account.token_list, name="tokens"),
    path("account/tokens/<int:pk>/revoke/", account.token_revoke, name="token-revoke"),
    path("users/", admin_users.user_list, name="user-list"),
    path("users/new/", admin_users.user_create, name="user-create"),
    path("users/<int:pk>/", admin_users.user_detail, name="user-detail"),
    path("users/<int:pk>/role/", admin_users.user_set_role, name="user-role"),
    path("users/<int:pk>/active/", admin_users.user_set_active, name="user-active"),
    path("users/<int:pk>/mfa-reset/", admin_users.user_mfa_reset, name="user-mfa-reset"),
    path("users/<int:pk>/memberships/", admin_users.membership_add, name="membership-add"),
    path("users/<int:pk>/memberships/<int:membership_pk>/", admin_users.membership_change, name="membership-change"),
    path("users/<int:pk>/tokens/<int:token_pk>/revoke/", admin_users.user_token_revoke, name="user-token-revoke"),
    path("lockouts/", admin_users.lockout_list, name="lockouts"),
    path("lockouts/<int:pk>/reset/", admin_users.lockout_reset, name="lockout-reset"),
]

urlpatterns = [
    path("", overview.home, name="home"),
    path("accounts/login/", auth_views.LoginView.as_view(template_name="frontend/login.html"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("console/", include((console_patterns, "frontend"))),
]
