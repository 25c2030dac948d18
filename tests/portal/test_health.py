from __future__ import annotations

import pytest
from django.test import override_settings

from portal import embedded

pytestmark = pytest.mark.django_db


@override_settings(REDIS_URL="", EMBEDDED_MODE=True, CELERY_TASK_ALWAYS_EAGER=False)
def test_healthz_reports_unhealthy_without_a_worker(client):
    embedded.stop()
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["celery"] == {
        **body["checks"]["celery"],
        "ok": False,
        "error": "no in-process worker running",
    }


def test_healthz_reports_redis_failure(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"]["ok"] is False


def test_api_root_requires_login_and_lists_links(client, django_user_model):
    assert client.get("/api/v1/").status_code in (401, 403)
    user = django_user_model.objects.create_user(username="u1", password="pw-long-enough-1")
    client.force_login(user)
    response = client.get("/api/v1/")
    assert response.status_code == 200
    assert response.json()["user"] == "u1"
    assert "schema" in response.json()["links"]


def test_unknown_api_path_has_the_stable_error_shape(client, django_user_model):
    user = django_user_model.objects.create_user(username="u2", password="pw-long-enough-1")
    client.force_login(user)
    response = client.post("/api/v1/", data={})
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"
    assert "detail" in response.json()
