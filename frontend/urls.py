from django.contrib.auth import views as auth_views
from django.urls import include, path

from frontend.views import audit, jobs, nodes, overview, reports, tenants, whatif

console_patterns = [
    path("overview/", overview.overview, name="overview"),
    path("overview/numbers/", overview.overview_numbers, name="overview-numbers"),
    path("nodes/", nodes.node_list, name="node-list"),
    path("nodes/<int:pk>/", nodes.node_detail, name="node-detail"),
    path("nodes/<int:pk>/action/", nodes.node_action, name="node-action"),
    path("tenants/", tenants.tenant_list, name="tenant-list"),
    path("tenants/<int:pk>/", tenants.tenant_detail, name="tenant-detail"),
    path("tenants/<int:pk>/quota-request/", tenants.quota_request, name="quota-request"),
    path("approvals/", tenants.approval_inbox, name="approval-inbox"),
    path("approvals/<int:pk>/", tenants.approval_detail, name="approval-detail"),
    path("jobs/", jobs.job_list, name="job-list"),
    path("jobs/submit/", jobs.job_submit, name="job-submit"),
    path("jobs/<int:pk>/", jobs.job_detail, name="job-detail"),
    path("jobs/<int:pk>/cancel/", jobs.job_cancel, name="job-cancel"),
    path("reports/", reports.usage_reports, name="reports"),
    path("whatif/", whatif.whatif_page, name="whatif"),
    path("whatif/trace/", whatif.trace_download, name="whatif-trace"),
    path("audit/", audit.audit_list, name="audit"),
    path("audit/verify/", audit.audit_verify, name="audit-verify"),
    path("audit/export/", audit.audit_export, name="audit-export"),
    path("audit/<int:pk>/", audit.audit_detail, name="audit-detail"),
]

urlpatterns = [
    path("", overview.home, name="home"),
    path("accounts/login/", auth_views.LoginView.as_view(template_name="frontend/login.html"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("console/", include((console_patterns, "frontend"))),
]
