"""/api/v1/ routes of the tenants app (a tenant's quota use and the usage report are the scheduler's:
scheduler/api/showback.py)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from tenants.api import views

router = SimpleRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("memberships", views.MembershipViewSet, basename="membership")
router.register("users", views.UserViewSet, basename="user")
router.register("tokens", views.ApiTokenViewSet, basename="apitoken")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("approvals", views.ApprovalViewSet, basename="approval")
router.register("notifications", views.NotificationViewSet, basename="notification")
router.register("flavor-prices", views.FlavorPriceViewSet, basename="flavorprice")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("tenants/<str:pk>/storage-usage/", views.TenantStorageUsageView.as_view(), name="tenant-storage-usage"),
    path(
        "tenants/<str:pk>/approval-threshold/",
        views.TenantApprovalThresholdView.as_view(),
        name="tenant-approval-threshold",
    ),
    *router.urls,
]
