"""The scheduler's stored sentences read in the page's language (issue 20, item 9: "Placed on sim-01." stayed
English in the Chinese console). The engine's own output is run through it, so a new engine sentence without
a translation pattern fails here."""

from __future__ import annotations

import re

import pytest
from django.utils import translation

from scheduler.core import plan
from scheduler.core.types import Policy
from scheduler.message_text import localize
from tests.scheduler.core.builders import job, node, quota, snapshot

# Identifiers the sentences carry as data (tenants, flavors, nodes); everything else must be translated.
DATA_WORDS = {"team", "nvidia", "h100", "80g", "sim", "acme", "vision", "MiB", "GiB", "NVLink", "NUMA", "CPU"}
DATA_WORDS |= {"memory_mib", "millis", "zone", "gpu", "node", "ascend"}


def english_words(text: str) -> list[str]:
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)
    return [w for w in words if len(w) >= 3 and w not in DATA_WORDS and not re.search(r"\d", w)]


def engine_sentences() -> list[str]:
    """What the real engine writes for a spread of situations (quota, capacity, gang, topology, host, …)."""
    cases = [
        snapshot([node("n1", 8)], pending=[job("q", "team-a", cards=1)], quotas=[quota("team-b", 8, 8)]),
        snapshot([node("n1", 16)], pending=[job("big", "team-a", cards=9)], quotas=[quota("team-a", 8, 8)]),
        snapshot([node("n1", 4)], pending=[job("wide", cards=8), job("wait", awaiting_approval=True)]),
        snapshot([node("n1", 2), node("n2", 2)], pending=[job("gang", cards=2, replicas=3)]),
        snapshot([node("n1", 1)], pending=[job("frac", millis=300, memory_mib=999_999)]),
        snapshot([node("n1", 8)], pending=[job("other", flavor="ascend-910b")]),
        snapshot([node("n1", 8, labels={"zone": "a"})], pending=[job("sel", node_selector={"zone": "b"})]),
    ]
    sentences = []
    for case in cases:
        result = plan(case, Policy())
        sentences += [explain.message for explain in result.explanations]
    return sentences


SAMPLES = [
    "Placed on sim-01.",
    "Replicas 0, 1 placed on sim-01, sim-02.",
    "Preempted for job 12.",
    "Queued; the scheduler looks at it within a few seconds.",
    "tenant acme-vision has no quota for nvidia-h100-80g; ask a system admin for one",
    "waiting for 2 job(s) to stop and free 4 nvidia-h100-80g card(s) for it; it starts in a following cycle",
    "no node has 16 free CPU cores and 64 GiB free host memory beside 1 free nvidia-h100-80g card",
    "no node has 8 free CPU cores beside 2 free nvidia-h100-80g cards",
    "its tenant team-b borrowed capacity that team-a needs back",
    "higher-priority job 7 (priority 1000) needs the capacity",
    "1 job(s) borrowing nvidia-h100-80g under that limit are reclaimed for it once they have run the minimum "
    "runtime, in about 4 min",
    "tenant quota for nvidia-h100-80g exhausted: 3/3 cards in use; the 1 cards left under the quota limit of "
    "team-a for nvidia-h100-80g are owed to queued jobs within their guarantee",
    "Rejected: 预算不足",
]


def test_the_engine_says_enough_different_things_for_the_test_to_mean_something():
    sentences = engine_sentences()
    assert len(set(sentences)) >= 6, sentences


@pytest.mark.parametrize("sentence", engine_sentences() + SAMPLES)
def test_every_sentence_is_translated_and_english_is_left_as_it_was(sentence):
    with translation.override("en"):
        assert localize(sentence) == sentence
    with translation.override("zh-hans"):
        shown = localize(sentence)
    assert english_words(shown) == [], (sentence, shown)


def test_data_survives_translation():
    with translation.override("zh-hans"):
        shown = localize("no node has 4 free nvidia-h100-80g cards on one node right now (most free on one node: 2)")
    assert "4" in shown and "nvidia-h100-80g" in shown and "2" in shown


def test_an_unknown_sentence_is_shown_as_it_was():
    with translation.override("zh-hans"):
        assert localize("a sentence from a newer engine") == "a sentence from a newer engine"
