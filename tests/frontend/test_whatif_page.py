"""The console's what-if page (system admins): a form, the side-by-side table, a chart drawn without script, a
clear error for an unknown setting, and the download of the history as trace files."""

from __future__ import annotations

import io
import zipfile

import pytest

from catalog.models import ResourceFlavor
from tenants.models import PlatformRole
from tests.frontend.factories import make_member, make_node, make_tenant, make_user
from tests.patching import patch_request_cycle
from tests.scheduler.history import FLAVOR, job_history

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(client, settings, monkeypatch):
    settings.GPUPOOL_SCHEDULER_POLICY = {"require_quota": False}
    patch_request_cycle(monkeypatch, lambda: None)
    flavor = ResourceFlavor.objects.create(name=FLAVOR, vendor="simulated", model="Simulated 80G", memory_mib=81920)
    node = make_node("node-a", devices=2, flavor=flavor)
    job_history(make_member(make_tenant("team-a")), node)
    client.force_login(make_user(platform_role=PlatformRole.SYSTEM_ADMIN))
    return client


def test_the_page_offers_the_form_and_the_settings_in_force(admin):
    page = admin.get("/console/whatif/").content.decode()

    assert 'name="days"' in page and 'name="settings"' in page
    assert "<code>min_runtime_before_preempt_s</code>" in page
    assert 'href="/console/whatif/"' in page  # in the navigation


def test_a_comparison_shows_both_policies_side_by_side_with_a_chart(admin):
    response = admin.get("/console/whatif/", {"days": 1, "settings": "preemption=false\nordering=fifo"})

    assert response.status_code == 200
    page = response.content.decode()
    assert "3 jobs on 2 GPUs" in page and "<code>preemption=false</code>" in page
    rows = {row["key"]: row for row in response.context["rows"]}
    assert rows["finished"]["current_text"] == rows["finished"]["proposed_text"] == "3"
    assert 'data-metric="jct_p99_s"' in page and 'data-metric="within_guarantee"' in page
    assert 'data-metric="within_guarantee_alone"' in page
    assert page.count("<polyline") == 2 and 'points=""' not in page
    assert "<script>" not in page  # nothing inline: the CSP allows none
    assert "team-a" in page


def test_an_unknown_setting_is_explained_with_the_valid_ones(admin):
    page = admin.get("/console/whatif/", {"days": 1, "settings": "preempt=false"}).content.decode()

    assert "unknown setting &#x27;preempt&#x27;; the settings are preemption, borrowing" in page
    assert 'data-testid="whatif-table"' not in page


def test_the_history_downloads_as_a_zip_of_trace_files(admin):
    response = admin.get("/console/whatif/trace/", {"days": 1})

    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    names = zipfile.ZipFile(io.BytesIO(response.content)).namelist()
    assert sorted(names) == ["cluster.csv", "jobs.csv", "manifest.json", "tenants.csv"]
    assert admin.get("/console/whatif/trace/", {"days": "x"}).status_code == 400


def test_the_page_speaks_simplified_chinese(admin):
    admin.post("/i18n/setlang/", {"language": "zh-hans", "next": "/console/whatif/"})

    page = admin.get("/console/whatif/", {"days": 1, "settings": "preemption=false"}).content.decode()

    assert "假设分析" in page and "现行策略" in page and "每小时 GPU 分配占比" in page
