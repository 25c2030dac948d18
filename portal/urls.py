from __future__ import annotations

import importlib

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from frontend.views import account
from portal import health, views

# Each app's REST endpoints live in <app>/api/urls.py and are mounted under /api/v1/.
API_APPS = ["tenants", "scheduler", "scheduler.fleet", "audit"]


def _api_includes() -> list:
    includes = []
    for app in API_APPS:
        module_name = f"{app}.api.urls"
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        includes.append(path("api/v1/", include(module_name)))
    return includes


# A URL no route matches answers the API's JSON error under /api/ (portal/views.py).
handler404 = "portal.views.not_found"

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("api/v1/", views.api_root, name="api-root"),
    *_api_includes(),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("admin/", admin.site.urls),
    path("accounts/", include("tenants.urls")),
    # The language menu: Django's set_language, remembered for a signed-in person (their e-mails' language).
    path("i18n/setlang/", account.language_set, name="set_language"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("", include("scheduler.fleet.urls")),  # /metrics (Prometheus)
    path("", include("frontend.urls")),
]
