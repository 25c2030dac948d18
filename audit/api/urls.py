"""/api/v1/audit/ routes."""

from django.urls import path

from audit.api import views

urlpatterns = [
    path("audit/records/", views.AuditRecordListView.as_view(), name="auditrecord-list"),
    path("audit/records/<int:pk>/", views.AuditRecordDetailView.as_view(), name="auditrecord-detail"),
    path("audit/verify/", views.AuditVerifyView.as_view(), name="audit-verify"),
    path("audit/export/", views.AuditExportView.as_view(), name="audit-export"),
]
