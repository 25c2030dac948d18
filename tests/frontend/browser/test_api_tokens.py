"""A member creates an API token in the console, in English and in Chinese: the secret is shown once, works
against the API, and stops working when revoked (after the confirmation dialog)."""

from __future__ import annotations

import uuid

import pytest

from tests.frontend.browser.conftest import login, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _me(page, secret: str) -> int:
    return page.request.get("/api/v1/me/", headers={"Authorization": f"Bearer {secret}"}).status


def test_member_creates_uses_and_revokes_a_token(page):
    login(page, "bob")
    page.get_by_test_id("who").click()  # your name opens your account's page
    page.wait_for_url("**/console/account/tokens/")
    name = f"laptop-{uuid.uuid4().hex[:6]}"
    page.get_by_label("Name").fill(name)
    page.get_by_label("Scope").select_option("write")
    page.get_by_role("button", name="Create token").click()
    secret = page.get_by_test_id("token-secret").input_value()
    assert secret.startswith("gp_")
    assert page.get_by_text("this is the only time it is shown").is_visible()
    response = page.request.get("/api/v1/me/", headers={"Authorization": f"Bearer {secret}"})
    assert response.status == 200 and response.json()["username"] == "bob"
    shot(page, "token-created")

    page.goto("/console/account/tokens/")
    assert page.get_by_test_id("token-secret").count() == 0  # shown once only
    row = page.locator(f"tr[data-token='{name}']")
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke").click()
    page.get_by_text("it no longer works").wait_for()
    assert "revoked" in row.inner_text()
    assert _me(page, secret) == 401


def test_token_page_in_simplified_chinese(page):
    login(page, "bob")
    page.goto("/console/account/tokens/")
    with page.expect_navigation():
        page.locator("#language-select").select_option("zh-hans")
    assert page.get_by_role("heading", name="API 令牌", exact=True).is_visible()
    page.get_by_label("名称").fill(f"笔记本-{uuid.uuid4().hex[:6]}")
    page.get_by_label("权限范围").select_option("read")
    page.get_by_label("有效期").fill("7")
    page.get_by_role("button", name="创建令牌").click()
    assert page.get_by_text("令牌只显示这一次").is_visible()
    secret = page.get_by_test_id("token-secret").input_value()
    assert _me(page, secret) == 200
    shot(page, "token-created-zh")
