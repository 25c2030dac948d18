"""Messages as codes with parameters (kernel.messages): typed once, rendered at each edge in the reader's language."""

from __future__ import annotations

import pickle

import pytest
from django.utils import translation
from rest_framework.test import APIClient

from kernel.messages import CATALOGUE, DuplicateMessage, Message, Text
from tenants import messages as tenants_messages
from tests.factories import UserFactory


def test_a_message_is_its_english_sentence_and_keeps_code_and_parameters():
    text = tenants_messages.ALREADY_MEMBER(user="bob", tenant="vision")
    assert isinstance(text, str) and isinstance(text, Text)
    assert text == "bob is already a member of vision."
    assert text.code == "tenants.already_member" and text.params == {"user": "bob", "tenant": "vision"}
    with translation.override("zh-hans"):
        chinese = text.render(translation.gettext)
    assert chinese != text and "bob" in chinese and "vision" in chinese


def test_a_message_refuses_missing_or_unknown_parameters():
    with pytest.raises(TypeError, match="missing"):
        tenants_messages.ALREADY_MEMBER(user="bob")
    with pytest.raises(TypeError, match="unknown"):
        tenants_messages.ALREADY_MEMBER(user="bob", tenant="vision", role="admin")


def test_a_code_names_one_sentence():
    Message("tests.same", "Same.")  # registering the same sentence again is harmless (a module imported twice)
    with pytest.raises(DuplicateMessage):
        Message("tests.same", "Another sentence.")
    del CATALOGUE["tests.same"]


def test_a_message_crosses_a_process_as_its_sentence():
    text = tenants_messages.ALREADY_MEMBER(user="bob", tenant="vision")
    again = pickle.loads(pickle.dumps(text))
    assert again == text and type(again) is str


def test_every_code_is_unique_and_says_its_app():
    assert len(CATALOGUE) > 150
    for code, message in CATALOGUE.items():
        assert code == message.code
        assert code.split(".")[0] in {"tenants", "scheduler", "audit", "tests"}, code


@pytest.mark.django_db
def test_the_api_answers_a_refusal_in_the_callers_language_with_its_code_and_parameters():
    client = APIClient()
    client.force_authenticate(UserFactory())
    english = client.post("/api/v1/tenants/", {"name": "X", "slug": "x"}, format="json").json()
    assert english["detail"] == "Only a system admin may create a top-level tenant."
    code = english["message"]["code"]
    assert CATALOGUE[code].template == english["detail"] and english["message"]["params"] == {}
    chinese = client.post(
        "/api/v1/tenants/", {"name": "X", "slug": "x"}, format="json", HTTP_ACCEPT_LANGUAGE="zh-hans"
    ).json()
    assert chinese["message"] == english["message"]
    assert chinese["detail"] != english["detail"] and "系统管理员" in chinese["detail"]
