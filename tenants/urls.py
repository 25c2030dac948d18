"""Console URLs of the tenants app, mounted under /accounts/: two-factor pages and (when configured) OIDC."""

from django.conf import settings
from django.urls import include, path

from tenants import views

urlpatterns = [
    path("otp/verify/", views.otp_verify, name="otp-verify"),
    path("otp/enrol/", views.otp_enrol, name="otp-enrol"),
]

if getattr(settings, "GPUPOOL_OIDC_ENABLED", False):
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))
