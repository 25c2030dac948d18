"""``manage.py permissions_doc``: the page is generated from the policy table, and ``--check`` (CI, make lint)
fails when the committed page is stale."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from kernel.access_rules import Action
from tenants.management.commands import permissions_doc


def test_the_committed_page_is_the_generated_one():
    call_command("permissions_doc", "--check")


def test_check_fails_on_a_stale_page_and_writing_fixes_it(tmp_path, monkeypatch):
    page = tmp_path / "permissions.md"
    page.write_text("# Permissions\n\nwritten by hand\n", encoding="utf-8")
    monkeypatch.setattr(permissions_doc, "DOC_PATH", page)
    with pytest.raises(CommandError, match="stale"):
        call_command("permissions_doc", "--check")
    call_command("permissions_doc")
    call_command("permissions_doc", "--check")
    text = page.read_text(encoding="utf-8")
    assert all(f"`{action.value}`" in text for action in Action)
