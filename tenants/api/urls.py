"""/api/v1/ routes of the tenants app."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from tenants.api import views

router = SimpleRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("memberships", views.MembershipViewSet, basename="membership")
router.register("users", views.UserViewSet, basename="user")
router.register("tokens", views.ApiTokenViewSet, basename="apitoken")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    *router.urls,
]
