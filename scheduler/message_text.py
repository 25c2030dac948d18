"""The scheduler's sentences in the reader's language.

The engine (``scheduler.core``, no Django) and the persistence layer write why a job waits or what happened to
it as English sentences with the data in them ("no node has 4 free nvidia-h100-80g cards on one node right now
(most free on one node: 2)"); the database keeps them so the API, exports and the audit trail read the same
words. Each sentence is a template of ``scheduler.core.sentences``, typed once there. ``localize`` turns a
stored sentence into the active language when it is shown: it splits it into clauses, recognises each by the
pattern derived from its template, and formats the translated template (the msgid) with the clause's own data.
A clause no template knows stays as it was (tests/scheduler/test_sentences.py renders every template in
Chinese and fails on a module that retypes one).
"""

from __future__ import annotations

import re

from django.utils.translation import gettext

from kernel.messages import pattern
from scheduler.core import sentences

# What a placeholder's data look like in a stored sentence, by name (the words around it keep a pattern precise).
SHAPES = {
    "flavor": r"[\w.-]+",
    "tenant": r"[\w.-]+",
    "other": r"[\w.-]+",
    "node": r"[\w.-]+",
    "nodes": r"[\w., -]+",
    "replicas": r"[\d, ]+",
    "range": r"\d+-\d+",
    "comment": r".*",
    "host": r".+",
    "problem": r".+",
    "wanted": r".+",
    **{name: r"[\d.]+" for name in ("borrow", "c", "g", "left", "limit", "m", "n", "need", "size", "used")},
    **{
        name: r"\d+"
        for name in (
            "cap",
            "count",
            "head",
            "held",
            "job",
            "jobs",
            "largest",
            "max",
            "mem",
            "millis",
            "min",
            "minutes",
            "most",
            "placed",
            "priority",
            "r",
            "step",
        )
    },
}


# (pattern of one clause, its English template). The templates are the engine's own (scheduler.core.sentences),
# typed once there; each is the msgid of its translation.
_COMPILED = [(pattern(template, SHAPES), template) for template in sentences.ALL]
_POSITION = re.compile(
    r"^(?P<body>.*) \(position (?P<overall>\d+) in the queue, (?P<mine>\d+) among (?P<tenant>.+)'s jobs\)$", re.DOTALL
)


_CPU = re.compile(r"^(?P<cores>[\d.]+) free CPU cores$")
_HOST_MEMORY = re.compile(r"^(?P<gib>[\d.]+) GiB free host memory$")


def _host(text: str) -> str:
    """``16 free CPU cores and 64 GiB free host memory`` (scheduler.core.placement.host_text)."""
    parts = []
    for part in text.split(" and "):
        if match := _CPU.match(part):
            parts.append(gettext("%(cores)s free CPU cores") % match.groupdict())
        elif match := _HOST_MEMORY.match(part):
            parts.append(gettext("%(gib)s GiB free host memory") % match.groupdict())
        else:
            return text
    return gettext(" and ").join(parts)


def _clause(text: str) -> str:
    for regex, template in _COMPILED:
        match = regex.fullmatch(text)
        if match:
            values = match.groupdict()
            for quoted in ("problem", "why"):  # a clause inside a clause
                if quoted in values:
                    values[quoted] = _clause(values[quoted])
            if "host" in values:
                values["host"] = _host(values["host"])
            return gettext(template) % values
    return text


def localize(message: str) -> str:
    """``message`` (a sentence the scheduler stored) in the active language; unchanged in English."""
    if not message:
        return message
    position = _POSITION.match(message)
    suffix = ""
    if position:
        message = position["body"]
        suffix = gettext(" (position %(overall)s in the queue, %(mine)s among %(tenant)s's jobs)") % {
            "overall": position["overall"],
            "mine": position["mine"],
            "tenant": position["tenant"],
        }
    whole = _clause(message)
    if whole == message:  # a sentence of several clauses ("…; ask a system admin for one")
        whole = gettext("; ").join(_clause(part) for part in message.split("; "))
    return whole + suffix
