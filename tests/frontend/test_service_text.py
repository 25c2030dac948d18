"""The services' refusals the console shows at a field read in the page's language (frontend.service_text)."""

from __future__ import annotations

import re

import pytest
from django.utils import translation

from frontend.service_text import PATTERNS, localize

SAMPLES = {
    "flavor": "nvidia-h100-80g",
    "parent": "acme",
    "total": "9000",
    "parts": "acme-research 8000, team-a 1000",
    "guaranteed": "8000",
    "where": "acme/ascend-910b",
    "limit": "2000",
    "role": "parent tenant admin",
}


@pytest.mark.parametrize(("pattern", "template"), PATTERNS, ids=[t[:40] for _p, t in PATTERNS])
def test_each_pattern_knows_its_english_sentence_and_has_chinese(pattern, template):
    english = template % SAMPLES
    assert pattern.fullmatch(english), english
    with translation.override("en"):  # the same sentence; a role reads as its label
        assert localize(english) == template % {**SAMPLES, "role": "tenant admin of the parent tenant"}
    with translation.override("zh-hans"):
        chinese = localize(english)
    assert chinese != english and not re.search(r"\b(guarantee|limit|comment|step)\b", chinese), chinese


def test_the_role_is_named_in_words_of_the_language():
    english = "This step waits for a parent tenant admin; a system admin deciding it instead must say why (comment)."
    with translation.override("zh-hans"):
        assert "上级租户的租户管理员" in localize(english)


def test_a_message_no_pattern_knows_stays_as_it_was():
    with translation.override("zh-hans"):
        assert localize("Something else went wrong.") == "Something else went wrong."
