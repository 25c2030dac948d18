"""The auditor verifies the chain and downloads an export bundle that checks offline."""

from __future__ import annotations

import pytest

from tests.frontend.browser.conftest import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_auditor_verifies_and_exports_a_bundle(page, tmp_path):
    from audit.bundle_verifier import verify_bundle

    login(page, "auditor")
    page.wait_for_url("**/console/audit/")
    page.get_by_role("button", name="Verify the chain now").click()
    page.locator("[data-testid='verify-status'] .badge.ok").wait_for()
    with page.expect_download() as download_info:
        page.get_by_role("button", name="Download export bundle").click()
    download = download_info.value
    assert download.suggested_filename.startswith("gpupool-audit-") and download.suggested_filename.endswith(".zip")
    path = tmp_path / "bundle.zip"
    download.save_as(path)
    summary = verify_bundle(str(path))  # raises BundleError if anything does not verify
    assert summary["records"] >= 1
    shot(page, "audit-exported")
