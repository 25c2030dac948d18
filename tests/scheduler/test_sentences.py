"""The scheduler's sentences are typed once (scheduler.core.sentences) and read in both languages."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.utils import translation

from scheduler.core import sentences
from scheduler.message_text import SHAPES, localize

ROOT = Path(__file__).resolve().parents[2]

# Strings that share words with a sentence but are not one (documentation of a field, an enum's docstring).
NOT_SENTENCES = {
    ("scheduler/sim/traceformat.py", "host memory per replica"): "a trace column's help text",
    ("scheduler/core/types.py", "cards on one NUMA node"): "Topology's docstring",
}


def _sample(template: str) -> str:
    data = {}
    for name in re.findall(r"%\((\w+)\)s", template):
        shape = SHAPES.get(name, "")
        data[name] = "3" if shape.startswith(r"[\d") or shape.startswith(r"\d") else "team-a"
    data.update({"range": "20000-20999", "replicas": "0, 1", "nodes": "sim-01", "flavor": "nvidia-h100-80g"})
    return template % {name: data[name] for name in re.findall(r"%\((\w+)\)s", template)}


@pytest.mark.parametrize("template", sentences.ALL, ids=[t[:50] for t in sentences.ALL])
def test_each_sentence_reads_back_in_english_and_in_chinese(template):
    english = _sample(template)
    with translation.override("en"):
        assert localize(english) == english
    with translation.override("zh-hans"):
        chinese = localize(english)
    assert chinese != english, f"no translation (or no pattern) for {template!r}"


def _chunks() -> dict[str, str]:
    found = {}
    for template in sentences.ALL:
        for chunk in re.split(r"%\(\w+\)s", template):
            chunk = chunk.strip(" ;:,.()")
            if len(chunk) >= 14:
                found[chunk] = template
    return found


def test_no_module_types_a_sentence_again():
    """A sentence is written with ``say(sentences.NAME, …)``: a literal that retypes one's words (so a rewording
    there would leave the Chinese console and this module behind) fails here."""
    chunks = _chunks()
    assert len(chunks) > 60
    retyped = []
    for path in sorted((ROOT / "scheduler").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        if where == "scheduler/core/sentences.py" or "/migrations/" in where:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for chunk in chunks:
                    if chunk in node.value and (where, chunk) not in NOT_SENTENCES:
                        retyped.append(f"{where}:{node.lineno}: {chunk!r}")
    assert retyped == []


def test_the_walk_would_see_a_retyped_sentence():
    planted = ast.parse('message = f"tenant {tenant} has no quota for {flavor}"')
    chunks = _chunks()
    texts = [n.value for n in ast.walk(planted) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert any(chunk in text for text in texts for chunk in chunks)
